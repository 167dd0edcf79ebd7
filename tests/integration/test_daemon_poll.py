"""A connection's thread polls for its client's next request for a window
learnt from the client's recent gaps (``--poll-us`` caps it), and sleeps
otherwise: against a real daemon process, the daemon's own counters
(``poll_hits``, ``poll_misses``, ``poll_ns``) and its CPU time read from
``/proc/<pid>/stat`` show when it polls and that an idle one does not.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import chm
from chm.remote import RemoteDevice
from chm.testing.daemon_proc import DaemonProcess
from chm_emu.cli import main


def _daemon(tmp: Path, *extra: str) -> DaemonProcess:
    args = ["--target", str(tmp / "d.img"), "--create", "--capacity", "64M",
            "--dram", "2M", "--slot-size", "4K", "--backend", "pread", "--raw", "16M",
            "--config", str(tmp / "d.toml"), *extra]  # fmt: skip
    (tmp / "d.toml").write_text("[device]\nslots = 8\nwbuf = 262144\n")
    return DaemonProcess(args, tmp / "d.sock")


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[DaemonProcess]:
    with _daemon(tmp_path, "--poll-us", "1000") as d:
        yield d


def _polls(dev: RemoteDevice) -> tuple[int, int, int]:
    s = dev.daemon_stats()["daemon"]
    return s["poll_hits"], s["poll_misses"], s["poll_ns"]


def _cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_client_asking_in_a_loop_is_polled_for(capped: DaemonProcess) -> None:
    with chm.connect(capped.socket) as dev:
        for _ in range(20):
            dev.ping()
        h0, _, _ = _polls(dev)
        for _ in range(50):
            dev.ping()
        h1, _, _ = _polls(dev)
    # each ping (and the STATS between) found by polling, bar a few a busy
    # machine delayed past the window
    assert h1 - h0 >= 40, (h0, h1)


def test_the_window_grows_to_the_clients_gaps(capped: DaemonProcess) -> None:
    """Gaps of 0.4 ms (longer than the 50 us a client asking back to back
    gets, shorter than the 1 ms cap): after a few, the window covers them."""
    with chm.connect(capped.socket) as dev:
        for _ in range(10):
            dev.ping()
        for _ in range(10):
            _busy(0.0004)
            dev.ping()
        h0, _, _ = _polls(dev)
        for _ in range(40):
            _busy(0.0004)
            dev.ping()
        h1, _, _ = _polls(dev)
    assert h1 - h0 >= 30, (h0, h1)


def test_a_client_asking_less_often_than_the_cap_is_not_polled_for(
    capped: DaemonProcess,
) -> None:
    """Back to back first (polled), then 5 ms apart (beyond the 1 ms cap):
    once the last 8 gaps are all beyond it, the thread sleeps at once."""
    with chm.connect(capped.socket) as dev:
        for _ in range(20):
            dev.ping()
        for _ in range(12):  # the window forgets the short gaps
            time.sleep(0.005)
            dev.daemon_stats()
        time.sleep(0.005)
        hits, misses, ns = _polls(dev)
        for _ in range(10):
            time.sleep(0.005)
            dev.ping()
        assert _polls(dev) == (hits, misses, ns)


def test_an_idle_daemon_does_not_poll(capped: DaemonProcess) -> None:
    """After a burst of requests, a connected client that sends nothing
    costs the daemon no CPU: its thread polled one window (at most 1 ms)
    and sleeps. CPU time, not wall time, from /proc/<pid>/stat."""
    with chm.connect(capped.socket) as dev:
        for _ in range(200):
            dev.ping()
        time.sleep(0.1)  # the last window ends
        c0 = _cpu_s(capped.pid)
        time.sleep(1.0)
        idle = _cpu_s(capped.pid) - c0
        _, _, ns0 = _polls(dev)
        time.sleep(0.2)
        _, _, ns1 = _polls(dev)
    assert idle <= 0.03, f"an idle daemon used {idle:.3f} s of CPU in 1 s"
    # the STATS request itself was polled for at most one window after it
    assert ns1 - ns0 <= 2_000_000, ns1 - ns0


def test_poll_us_0_never_polls(tmp_path: Path) -> None:
    with _daemon(tmp_path, "--poll-us", "0") as d, chm.connect(d.socket) as dev:
        for _ in range(50):
            dev.ping()
        assert _polls(dev) == (0, 0, 0)


def test_poll_us_is_checked(tmp_path: Path) -> None:
    args = ["serve", "--socket", str(tmp_path / "s"), "--target", str(tmp_path / "t.img")]
    r = CliRunner().invoke(main, [*args, "--poll-us", "-1"])
    assert r.exit_code == 2 and "--poll-us" in r.output, r.output
    (tmp_path / "c.toml").write_text('poll_us = "2ms"\n')
    r = CliRunner().invoke(main, [*args, "--config", str(tmp_path / "c.toml")])
    assert r.exit_code == 2 and "poll_us: an integer 0..1000000" in r.output, r.output
