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

import numpy as np
import pytest

import chm
from chm.remote import DaemonGone
from chm_emu.serve_proc import DaemonProcess

ROUNDS = int(os.environ.get("CHM_DAEMON_CRASH_ROUNDS", "2"))
BLOCK = 128 << 10


def serve_args(tmp: Path) -> list[str]:
    return [
        "--target", str(tmp / "t0.img"), "--create", "--capacity", "256M",
        "--dram", "40M", "--slot-size", "1M", "--backend", "pread",
    ]  # fmt: skip


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
        hs = a.prefetch_many([(i << 20, 4096) for i in range(n)])
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
    hs = a.prefetch_many([(i << 20, 4096) for i in range(n)])
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


def _block(i: int) -> np.ndarray:
    return ((np.arange(BLOCK, dtype=np.uint32) * 40503 + i * 7919) >> 5).astype(np.uint8)


_WRITER = """
import sys, numpy as np, chm
from chm.remote import DaemonGone
sock, start, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def block(i):
    return ((np.arange(size, dtype=np.uint32) * 40503 + i * 7919) >> 5).astype(np.uint8)
dev = chm.connect(sock)
kv = dev.kv()
i = start
try:
    while True:
        batch = list(range(i, i + 4))
        st = kv.put([f"c{j}".encode() for j in batch], [block(j) for j in batch])
        kv.flush()
        # acknowledged: stored and flushed
        print(" ".join(str(j) for j, s in zip(batch, st) if int(s) in (0, 1)), flush=True)
        i += 4
except DaemonGone:
    sys.exit(0)
"""


def crash_round(tmp: Path, sock: Path, start: int) -> tuple[list[int], int, int]:
    """Streams writes, SIGKILLs the daemon, restarts and verifies.

    Returns (acknowledged keys, lost, wrong)."""
    d = DaemonProcess(serve_args(tmp), sock).start()
    old = chm.connect(str(sock))
    old_ino = os.fstat(old.pool_fd).st_ino
    old_instance = old.instance
    w = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(sock), str(start), str(BLOCK)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert w.stdout is not None
    acked: list[int] = []
    want = 24 + (start * 7) % 17  # a different moment each round
    while len(acked) < want:
        line = w.stdout.readline()
        assert line, "the writer stopped early"
        acked += [int(x) for x in line.split()]
    d.kill()  # SIGKILL during the stream
    for line in w.stdout:  # acknowledgements that raced the kill count too
        acked += [int(x) for x in line.split()]
    assert w.wait(30) == 0
    with pytest.raises(DaemonGone):
        old.stats()
    old.close()
    d2 = DaemonProcess(serve_args(tmp), sock).start()
    try:
        with chm.connect(str(sock)) as dev:
            assert dev.instance != old_instance
            assert os.fstat(dev.pool_fd).st_ino != old_ino, "a restarted daemon reused the memfd"
            kv = dev.kv()
            lost = wrong = 0
            for j in acked:
                out = np.zeros(BLOCK, np.uint8)
                if kv.get([f"c{j}".encode()], [out]) != [True]:
                    lost += 1
                elif not np.array_equal(out, _block(j)):
                    wrong += 1
            assert dev.daemon_stats()["held"]["handles"] == 0
    finally:
        d2.stop()
    return acked, lost, wrong


def test_daemon_killed_during_write_stream(tmp_path: Path) -> None:
    sock = tmp_path / "chm.sock"
    total = lost_all = wrong_all = 0
    start = 0
    for _ in range(ROUNDS):
        acked, lost, wrong = crash_round(tmp_path, sock, start)
        start = max(acked) + 100
        total += len(acked)
        lost_all += lost
        wrong_all += wrong
    print(f"daemon crash: {ROUNDS} rounds, {total} acknowledged blocks, "
          f"{lost_all} lost, {wrong_all} wrong", file=sys.stderr)  # fmt: skip
    assert total > 0
    assert (lost_all, wrong_all) == (0, 0)
