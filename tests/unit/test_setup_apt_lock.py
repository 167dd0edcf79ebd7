"""scripts/setup.sh waits for a held package-manager lock instead of failing.

Real apt-get, pointed at a private state directory (-o Dir=...), so the test
never touches the host's package state; the lock is taken the way apt and
dpkg take it (fcntl), by this process.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="apt-get is not here")


@pytest.fixture
def apt_root(tmp_path: Path) -> Iterator[Path]:
    for d in (
        "etc/apt/sources.list.d",
        "etc/apt/apt.conf.d",
        "etc/apt/preferences.d",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/lib/dpkg",
    ):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "etc/apt/sources.list").write_text("")
    (tmp_path / "var/lib/dpkg/status").write_text("")
    yield tmp_path


def _apt_update(root: Path, wait: int) -> subprocess.CompletedProcess[str]:
    opts = f"-o Dir={root} -o Dir::State::status={root}/var/lib/dpkg/status"
    env = {
        **os.environ,
        "CHM_APT_OPTS": opts,
        "CHM_APT_LOCK_WAIT": str(wait),
        "CHM_APT_LOCK_STEP": "1",
        "SUDO": "",
    }
    return subprocess.run(
        ["bash", "-c", ". scripts/apt-get-wait.sh && apt_get update -qq"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _hold(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    return fd


def test_free_lock_runs_at_once(apt_root: Path) -> None:
    proc = _apt_update(apt_root, 10)
    assert proc.returncode == 0, proc.stderr
    assert "waiting" not in proc.stderr


def test_waits_while_the_lock_is_held(apt_root: Path) -> None:
    fd = _hold(apt_root / "var/lib/apt/lists/lock")
    timer = threading.Timer(2.5, os.close, (fd,))  # the other install finishes
    timer.start()
    try:
        proc = _apt_update(apt_root, 30)
    finally:
        timer.join()
    assert proc.returncode == 0, proc.stderr
    assert f"waiting for the package manager lock (held by process {os.getpid()}" in proc.stderr


def test_gives_up_after_the_bound(apt_root: Path) -> None:
    fd = _hold(apt_root / "var/lib/apt/lists/lock")
    try:
        proc = _apt_update(apt_root, 2)
    finally:
        os.close(fd)
    assert proc.returncode != 0
    assert "Could not get lock" in proc.stderr
    assert "the package manager lock is still held after 2 s (CHM_APT_LOCK_WAIT)" in proc.stderr


def test_other_failures_are_not_retried(apt_root: Path) -> None:
    (apt_root / "etc/apt/sources.list").write_text("this is not a source line\n")
    proc = _apt_update(apt_root, 30)
    assert proc.returncode != 0
    assert "waiting" not in proc.stderr
