"""The refusal matrix of ``chm-emu devices`` on real loop devices.

A loop device over a scratch file, in each state serve must refuse: mounted,
holding a filesystem signature, partitioned; and a blank one it may take.
Needs root and losetup (skipped with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from chm.daemon.devices import check_target, list_block_devices
from chm_emu.cli import main

SIZE = 64 << 20


def _need_root_tools(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"{t} is not installed")


def _mbr(path: Path) -> None:
    """One Linux partition from sector 2048 to the end: a real MBR table."""
    sectors = SIZE // 512
    entry = struct.pack("<B3sB3sII", 0, b"\0\0\0", 0x83, b"\0\0\0", 2048, sectors - 2048)
    with path.open("r+b") as f:
        f.seek(446)
        f.write(entry + bytes(48) + b"\x55\xaa")


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """Yields (image, cleanup-commands list); a test attaches the loop itself."""
    _need_root_tools("losetup", "blkid")
    img = tmp_path / "disk.img"
    with img.open("wb") as f:
        f.truncate(SIZE)
    undo: list[str] = []
    yield img, undo
    for cmd in reversed(undo):
        subprocess.run(cmd.split(), check=False, capture_output=True)


def _attach(img: Path, undo: list[str], *flags: str) -> str:
    dev = subprocess.run(
        ["losetup", "-f", "--show", *flags, str(img)], check=True, capture_output=True, text=True
    ).stdout.strip()
    undo.append(f"losetup -d {dev}")
    return dev


def _reasons(dev: str) -> list[str]:
    name = Path(dev).name
    (b,) = [b for b in list_block_devices() if b.name == name]
    assert b.path == dev
    assert b.size == SIZE
    assert b.logical_block_size in (512, 4096)
    assert b.reasons == check_target(dev)  # serve judges a target the same way
    return list(b.reasons)


def test_blank_loop_device_is_usable(loop: tuple[Path, list[str]]) -> None:
    img, undo = loop
    dev = _attach(img, undo)
    assert _reasons(dev) == []


def test_filesystem_signature_refused(loop: tuple[Path, list[str]]) -> None:
    _need_root_tools("mkfs.ext4")
    img, undo = loop
    dev = _attach(img, undo)
    subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True)
    r = _reasons(dev)
    assert r == ["holds a filesystem ext4"]


def test_swap_signature_refused(loop: tuple[Path, list[str]]) -> None:
    _need_root_tools("mkswap")
    img, undo = loop
    dev = _attach(img, undo)
    subprocess.run(["mkswap", dev], check=True, capture_output=True)
    assert _reasons(dev) == ["holds a swap signature (swap)"]


def test_mounted_refused(loop: tuple[Path, list[str]], tmp_path: Path) -> None:
    _need_root_tools("mkfs.ext4", "mount", "umount")
    img, undo = loop
    dev = _attach(img, undo)
    subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", dev, str(mnt)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"mount is not permitted here: {r.stderr.strip()}")
    undo.append(f"umount {mnt}")
    assert _reasons(dev) == [f"mounted at {mnt}", "holds a filesystem ext4"]


def test_partition_table_refused(loop: tuple[Path, list[str]]) -> None:
    img, undo = loop
    _mbr(img)
    dev = _attach(img, undo)
    assert _reasons(dev) == ["holds a partition table dos"]


def test_partitions_refused(loop: tuple[Path, list[str]]) -> None:
    img, undo = loop
    _mbr(img)
    dev = _attach(img, undo, "-P")
    name = Path(dev).name
    part = Path(f"/sys/class/block/{name}p1")
    if not part.exists():
        pytest.skip(
            "this kernel created no partition for the MBR on the loop device "
            "(losetup -P; msdos partition support missing?)"
        )
    r = _reasons(dev)
    assert r == [f"has partitions ({name}p1)", "holds a partition table dos"]
    assert check_target(f"/dev/{name}p1") == []  # the partition itself is blank


def test_devices_command_json_and_table(loop: tuple[Path, list[str]]) -> None:
    _need_root_tools("mkfs.ext4")
    img, undo = loop
    dev = _attach(img, undo)
    subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True)
    res = CliRunner().invoke(main, ["devices", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    (mine,) = [b for b in data["block_devices"] if b["path"] == dev]
    assert mine["usable"] is False
    assert mine["reasons"] == ["holds a filesystem ext4"]
    assert data["numa_nodes"], "at least one NUMA node"
    for n in data["numa_nodes"]:
        assert n["cxl_candidate"] == (not n["cpus"] and n["mem_bytes"] > 0)
    res = CliRunner().invoke(main, ["devices"])
    assert res.exit_code == 0, res.output
    assert dev in res.output
    assert "NUMA nodes" in res.output
    print(res.output, file=sys.stderr)
