"""Backing files and the DRAM pool file, as a storage user expects them.

- A ``pool=file`` pool_path that is a target (the same path, a symlink, a
  hard link) was accepted, and the pool's DRAM and the SSD overwrote each
  other (4,165,681 of the first 4 MiB differed). It is InvalidArgument, like
  two targets that are the same file.
- Targets were created 0644; KV cache is user data: 0600.
- An existing file shorter than its share of capacity was silently extended,
  and a missing one silently created, without anyone asking: both need
  ``create``, and the error names the path and the sizes.
- A failed multi-target open left the files it had created behind; it
  removes them (and only them) and truncates back the file it extended.
- Config errors name the option and the offending value.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

import chm
from chm import Config
from chm.errors import InvalidArgument, NoSpace, NotFound

MiB = 1 << 20
GEOM = {"capacity": "8M", "dram": "4M", "wbuf": "1M", "slot_size": "1M"}


def _full_file(path: Path, size: int = 8 * MiB, fill: bytes = b"\x5a") -> bytes:
    data = fill * size
    path.write_bytes(data)
    return data


# ---- defect: the pool file is a target


def _same_path(t: Path) -> str:
    return str(t)


def _symlink(t: Path) -> str:
    link = t.with_name("pool-link")
    link.symlink_to(t)
    return str(link)


def _hardlink(t: Path) -> str:
    link = t.with_name("pool-hardlink")
    os.link(t, link)
    return str(link)


@pytest.mark.parametrize("how", [_same_path, _symlink, _hardlink], ids=["path", "symlink", "link"])
def test_pool_file_that_is_a_target_is_refused(
    tmp_path: Path, data_backend: str, how: Callable[[Path], str]
) -> None:
    target = tmp_path / "t0.img"
    data = _full_file(target)
    pool = how(target)
    with pytest.raises(InvalidArgument) as info:
        dev = chm.Device.open(
            targets=[target], backend=data_backend, pool="file", pool_path=pool, **GEOM
        )
        # the old code got here: show what the device does to its own data
        try:
            dev.write(0, b"\x01" * MiB)
            dev.flush(10)
            got = dev.read(0, 4 * MiB)
        finally:
            dev.close()
        differ = sum(a != b for a, b in zip(got, b"\x01" * MiB + data[MiB : 4 * MiB], strict=True))
        pytest.fail(f"pool_path {pool} = target {target} opened; {differ} of 4 MiB differ")
    msg = str(info.value)
    assert "pool_path" in msg and pool in msg and str(target) in msg, msg
    assert target.read_bytes() == data, "the refused open changed the target"


def test_pool_file_next_to_the_target_is_fine(tmp_path: Path) -> None:
    target = tmp_path / "t0.img"
    _full_file(target)
    pool = tmp_path / "pool"
    pool.touch()
    with chm.Device.open(
        targets=[target], backend="pread", pool="file", pool_path=pool, **GEOM
    ) as dev:
        dev.write(0, b"\x01" * MiB)
        assert dev.read(0, MiB) == b"\x01" * MiB


# ---- hardening: mode, create, cleanup


def test_created_target_is_private(tmp_path: Path) -> None:
    target = tmp_path / "new.img"
    old = os.umask(0o022)
    try:
        chm.Device.open(targets=[target], backend="pread", create=True, **GEOM).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_short_file_is_not_extended_without_create(tmp_path: Path) -> None:
    target = tmp_path / "short.img"
    target.write_bytes(b"\x11" * MiB)
    with pytest.raises(NoSpace) as info:
        chm.Device.open(targets=[target], backend="pread", **GEOM)
    msg = str(info.value)
    assert str(target) in msg and str(MiB) in msg and str(8 * MiB) in msg, msg
    assert target.stat().st_size == MiB


def test_short_file_is_extended_with_create(tmp_path: Path) -> None:
    target = tmp_path / "short.img"
    target.write_bytes(b"\x11" * MiB)
    with chm.Device.open(targets=[target], backend="pread", create=True, **GEOM) as dev:
        assert dev.read(0, 4096) == b"\x11" * 4096
    assert target.stat().st_size == 8 * MiB


def test_missing_file_is_not_created_without_create(tmp_path: Path) -> None:
    target = tmp_path / "missing.img"
    with pytest.raises(NotFound) as info:
        chm.Device.open(targets=[target], backend="pread", **GEOM)
    assert str(target) in str(info.value) and "create" in str(info.value)
    assert not target.exists()


def test_failed_multi_target_open_removes_only_what_it_created(tmp_path: Path) -> None:
    created = tmp_path / "new.img"
    kept = tmp_path / "kept.img"
    kept_data = _full_file(kept, 4 * MiB)
    short = tmp_path / "short.img"
    short.write_bytes(b"\x22" * MiB)
    bad = tmp_path / "a-directory"
    bad.mkdir()
    with pytest.raises(InvalidArgument) as info:
        chm.Device.open(
            targets=[created, kept, short, bad],
            backend="pread",
            create=True,
            stripe_unit="1M",
            **GEOM,
        )
    assert str(bad) in str(info.value)
    assert not created.exists(), "the failed open left the file it created"
    assert kept.read_bytes() == kept_data
    assert short.stat().st_size == MiB, "the failed open left the file it extended"


def test_default_temporary_target_asks_for_creation() -> None:
    with chm.Device.open(backend="pread", **GEOM) as dev:
        assert dev.tmpdir is not None
        # the directory also holds the owner's lock file (.owner)
        (img,) = (p for p in Path(dev.tmpdir).iterdir() if not p.name.startswith("."))
        assert stat.S_IMODE(img.stat().st_mode) == 0o600
        assert dev.config["create"] == 1


# ---- config errors name the option and the value


@pytest.mark.parametrize(
    ("options", "option", "value"),
    [
        ({"queue_depth": 0}, "queue_depth", "0"),
        ({"max_io": "6K"}, "max_io", "6144"),
        ({"capacity": "3K"}, "capacity", "3072"),
        ({"capacity": "128P", "stripe_unit": "1M"}, "capacity", "144115188075855872"),
        ({"flush_high_water_pct": 101}, "flush_high_water_pct", "101"),
        ({"refill_queue": 1 << 23}, "refill_queue", "8388608"),
        (
            {"slots": 9_000_000, "refill_queue": 8_000_000, "slot_size": 512, "dram": "80G"},
            "refill_queue",
            "8000000",
        ),
        ({"mode": "lru", "lru_line": "3K"}, "lru_line", "3072"),
        ({"mode": "lru", "lru_line": "1M", "dram": "512K"}, "dram", "524288"),
        ({"wbuf": "64M", "dram": "32M"}, "wbuf", "67108864"),
        ({"slot_size": 100}, "slot_size", "100"),
        ({"numa_node": -2}, "numa_node", "-2"),
    ],
)
def test_config_errors_name_option_and_value(
    options: dict[str, object], option: str, value: str
) -> None:
    cfg = Config(backend="ghost", **options)
    with pytest.raises(InvalidArgument) as info:
        cfg.validate()
    msg = str(info.value)
    assert option in msg and value in msg, msg
