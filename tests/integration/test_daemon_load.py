"""8 client processes x mixed load on one daemon for a bounded time.

Each client mixes KV puts and prefix loads over a shared key space,
raw batched prefetch/wait/release, writes and reads (in the daemon's raw
region, which the store's segments never reach), and now and then
leaves without releasing (a dropped connection). Afterwards the daemon holds
0 handles and 0 pins, the device 0 held slots and an empty refill queue, and
the store 0 pinned segments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chm
from chm.testing.daemon_proc import DaemonProcess

CLIENTS = 8
SECONDS = float(os.environ.get("CHM_DAEMON_LOAD_SECONDS", "4"))

_CLIENT = """
import json, random, sys, time, numpy as np, chm
from chm.remote import RemoteHandle
sock, seed, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rng = random.Random(seed)
BLK = 64 << 10
def block(i):
    return ((np.arange(BLK, dtype=np.uint32) * 2654435761 + i) >> 9).astype(np.uint8)
end = time.monotonic() + seconds
ops = {"put": 0, "load": 0, "loaded": 0, "wrong": 0, "prefetch": 0, "write": 0, "drop": 0,
       "timeouts": 0, "busy": 0}
while time.monotonic() < end:
    dev = chm.connect(sock)
    kv = dev.kv()
    for _ in range(rng.randint(5, 30)):
        r = rng.random()
        if r < 0.3:
            base = rng.randrange(0, 200)
            ks = [f"u{base + j}".encode() for j in range(8)]
            kv.put(ks, [block(base + j) for j in range(8)])
            ops["put"] += 1
        elif r < 0.6:
            base = rng.randrange(0, 200)
            ks = [f"u{base + j}".encode() for j in range(rng.randint(1, 32))]
            outs = [np.zeros(BLK, np.uint8) for _ in ks]
            n = kv.load_prefix(ks, outs, timeout=5.0)
            ops["load"] += 1
            ops["loaded"] += n
            ops["wrong"] += sum(not np.array_equal(outs[j], block(base + j)) for j in range(n))
        elif r < 0.8:
            out = dev.prefetch_many([rng.randrange(0, 200) << 20 for _ in range(4)], [4096] * 4)
            hs = [h for h in out if isinstance(h, RemoteHandle)]
            if len(hs) < len(out):
                assert all(isinstance(e, chm.errors.WouldBlock) for e in out if e not in hs)
                ops["busy"] += 1
                dev.release_many(hs)
                continue
            try:
                dev.wait_many(hs, timeout=2.0)
            except chm.errors.WaitTimeout:  # others hold the slots: give ours back
                ops["timeouts"] += 1
                dev.release_many(hs)
                continue
            if rng.random() < 0.8:
                dev.release_many(hs)
            ops["prefetch"] += 1
        elif r < 0.9:
            dev.write((200 + rng.randrange(0, 50)) << 20, bytes(8192))
            ops["write"] += 1
        else:
            dev.read(rng.randrange(0, 250) << 20, 1000)
    if rng.random() < 0.3:  # leave holding whatever is held
        ops["drop"] += 1
        dev._sock.close()
    else:
        dev.close()
print(json.dumps(ops))
"""


# slow tier: 8 client processes busy for SECONDS each (about 16 s on two CPUs); the
# fast tier keeps each behaviour alone: clients dropped or killed while holding
# handles and pins (test_daemon_crash.py, test_daemon_isolation.py), quotas and a
# flooding client (test_daemon_sessions.py)
@pytest.mark.slow
def test_eight_clients_mixed_load(tmp_path: Path) -> None:
    # raw addresses 0..256M (the device's top half), the store below them
    args = ["--target", str(tmp_path / "t0.img"), "--create", "--capacity", "512M",
            "--dram", "64M", "--slot-size", "1M", "--backend", "pread",
            "--raw", "256M"]  # fmt: skip
    with DaemonProcess(args, tmp_path / "chm.sock") as d:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CLIENT, d.socket, str(seed), str(SECONDS)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for seed in range(CLIENTS)
        ]
        results = []
        for p in procs:
            out, err = p.communicate(timeout=SECONDS + 120)
            assert p.returncode == 0, err
            results.append(json.loads(out))
        with chm.connect(d.socket) as dev:
            for _ in range(500):
                s = dev.daemon_stats()
                if s["held"]["clients"] == 1:
                    break
                time.sleep(0.02)
            assert s["held"] == {"clients": 1, "handles": 0, "pins": 0}
            assert s["device"]["slots_held"] == 0
            assert s["device"]["queue_len"] == 0
            assert s["kv"]["segments_pinned"] == 0
        total = {k: sum(r[k] for r in results) for k in results[0]}
        print(f"8 clients x {SECONDS:.0f} s: {total}", file=sys.stderr)
        assert total["wrong"] == 0
        assert total["put"] and total["load"] and total["loaded"] and total["prefetch"]
        assert not [e for e in d.events() if e.get("level") == "error"]
