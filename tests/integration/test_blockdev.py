"""The device on real block devices: loop devices stand in for a spare NVMe
drive (root and losetup needed; skipped with the reason otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import chm
from chm.errors import Busy, InvalidArgument

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("losetup") is None,
    reason="loop devices need root and losetup (util-linux)",
)

MiB = 1 << 20
SIZE = 256 * MiB


def _losetup(image: Path, sector: int) -> str:
    proc = subprocess.run(
        ["losetup", "--find", "--show", "--direct-io=on", f"--sector-size={sector}", str(image)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"losetup cannot attach a loop device here: {proc.stderr.strip()}")
    return proc.stdout.strip()


@pytest.fixture
def loopdev(tmp_path: Path) -> Iterator[Callable[[int], tuple[str, bytes]]]:
    """Attaches a loop device over an image of random bytes; detaches after."""
    attached: list[str] = []

    def make(sector: int = 512) -> tuple[str, bytes]:
        image = tmp_path / f"drive{len(attached)}.img"
        data = os.urandom(SIZE)
        image.write_bytes(data)
        dev = _losetup(image, sector)
        attached.append(dev)
        return dev, data

    yield make
    for dev in attached:
        subprocess.run(["losetup", "-d", dev], check=False)


def _read_raw(path: str, addr: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, addr)
    finally:
        os.close(fd)


@pytest.mark.parametrize("backend", ["uring", "pread"])
def test_prefetch_read_write_on_a_loop_device(
    loopdev: Callable[[int], tuple[str, bytes]], backend: str
) -> None:
    path, data = loopdev(512)
    with chm.Device.open(
        targets=[path], capacity=SIZE, backend=backend, dram="64M", wbuf="8M", slot_size="16M"
    ) as dev:
        with dev.prefetch(3 * MiB + 123, 16 * MiB - 500) as h:
            assert h.wait(10) == data[3 * MiB + 123 : 19 * MiB - 377]
        assert dev.read(200 * MiB + 7, 65536) == data[200 * MiB + 7 : 200 * MiB + 7 + 65536]
        new = os.urandom(MiB)
        assert dev.write(100 * MiB, new) is True
        assert dev.read(100 * MiB, MiB) == new
        dev.flush(10)
    # durable on the drive itself, read past the device
    subprocess.run(["blockdev", "--flushbufs", path], check=False)
    assert _read_raw(path, 100 * MiB, MiB) == new


def test_a_claimed_drive_is_refused_busy(loopdev: Callable[[int], tuple[str, bytes]]) -> None:
    path, _ = loopdev(512)
    holder = os.open(path, os.O_RDONLY | os.O_EXCL)  # as a mount or another device would
    try:
        with pytest.raises(Busy):
            chm.Device.open(targets=[path], capacity=SIZE, backend="pread", dram="96M")
    finally:
        os.close(holder)
    chm.Device.open(targets=[path], capacity=SIZE, backend="pread", dram="96M").close()


def test_drive_smaller_than_capacity_is_nospace(
    loopdev: Callable[[int], tuple[str, bytes]],
) -> None:
    path, _ = loopdev(512)
    with pytest.raises(chm.errors.NoSpace):
        chm.Device.open(targets=[path], capacity=2 * SIZE, backend="pread", dram="96M")


def test_4k_sector_drive_needs_4k_aligned_writes(
    loopdev: Callable[[int], tuple[str, bytes]],
) -> None:
    path, data = loopdev(4096)
    with chm.Device.open(targets=[path], capacity=SIZE, backend="uring", dram="96M") as dev:
        with pytest.raises(InvalidArgument):
            dev.write(512, b"x" * 512)
        block = os.urandom(8192)
        assert dev.write(8192, block) is True
        # unaligned staged reads still work: fills are widened to 4 KiB
        with dev.prefetch(4097, 10000) as h:
            assert h.wait(10) == data[4097:8192] + block[: 4097 + 10000 - 8192]
        dev.flush(10)
    assert _read_raw(path, 8192, 8192) == block
