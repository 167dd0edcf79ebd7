"""A crash round for the daemon: stream KV writes, SIGKILL it, restart, verify.

Used by tests/integration/test_daemon_crash.py and tools/bench/daemon_crash.py.
A writer process puts blocks and flushes, printing the keys of each
acknowledged flush; the daemon is killed with SIGKILL at a varying moment,
restarted on the same targets, and every acknowledged block is read back.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import chm
from chm.remote import DaemonGone
from chm.testing.daemon_proc import DaemonProcess

__all__ = ["BLOCK", "CrashResult", "crash_round", "serve_args"]

BLOCK = 128 << 10


def serve_args(tmp: Path) -> list[str]:
    return [
        "--target", str(tmp / "t0.img"), "--create", "--capacity", "256M",
        "--dram", "40M", "--slot-size", "1M", "--backend", "pread", "--raw", "64M",
    ]  # fmt: skip


@dataclass
class CrashResult:
    acked: list[int]
    lost: int
    wrong: int
    new_memfd: bool
    new_instance: bool


def _block(i: int) -> np.ndarray[Any, Any]:
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


def crash_round(tmp: Path, sock: Path, start: int) -> CrashResult:
    """Streams writes, SIGKILLs the daemon, restarts and verifies.

    Raises RuntimeError when the round itself goes wrong."""
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
        if not line:
            raise RuntimeError("the writer stopped early")
        acked += [int(x) for x in line.split()]
    d.kill()  # SIGKILL during the stream
    for line in w.stdout:  # acknowledgements that raced the kill count too
        acked += [int(x) for x in line.split()]
    if w.wait(30) != 0:
        raise RuntimeError(f"the writer exited with {w.returncode}")
    try:
        old.stats()
    except DaemonGone:
        pass
    else:
        raise RuntimeError("a client of the killed daemon was still answered")
    old.close()
    d2 = DaemonProcess(serve_args(tmp), sock).start()
    try:
        with chm.connect(str(sock)) as dev:
            new_instance = dev.instance != old_instance
            new_memfd = os.fstat(dev.pool_fd).st_ino != old_ino
            kv = dev.kv()
            lost = wrong = 0
            for j in acked:
                out = np.zeros(BLOCK, np.uint8)
                if kv.get([f"c{j}".encode()], [out]) != [True]:
                    lost += 1
                elif not np.array_equal(out, _block(j)):
                    wrong += 1
    finally:
        d2.stop()
    return CrashResult(acked, lost, wrong, new_memfd, new_instance)
