"""serve refuses unsafe targets unless --force names the reason, and reads TOML.

On real loop devices (root and losetup; skipped otherwise): one with an ext4
signature, one mounted. Plus a TOML configuration on files.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import chm
from chm.testing.daemon_proc import DaemonProcess


@pytest.fixture
def ext4_loop(tmp_path: Path) -> Iterator[str]:
    import os

    if os.geteuid() != 0 or not shutil.which("losetup") or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root, losetup and mkfs.ext4 for a loop device")
    img = tmp_path / "disk.img"
    with img.open("wb") as f:
        f.truncate(64 << 20)
    dev = subprocess.run(
        ["losetup", "-f", "--show", str(img)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True)
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chm_emu.cli", "serve", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_filesystem_refused_unless_forced(ext4_loop: str, tmp_path: Path) -> None:
    sock = str(tmp_path / "chm.sock")
    common = ["--target", ext4_loop, "--dram", "40M", "--slot-size", "1M",
              "--journal", str(tmp_path / "kv.journal"), "--socket", sock]  # fmt: skip
    r = _serve(*common)
    assert r.returncode == 2
    assert f"{ext4_loop}: holds a filesystem ext4 (pass --force filesystem" in r.stderr
    r = _serve(*common, "--force", "mounted")  # the wrong reason
    assert r.returncode == 2
    assert "--force filesystem" in r.stderr
    with DaemonProcess([*common[:-2], "--force", "filesystem", "--raw", "32M"], sock) as d:
        with chm.connect(d.socket) as dev:
            assert dev.config.capacity == 64 << 20
            assert dev.write(0, bytes(4096))
            dev.flush()
        assert d.stop(signal.SIGTERM) == 0


def test_mounted_refused(ext4_loop: str, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    m = subprocess.run(["mount", ext4_loop, str(mnt)], capture_output=True, text=True)
    if m.returncode:
        pytest.skip(f"mount is not permitted here: {m.stderr.strip()}")
    try:
        r = _serve("--target", ext4_loop, "--socket", str(tmp_path / "s"), "--force", "filesystem")
        assert r.returncode == 2
        assert f"mounted at {mnt} (pass --force mounted" in r.stderr
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_toml_configuration(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text(
        f'socket = "{tmp_path / "chm.sock"}"\n'
        'eviction = "fifo"\n'
        "[device]\n"
        f'targets = ["{tmp_path / "a.img"}", "{tmp_path / "b.img"}"]\n'
        'create = true\ncapacity = "128M"\ndram = "40M"\nslot_size = "1M"\nbackend = "pread"\n'
    )
    d = DaemonProcess(["--config", str(cfg)], tmp_path / "chm.sock")
    with d, chm.connect(d.socket) as dev:
        assert dev.config.capacity == 128 << 20
        assert len(dev.config.targets) == 2
        assert dev.slot_bytes == 1 << 20
    bad = tmp_path / "bad.toml"
    bad.write_text('sockett = "x"\n')
    r = _serve("--config", str(bad))
    assert r.returncode == 2
    assert "unknown setting(s) sockett" in r.stderr
    r = _serve("--target", str(tmp_path / "c.img"), "--metrics", "0.0.0.0:9")
    assert r.returncode == 2
    assert "loopback only" in r.stderr
