"""Crashes around the daemon, with real SIGKILLs.

- a client killed while blocked in wait: its handles (staged and queued) are
  released, nobody else is disturbed;
- the daemon killed while a client is blocked in wait: the wait raises
  DaemonGone, it does not hang;
- the daemon killed during a stream of KV writes, then restarted on the same
  targets: every block whose flush was acknowledged is found byte-exact, and
  the new daemon hands out a new pool memfd.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import chm
from chm.errors import ChmError
from chm.remote import DaemonGone, RemoteHandle
from chm.testing.daemon_crash import crash_round, serve_args
from chm.testing.daemon_proc import DaemonProcess


def _handles(out: list[RemoteHandle | ChmError]) -> list[RemoteHandle]:
    """The handles of a prefetch_many that issued every element."""
    assert all(isinstance(h, RemoteHandle) for h in out), out
    return [h for h in out if isinstance(h, RemoteHandle)]


ROUNDS = int(os.environ.get("CHM_DAEMON_CRASH_ROUNDS", "2"))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with DaemonProcess(serve_args(tmp_path), tmp_path / "chm.sock") as d:
        yield d


def _held(dev: chm.remote.RemoteDevice, want: dict[str, int], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while True:
        held = dev.daemon_stats()["held"]
        if held == want or time.monotonic() > end:
            break
        time.sleep(0.02)
    assert held == want


_BLOCKED_WAITER = """
import sys, chm
dev = chm.connect(sys.argv[1])
h = dev.prefetch(int(sys.argv[2]), 4096)
print("waiting", flush=True)
h.wait()  # queued behind the slots another client holds: blocks
"""


def test_client_killed_mid_wait(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as a:
        n = a.stats().slots_total
        hs = _handles(a.prefetch_many([i << 20 for i in range(n)], [4096] * n))
        a.wait_many(hs)
        p = subprocess.Popen(
            [sys.executable, "-c", _BLOCKED_WAITER, daemon.socket, str(n << 20)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "waiting"
        time.sleep(0.2)  # in the daemon's wait now
        assert a.stats().queue_len == 1
        p.kill()
        p.wait()
        _held(a, {"clients": 1, "handles": n, "pins": 0})
        assert a.stats().queue_len == 0  # the queued prefetch went with it
        a.release_many(hs)
        assert a.stats().slots_held == 0
    ev = [e for e in daemon.events() if e.get("event") == "disconnect" and e["pid"] == p.pid]
    assert ev and ev[0]["released_handles"] == 1


def test_daemon_killed_during_wait(daemon: DaemonProcess) -> None:
    a = chm.connect(daemon.socket)
    b = chm.connect(daemon.socket)
    n = a.stats().slots_total
    hs = _handles(a.prefetch_many([i << 20 for i in range(n)], [4096] * n))
    a.wait_many(hs)
    h = b.prefetch(n << 20, 4096)
    got: list[BaseException] = []

    def waiter() -> None:
        try:
            h.wait()  # no timeout: only the daemon's death can end it
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()
    daemon.kill()
    t.join(timeout=10.0)
    assert not t.is_alive(), "wait hung after the daemon died"
    assert len(got) == 1 and isinstance(got[0], DaemonGone), got
    with pytest.raises(DaemonGone):
        a.stats()
    a.close()
    b.close()


def test_daemon_killed_during_write_stream(tmp_path: Path) -> None:
    sock = tmp_path / "chm.sock"
    total = lost_all = wrong_all = 0
    start = 0
    for _ in range(ROUNDS):
        r = crash_round(tmp_path, sock, start)
        assert r.new_instance and r.new_memfd, "a restarted daemon reused the memfd"
        start = max(r.acked) + 100
        total += len(r.acked)
        lost_all += r.lost
        wrong_all += r.wrong
    print(f"daemon crash: {ROUNDS} rounds, {total} acknowledged blocks, "
          f"{lost_all} lost, {wrong_all} wrong", file=sys.stderr)  # fmt: skip
    assert total > 0
    assert (lost_all, wrong_all) == (0, 0)
