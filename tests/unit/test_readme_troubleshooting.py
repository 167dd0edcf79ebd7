"""The Troubleshooting texts (docs/troubleshooting.md) are what chm says today: each error is
reproduced for real (skipped, with the reason, where this host cannot) and
must appear in one of the section's ``text`` blocks. The io_uring ones are
checked in test_backend_default.py, under a real seccomp filter."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chm

ROOT = Path(__file__).resolve().parents[2]
SMALL: dict[str, Any] = {"capacity": "64M", "dram": "16M", "wbuf": "4M", "slot_size": "1M"}


def troubleshooting_texts() -> str:
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    return "\n".join(re.findall(r"^```text\n(.*?)^```", text, re.M | re.S))


def _shown(exc: BaseException, *, path: str = "", as_shown: str = "") -> str:
    """The exception as a traceback's last line, with path put as the page has it."""
    line = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    return line.replace(path, as_shown) if path else line


def test_missing_liburing_headers(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc")
    # /usr/include without liburing: every other entry linked back
    inc = tmp_path / "include"
    inc.mkdir()
    for entry in Path("/usr/include").iterdir():
        if not entry.name.startswith("liburing"):
            (inc / entry.name).symlink_to(entry)
    gcc_inc = subprocess.run(
        [gcc, "-print-file-name=include"], capture_output=True, text=True, check=True
    ).stdout.strip()
    arch = [str(p) for p in inc.glob("*-linux-gnu")]
    cc = [gcc, "-nostdinc", "-isystem", gcc_inc, "-isystem", str(inc)]
    for a in arch:
        cc += ["-isystem", a]
    code = (
        "import importlib.util, sys\n"
        f"s = importlib.util.spec_from_file_location('b', {str(ROOT / 'chm/_build_ffi.py')!r})\n"
        "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); m.check_system()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "CC": " ".join(cc)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr
    said = proc.stderr.strip().splitlines()[-1]
    assert said == "chm: liburing headers not found: apt-get install liburing-dev"
    assert said in troubleshooting_texts()


def test_hugepages_not_reserved() -> None:
    try:
        reserved = int(Path("/proc/sys/vm/nr_hugepages").read_text())
    except OSError as exc:
        pytest.skip(f"no hugetlb here: {exc}")
    if reserved:
        pytest.skip(f"{reserved} huge pages are reserved on this host: the open would work")
    with pytest.raises(chm.errors.NoMemory) as ei:
        chm.Device.open(pool="hugetlb", **SMALL)
    assert _shown(ei.value) in troubleshooting_texts()


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    """A ramfs mount (no O_DIRECT): root and mount(8) needed."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a ramfs needs root and mount(8)")
    where = tmp_path / "ram"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "ramfs", "none", str(where)], capture_output=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a ramfs here: {proc.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_o_direct_refused(ramfs: Path) -> None:
    target = ramfs / "ssd0.img"
    with pytest.raises(chm.errors.NotSupported) as ei:
        chm.Device.open(targets=[target], create=True, **SMALL)
    shown = _shown(ei.value, path=str(target), as_shown="/tmp/ram/ssd0.img")
    assert shown in troubleshooting_texts()


def test_drive_refused_as_busy(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("loop devices need root and losetup (util-linux)")
    image = tmp_path / "drive.img"
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    proc = subprocess.run(
        ["losetup", "--find", "--show", str(image)], capture_output=True, text=True
    )
    if proc.returncode:
        pytest.skip(f"losetup cannot attach a loop device here: {proc.stderr.strip()}")
    dev = proc.stdout.strip()
    try:
        holder = os.open(dev, os.O_RDONLY | os.O_EXCL)  # what a mount does
        try:
            with pytest.raises(chm.errors.Busy) as ei:
                chm.Device.open(targets=[dev], **{**SMALL, "capacity": "32M"})
        finally:
            os.close(holder)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
    assert _shown(ei.value, path=dev, as_shown="/dev/loop0") in troubleshooting_texts()
