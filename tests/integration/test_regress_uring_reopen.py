"""close() of a uring device on a block device returned while the kernel still
held the drive: an immediate reopen was Busy (up to 19 refusals over 27 ms)
and ``losetup -d`` right after close only deferred the detach. close() must
return once every target fd, the ring's registered files included, is closed.

A loop device stands in for the drive (root and losetup needed; skipped with
the reason otherwise).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chm
from chm.errors import Busy, ChmError

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("losetup") is None,
    reason="loop devices need root and losetup (util-linux)",
)

MiB = 1 << 20
SIZE = 32 * MiB
ROUNDS = 50
OPTIONS: dict[str, Any] = {"capacity": SIZE, "dram": "8M", "wbuf": "1M", "slot_size": "1M"}


def _attach(image: Path) -> str:
    proc = subprocess.run(
        ["losetup", "--find", "--show", "--direct-io=on", str(image)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"losetup cannot attach a loop device here: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _attached(dev: str) -> bool:
    """True while the loop device still has a backing file."""
    return Path(f"/sys/block/{Path(dev).name}/loop/backing_file").exists()


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[str]:
    image = tmp_path / "drive.img"
    with open(image, "wb") as f:
        f.truncate(SIZE)
    dev = _attach(image)
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)


def _exclusive_open_now(path: str) -> int:
    """0 if the drive can be opened exclusively at once, else the errno."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_EXCL)
    except OSError as exc:
        return exc.errno or -1
    os.close(fd)
    return 0


@pytest.mark.parametrize("sqpoll", [0, 1], ids=["irq", "sqpoll"])
def test_reopen_right_after_close_is_never_busy(loop: str, sqpoll: int) -> None:
    busy = 0
    held = 0
    for i in range(ROUNDS):
        try:
            dev = chm.Device.open(targets=[loop], backend="uring", sqpoll=sqpoll, **OPTIONS)
        except Busy:
            busy += 1
            continue
        except ChmError as exc:
            if exc.errno in (errno.EPERM, errno.EOPNOTSUPP):
                pytest.skip(f"io_uring{' SQPOLL' if sqpoll else ''} unavailable: {exc.strerror}")
            raise
        with dev:
            addr = (i % 16) * MiB
            h = dev.prefetch(addr, 4096)
            h.wait(10)
            h.release()
            assert dev.write(addr, bytes(4096)) is True
        # close() has returned: nothing of ours may hold the drive now
        if _exclusive_open_now(loop) == errno.EBUSY:
            held += 1
    assert (busy, held) == (0, 0), (
        f"{busy} of {ROUNDS} reopens were Busy and {held} times the drive was still "
        "held after close() returned"
    )


@pytest.mark.parametrize("backend", ["uring", "pread"])
def test_losetup_detach_right_after_close(tmp_path: Path, backend: str) -> None:
    image = tmp_path / "drive.img"
    with open(image, "wb") as f:
        f.truncate(SIZE)
    dev = _attach(image)
    try:
        with (
            chm.Device.open(targets=[dev], backend=backend, **OPTIONS) as d,
            d.prefetch(0, 4096) as h,
        ):
            h.wait(10)
        proc = subprocess.run(["losetup", "-d", dev], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        # with the drive still open, the kernel only marks it for autoclear
        assert not _attached(dev), f"{dev} still attached: detach was deferred"
    finally:
        if _attached(dev):
            subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)
