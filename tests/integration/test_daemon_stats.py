"""``chm-emu stats --watch``: one snapshot per interval that follows the
daemon's counters, ended by Ctrl-C (status 0) or by the daemon going away
(status 1 with the reason, never a hang); a bad interval is refused."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import chm
from chm.testing.daemon_proc import DaemonProcess

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


def _interrupt_after_first_snapshot(sock: str, delay: float) -> tuple[int, str, float]:
    """Starts ``stats --watch 0.05``, sends SIGINT ``delay`` seconds after its
    first snapshot; its exit status, stderr and how long it took to exit."""
    p = _watch(sock, "--json", "--watch", "0.05")
    assert p.stdout is not None
    try:
        first = p.stdout.readline()
        if not first:  # it exited before its first snapshot: say why
            _, err = p.communicate(timeout=10)
            raise AssertionError(f"stats --watch exited with {p.returncode}: {err}")
        json.loads(first)
        time.sleep(delay)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=10)
        return p.returncode, err, time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _sigint_loop(sock: str, runs: int) -> None:
    rng = random.Random(13)
    for i in range(runs):
        rc, err, took = _interrupt_after_first_snapshot(sock, rng.uniform(0, 0.12))
        assert rc == 0 and "Traceback" not in err, (i, rc, err)
        assert took < 5.0, (i, took)


def test_sigint_at_random_moments_always_ends_the_watch(daemon: DaemonProcess) -> None:
    _sigint_loop(daemon.socket, 8)


@pytest.mark.slow
def test_sigint_at_random_moments_always_ends_the_watch_many(daemon: DaemonProcess) -> None:
    _sigint_loop(daemon.socket, 200)


def test_sigint_while_the_daemon_does_not_answer(daemon: DaemonProcess) -> None:
    """The interrupt lands in a blocked request (the daemon stopped): the
    watch still ends at once, status 0; before, the KeyboardInterrupt left the
    connection mid-request and closing it waited on the stopped daemon."""
    p = _watch(daemon.socket, "--json", "--watch", "0.05")
    assert p.stdout is not None
    try:
        json.loads(p.stdout.readline())
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            time.sleep(0.3)  # the next STATS is sent and waits for its answer
            t0 = time.monotonic()
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=10)
            took = time.monotonic() - t0
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and "Traceback" not in err, err
    assert took < 5.0


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "127.0.0.1:65536"])
def test_metrics_port_out_of_range_is_a_usage_error(tmp_path: Path, listen: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "chm_emu.cli", "serve", "--target", str(tmp_path / "t.img"),
         *ARGS, "--socket", str(tmp_path / "s"), "--metrics", listen],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "--metrics" in p.stderr and "0..65535" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "s").exists()


def test_table_names_the_mode_and_backend(daemon: DaemonProcess) -> None:
    """The table spells the device's enums (mode, backend, pool kind) by name,
    as --json keeps the numbers a program reads."""
    out = subprocess.run(
        [sys.executable, "-m", "chm_emu.cli", "stats", "--socket", daemon.socket],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    rows = {
        tuple(c.strip() for c in line.strip("│ ").split("│")[1:3])
        for line in out.stdout.splitlines()
        if line.count("│") >= 3
    }
    assert ("mode", "prefetch") in rows and ("backend", "pread") in rows, out.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "chm_emu.cli", "stats", "--socket", daemon.socket, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    device = json.loads(as_json.stdout)["device"]
    assert isinstance(device["mode"], int) and isinstance(device["backend"], int)
