"""``chm-emu kv check`` / ``kv repair`` on real stores: a damaged journal, a
lost journal, a block header that disagrees, a store that is open. The
command runs as its own process (the installed ``chm-emu``)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chm.kv import PutStatus, Store, blockhdr

KiB = 1 << 10
GEOM: dict[str, Any] = {
    "capacity": "64M",
    "dram": "16M",
    "slot_size": "64K",
    "device_options": {"wbuf": "4M"},
    "backend": "pread",
}
CHM_EMU = str(Path(sys.executable).parent / "chm-emu")


def blk(i: int, n: int = 16 * KiB) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


def kv(*args: str) -> tuple[int, str, str]:
    r = subprocess.run(
        [CHM_EMU, "kv", *args], capture_output=True, text=True, timeout=60, check=False
    )
    return r.returncode, r.stdout, r.stderr


def fill(d: Path, n: int) -> None:
    st = Store.open(d, **GEOM)
    for i in range(n):
        assert st.put([i], [blk(i)], [f"m{i}".encode()]) == [PutStatus.STORED]
        st.flush()
    st.close(flush=False)


def report(d: Path) -> tuple[int, dict[str, Any]]:
    rc, out, err = kv("check", str(d), "--json")
    assert rc in (0, 1), err
    return rc, json.loads(out)


def all_back(d: Path, keys: list[int]) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a repaired journal opens clean
        with Store.open(d, **GEOM) as st:
            out = [np.zeros(16 * KiB, np.uint8) for _ in keys]
            ok = st.get(keys, out)
            assert all(
                np.array_equal(o, blk(k)) for o, k, g in zip(out, keys, ok, strict=True) if g
            )
            return sum(ok)


def test_check_reports_a_damaged_record_and_repair_brings_its_block_back(
    tmp_backing: Path,
) -> None:
    fill(tmp_backing, 40)
    rc, r = report(tmp_backing)
    assert rc == 0 and r["entries"] == 40 and not r["damaged"] and r["device_blocks"] == 40
    j = tmp_backing / "kv.img.kvjournal"
    raw = bytearray(j.read_bytes())
    raw[(1 + 2 * 5 + 1) * 64 + 20] ^= 0x10  # key 5's PUT (after its META record)
    j.write_bytes(bytes(raw))
    rc, r = report(tmp_backing)
    assert rc == 1 and r["damaged_records"] == 1 and r["entries"] == 39
    assert r["unjournaled"] == 1  # the damaged record's block, intact on the device
    rc, out, _ = kv("check", str(tmp_backing))
    assert rc == 1 and "DAMAGED: 1 damaged journal records" in out
    assert f"chm-emu kv repair {tmp_backing}" in out
    rc, out, err = kv("repair", str(tmp_backing), "--json")
    assert rc == 0, err
    rr = json.loads(out)
    assert rr["entries"] == 40 and rr["from_device"] == 1 and rr["dropped"] == 0
    assert Path(rr["kept_aside"]).read_bytes() == bytes(raw)
    rc, r = report(tmp_backing)
    assert rc == 0 and r["entries"] == 40
    assert all_back(tmp_backing, list(range(40))) == 40
    with Store.open(tmp_backing, **GEOM) as st:
        assert st.meta([4, 5, 6]) == [b"m4", b"", b"m6"]  # the rebuilt one has none


@pytest.mark.parametrize("how", ["missing", "empty"])
def test_repair_rebuilds_a_lost_journal_from_the_block_headers(tmp_backing: Path, how: str) -> None:
    fill(tmp_backing, 12)
    j = tmp_backing / "kv.img.kvjournal"
    if how == "missing":
        j.unlink()
    else:
        j.write_bytes(b"")
    rc, r = report(tmp_backing)
    assert rc == 1 and r["journal_state"] == how and r["device_blocks"] == 12
    rc, out, err = kv("repair", str(tmp_backing / "kv.img"))
    assert rc == 0 and "rebuilt with 12 entries" in out, err
    assert all_back(tmp_backing, list(range(12))) == 12


def test_check_finds_a_header_that_disagrees(tmp_backing: Path) -> None:
    fill(tmp_backing, 4)
    with Store.open(tmp_backing, **GEOM) as st:
        e = st.info(2)
    assert e is not None
    img = tmp_backing / "kv.img"
    at = blockhdr.header_offset(e["addr"], e["length"])
    with open(img, "r+b") as f:
        f.seek(at + 40)  # the epoch
        b = f.read(1)
        f.seek(at + 40)
        f.write(bytes([b[0] ^ 1]))
    rc, r = report(tmp_backing)
    assert rc == 1 and r["header_mismatch"] == 1 and r["bad_payload"] == 0


def test_check_refuses_an_open_store(tmp_backing: Path) -> None:
    with Store.open(tmp_backing, **GEOM):
        rc, _, err = kv("check", str(tmp_backing))
    assert rc == 2 and "in use by pid" in err
    rc, _, err = kv("check", str(tmp_backing / "nothing"))
    assert rc == 2 and "no such backing file" in err


def test_ghost_blocks_carry_no_header(tmp_path: Path) -> None:
    """A payload-less put allocates its length only: blocks pack as before."""
    import chm

    with chm.Device.open(
        backend="ghost", clock="virtual", capacity="64M", dram="32M", slot_size="1M",
        wbuf="16M", timing="fpga-cxlhm",
    ) as dev, Store(dev, journal=tmp_path / "g.kvjournal") as st:  # fmt: skip
        assert st.stats().segment_bytes == 8 << 20
        assert st.put_lengths([1, 2, 3], 256 * KiB) == [PutStatus.STORED] * 3
        addrs = [e["addr"] for e in st.entries([1, 2, 3]) if e is not None]
        assert addrs == [0, 256 * KiB, 512 * KiB]


def test_blocks_without_headers_are_no_damage(tmp_backing: Path) -> None:
    """A store whose segments hold exactly one block writes no headers:
    check says so and finds nothing wrong."""
    st = Store.open(tmp_backing, **{**GEOM, "segment_bytes": 64 * KiB})
    for i in range(3):
        st.put([i], [blk(i, 64 * KiB)])
        st.flush()
    st.close()
    rc, r = report(tmp_backing)
    assert rc == 0 and r["entries"] == 3 and r["headerless"] == 3
    assert r["header_mismatch"] == 0 and r["bad_payload"] == 0


def test_repair_leaves_a_clean_journal_alone_and_refuses_bad_values(tmp_backing: Path) -> None:
    fill(tmp_backing, 2)
    j = tmp_backing / "kv.img.kvjournal"
    before = j.read_bytes()
    rc, out, _ = kv("repair", str(tmp_backing))
    assert rc == 0 and "clean (2 entries); nothing to repair" in out
    assert j.read_bytes() == before and not list(tmp_backing.glob("*.damaged-*"))
    rc, _, err = kv("repair", str(tmp_backing), "--capacity", "lots")
    assert rc == 2 and "lots" in err
