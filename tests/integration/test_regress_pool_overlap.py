"""A pool=file pool_path that backs a loop-device target: the DRAM pool and
the drive are the same bytes, so they overwrite each other. Refused at open
(InvalidArgument) like a pool_path that is a target file. Needs root and
losetup (skipped with the reason otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import chm
from chm.errors import InvalidArgument

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("losetup") is None,
    reason="loop devices need root and losetup (util-linux)",
)

MiB = 1 << 20
SIZE = 16 * MiB


@pytest.mark.parametrize("backend", ["uring", "pread"])
def test_pool_file_backing_a_loop_target_is_refused(tmp_path: Path, backend: str) -> None:
    image = tmp_path / "drive.img"
    data = os.urandom(SIZE)
    image.write_bytes(data)
    proc = subprocess.run(
        ["losetup", "--find", "--show", "--direct-io=on", str(image)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"losetup cannot attach a loop device here: {proc.stderr.strip()}")
    loop = proc.stdout.strip()
    try:
        with pytest.raises(InvalidArgument) as info:
            dev = chm.Device.open(
                targets=[loop],
                backend=backend,
                capacity=SIZE,
                dram="4M",
                wbuf="1M",
                slot_size="1M",
                pool="file",
                pool_path=image,
            )
            dev.close()
        msg = str(info.value)
        assert "pool_path" in msg and str(image) in msg and loop in msg, msg
    finally:
        subprocess.run(["losetup", "-d", loop], check=False, capture_output=True)
    assert image.read_bytes() == data
