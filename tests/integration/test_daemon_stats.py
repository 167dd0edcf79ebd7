"""``chm-emu stats --watch``: one snapshot per interval that follows the
daemon's counters, ended by Ctrl-C (status 0) or by the daemon going away
(status 1 with the reason, never a hang); a bad interval is refused."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import chm
from chm_emu.serve_proc import DaemonProcess

ARGS = ["--create", "--capacity", "64M", "--dram", "40M", "--slot-size", "1M",
        "--backend", "pread", "--no-kv"]  # fmt: skip


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with DaemonProcess(["--target", str(tmp_path / "t.img"), *ARGS], tmp_path / "s") as d:
        yield d


def _watch(sock: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "chm_emu.cli", "stats", "--socket", sock, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_watch_follows_the_counters_until_interrupted(daemon: DaemonProcess) -> None:
    p = _watch(daemon.socket, "--json", "--watch", "0.05")
    assert p.stdout is not None
    try:
        first = json.loads(p.stdout.readline())
        with chm.connect(daemon.socket) as dev:
            for i in range(5):
                dev.prefetch(i << 20, 4096).release()
            issued = dev.stats().prefetch_issued
        for _ in range(200):  # a later snapshot shows them
            s = json.loads(p.stdout.readline())
            if s["device"]["prefetch_issued"] == issued:
                break
        else:
            raise AssertionError("no snapshot showed the prefetches")
        assert first["device"]["prefetch_issued"] == 0
        assert s["daemon"]["clients_total"] > first["daemon"]["clients_total"]
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "Traceback" not in err


def test_watch_table_ends_when_the_daemon_dies(daemon: DaemonProcess) -> None:
    p = _watch(daemon.socket, "--watch", "0.05")
    assert p.stdout is not None
    try:
        while "prefetch_issued" not in p.stdout.readline():
            pass
        daemon.kill()
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1
    assert "Error:" in err and "daemon" in err and "Traceback" not in err


@pytest.mark.parametrize("interval", ["0", "-1", "soon"])
def test_bad_interval_is_refused(daemon: DaemonProcess, interval: str) -> None:
    p = _watch(daemon.socket, "--watch", interval)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 2 and "--watch" in err and out == ""
