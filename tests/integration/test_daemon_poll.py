"""A connection's thread polls for its client's next request for a window
learnt from the client's recent gaps (``--poll-us`` caps it), and sleeps
otherwise: against a real daemon process, the daemon's own counters
(``poll_hits``, ``poll_misses``, ``poll_ns``) and its CPU time read from
``/proc/<pid>/stat`` show when it polls and that an idle one does not.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def _tries(dev: RemoteDevice) -> tuple[int, int]:
    """(polls so far, polls that met another process on the CPU and
    stopped polling for 100 ms)."""
    s = dev.daemon_stats()["daemon"]
    return s["poll_hits"] + s["poll_misses"], s["poll_gave_way"]


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
    """Each request of a client asking back to back is polled for, unless
    another process took the daemon's CPU (then it stops for 100 ms: on a
    busy machine this test can only check that it said so)."""
    with chm.connect(capped.socket) as dev:
        for _ in range(20):
            dev.ping()
        n0, gave0 = _tries(dev)
        for _ in range(50):
            dev.ping()
        n1, gave1 = _tries(dev)
    assert n1 - n0 >= 50 or gave1 > 0, (n0, n1, gave0, gave1)


def test_the_window_grows_to_the_clients_gaps(capped: DaemonProcess) -> None:
    """Gaps of 0.4 ms (longer than the 50 us a client asking back to back
    gets, shorter than the 1 ms cap): after a few, the window covers them
    and most of them end in a request found by polling."""
    with chm.connect(capped.socket) as dev:
        for _ in range(10):
            dev.ping()
        for _ in range(10):
            _busy(0.0004)
            dev.ping()
        h0, _, _ = _polls(dev)
        n0, gave0 = _tries(dev)
        for _ in range(40):
            _busy(0.0004)
            dev.ping()
        h1, _, _ = _polls(dev)
        n1, gave1 = _tries(dev)
    assert n1 - n0 >= 40 or gave1 > 0, (n0, n1, gave0, gave1)
    assert h1 - h0 >= 30 or gave1 > 0, (h0, h1, gave0, gave1)


def test_a_client_asking_less_often_than_the_cap_is_not_polled_for(
    capped: DaemonProcess,
) -> None:
    """Back to back first (polled), then 5 ms apart (beyond the 1 ms cap):
    once the gaps it learns from (the last 16) are all beyond it, the
    thread sleeps at once."""
    with chm.connect(capped.socket) as dev:
        for _ in range(20):
            dev.ping()
        for _ in range(20):  # the window forgets the short gaps
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
    and sleeps. CPU time, not wall time, from /proc/<pid>/stat (in clock
    ticks: a thread polling through the second would show about 1 s)."""
    with chm.connect(capped.socket) as dev:
        for _ in range(200):
            dev.ping()
        time.sleep(0.1)  # the last window ends
        c0 = _cpu_s(capped.pid)
        time.sleep(1.0)
        idle = _cpu_s(capped.pid) - c0
        n0, _ = _tries(dev)
        time.sleep(0.2)
        n1, _ = _tries(dev)
    assert idle <= 0.05, f"an idle daemon used {idle:.3f} s of CPU in 1 s"
    # one poll at most while the client slept: the window after STATS
    assert n1 - n0 <= 1, (n0, n1)


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


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_poll_gives_way_to_another_process_wanting_its_cpu(capped: DaemonProcess) -> None:
    """The daemon's threads and a busy process share one CPU, the client
    runs on another: a poll whose try comes back a scheduler slice late
    (the busy process ran) stops polling for 100 ms, so most requests are
    waited for asleep instead of polled for in turns with the busy process
    (which found each request milliseconds late)."""
    cpus = sorted(os.sched_getaffinity(0))
    mine, theirs = cpus[0], cpus[1]
    for tid in os.listdir(f"/proc/{capped.pid}/task"):
        os.sched_setaffinity(int(tid), {theirs})
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {theirs})
        os.sched_setaffinity(0, {mine})
        with chm.connect(capped.socket) as dev:
            for tid in os.listdir(f"/proc/{capped.pid}/task"):  # the new connection's too
                os.sched_setaffinity(int(tid), {theirs})
            for _ in range(100):
                _busy(0.0004)
                dev.ping()
            s = dev.daemon_stats()["daemon"]
    finally:
        hog.kill()
        hog.wait()
        os.sched_setaffinity(0, set(cpus))
    polls = {k: v for k, v in s.items() if k.startswith("poll")}
    assert s["poll_gave_way"] >= 1, polls
    assert s["poll_hits"] + s["poll_misses"] <= 30, polls
