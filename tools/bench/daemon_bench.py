#!/usr/bin/env python3
"""The daemon's data path next to the embedded device, in one run.

(a) zero-copy staged read bandwidth: a sliding window of 16 objects of 4 MiB
    in flight, each waited, copied out of device DRAM into a destination
    buffer and released; through ``chm.connect()`` (views into the read-only
    shared pool; the window moves 8 objects per batched round trip) and
    through an embedded ``chm.Device`` (the same window, call for call, one
    object per call) with the same
    DRAM kind (memfd), on identical backing files, alternating for N
    repetitions; the ratio of the medians is the headline (target >= 0.9).
    An embedded device on an anonymous pool (THP where the host allows it;
    shmem THP is often off) is measured alongside for reference;
(b) the request path: one round trip that changes nothing (``ping()``,
    median) back to back, a client in a request loop as the loads below
    are (target <= 50 us), and between the batches below, after the
    client's embedded batch kept both CPUs busy and the daemon's thread
    slept (reported, not judged: it is the host's wake-up cost, about
    40 us each way on a VM whose idle vCPUs halt at once, docs/daemon.md,
    "Request path performance"), and a 32-object batched prefetch + wait +
    release of 4 KiB staged objects through the daemon, alternating with
    the same batch on the embedded device: median and p99, and the round
    trips the client counted for it (target <= 2; ``prefetch_many(wait=True)``
    alongside); the daemon's CPU seconds (``/proc/<pid>/stat``) per 1000
    requests over these runs, its polling counters, and its CPU over 1 s
    with the client connected and idle (``--poll-us N`` starts the daemon
    with that poll cap instead of its default);
(c) 4 client processes loading disjoint objects at once vs 1 client alone:
    aggregate bandwidth ratio (target >= 0.9).

    python tools/bench/daemon_bench.py --quick
    python tools/bench/daemon_bench.py --json results/daemon_bench.json

The verdict lines are printed last; the exit status is 1 on a missed target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _benchlib import Verdicts, fmt_bw, loadavg, median, ratio, table

import chm
from chm.testing.daemon_proc import DaemonProcess

OBJ = 4 << 20
WINDOW = 8

_CLIENT = """
import sys, time, numpy as np, chm
sock, first, count, obj, window = sys.argv[1], *map(int, sys.argv[2:6])
dev = chm.connect(sock)
dst = np.empty(obj, np.uint8)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
t0 = time.perf_counter()
for i in range(first, first + count, window):
    js = range(i, min(i + window, first + count))
    hs = dev.prefetch_many([j * obj for j in js], [obj] * len(js))
    for v in dev.wait_many(hs, 30.0):
        dst[:] = np.frombuffer(v, np.uint8)
    dev.release_many(hs)
t1 = time.perf_counter()
print(t0, t1, count * obj)
"""


def _fill(path: Path, n: int) -> None:
    rng = np.random.default_rng(7)
    with path.open("wb") as f:
        for _ in range(n):
            f.write(rng.integers(0, 256, OBJ, dtype=np.uint8).tobytes())
        f.flush()
        os.fsync(f.fileno())


def _device_opts(n: int) -> dict[str, Any]:
    # 32 slots: the round-trip batch fits; the write buffer is left small
    return {
        "capacity": n * OBJ,
        "dram": 34 * OBJ + (16 << 20),
        "slots": 32,
        "wbuf": 16 << 20,
        "slot_size": OBJ,
        "stripe_unit": "1M",
    }


def _embedded_pass(dev: chm.Device, n: int, dst: np.ndarray[Any, Any]) -> float:
    """The window of _remote_pass, call for call, on the embedded device."""
    t0 = time.perf_counter()
    hs = [dev.prefetch(j * OBJ, OBJ) for j in range(min(2 * WINDOW, n))]
    nxt = len(hs)
    while hs:
        group, hs = hs[:WINDOW], hs[WINDOW:]
        for h in group:
            dst[:] = np.frombuffer(h.wait(30.0), np.uint8)
        for h in group:
            h.release()
        more = range(nxt, min(nxt + WINDOW, n))
        nxt += len(more)
        hs += [dev.prefetch(j * OBJ, OBJ) for j in more]
    return n * OBJ / (time.perf_counter() - t0)


def _remote_pass(dev: chm.remote.RemoteDevice, n: int, dst: np.ndarray[Any, Any]) -> float:
    """The same window, moved WINDOW objects per step: wait the oldest
    WINDOW, copy them out of the shared pool, then release them and issue
    the next in one request (``prefetch_many(release=...)``)."""
    t0 = time.perf_counter()
    first = [j * OBJ for j in range(min(2 * WINDOW, n))]
    hs = _issued(dev.prefetch_many(first, [OBJ] * len(first)))
    nxt = len(hs)
    while hs:
        group, hs = hs[:WINDOW], hs[WINDOW:]
        for v in dev.wait_many(group, 30.0):
            dst[:] = np.frombuffer(v, np.uint8)
        del v
        more = [j * OBJ for j in range(nxt, min(nxt + WINDOW, n))]
        nxt += len(more)
        if more:
            hs += _issued(dev.prefetch_many(more, [OBJ] * len(more), release=group))
        else:
            dev.release_many(group)
    return n * OBJ / (time.perf_counter() - t0)


def _issued(out: list[Any]) -> list[Any]:
    """The handles of a batch that must issue every element (else its error)."""
    for h in out:
        if isinstance(h, Exception):
            raise h
    return out


def _batch(dev: Any, mode: str) -> float:
    """Seconds of one 32 x 4 KiB prefetch + wait + release: ``batched``
    through the daemon (prefetch_many, wait_many, release_many), ``staged``
    the same with prefetch_many(wait=True), ``embedded`` call by call."""
    ranges = [(j * OBJ, 4096) for j in range(32)]
    addrs, lens = [a for a, _ in ranges], [n for _, n in ranges]
    t0 = time.perf_counter()
    if mode == "embedded":
        hs = [dev.prefetch(a, n) for a, n in ranges]
        for h in hs:
            h.wait(30.0)
        for h in hs:
            h.release()
    else:
        hs = _issued(dev.prefetch_many(addrs, lens, wait=mode == "staged", timeout=30.0))
        dev.wait_many(hs, 30.0)
        dev.release_many(hs)
    return time.perf_counter() - t0


def _rtt(rem: Any, emb: Any, iters: int) -> dict[str, list[float]]:
    """The batch through the daemon (both forms) and embedded, alternating,
    and the daemon's bare round trip; the round trips counted per batch."""
    out: dict[str, list[float]] = {"ping": [], "batched": [], "staged": [], "embedded": []}
    trips: dict[str, list[float]] = {"batched": [], "staged": []}
    for _ in range(iters):
        out["ping"].append(rem.ping())
        for mode in ("batched", "staged"):
            n0 = rem.round_trips
            out[mode].append(_batch(rem, mode))
            trips[mode].append(rem.round_trips - n0)
        out["embedded"].append(_batch(emb, "embedded"))
    out["ping_burst"] = [rem.ping() for _ in range(10 * iters)]  # the daemon's thread kept awake
    return {**out, "trips_batched": trips["batched"], "trips_staged": trips["staged"]}


def _cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _requests(rem: Any) -> int:
    """The requests a client has sent, answered or not."""
    return int(rem.round_trips + rem.quiet_sent)


def _clients(sock: str, k: int, n: int) -> float:
    """Aggregate bandwidth of k client processes loading disjoint objects."""
    per = n // k
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLIENT, sock, str(c * per), str(per), str(OBJ), str(WINDOW)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in range(k)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    rows = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode:
            raise RuntimeError(f"client exited with {p.returncode}")
        t0, t1, b = out.split()
        rows.append((float(t0), float(t1), int(b)))
    start = min(r[0] for r in rows)
    end = max(r[1] for r in rows)
    return sum(r[2] for r in rows) / (end - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=128, help="4 MiB objects per pass")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rtt-iters", type=int, default=400)
    ap.add_argument("--backend", default="auto", choices=["auto", "uring", "pread"])
    ap.add_argument(
        "--poll-us",
        type=int,
        help="the daemon's --poll-us (default: the daemon's default)",
    )
    ap.add_argument("--quick", action="store_true", help="64 objects, 3 reps, 100 round trips")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--target-ratio", type=float, default=0.9)
    ap.add_argument("--target-clients", type=float, default=0.9)
    ap.add_argument("--target-rtt-us", type=float, default=50.0)
    ap.add_argument("--target-trips", type=float, default=2)
    a = ap.parse_args()
    if a.quick:
        a.objects, a.reps, a.rtt_iters = 64, 3, 100
    n = a.objects - a.objects % 4
    v = Verdicts("daemon_bench", quick=a.quick)
    load0 = loadavg()
    tmp = Path(tempfile.mkdtemp(prefix="chm-daemon-bench-"))
    try:
        emb_file, srv_file = tmp / "embedded.img", tmp / "served.img"
        _fill(emb_file, n)
        _fill(srv_file, n)  # same seed: the same objects
        anon_file = tmp / "anon.img"
        _fill(anon_file, n)
        opts = _device_opts(n)
        args = ["--target", str(srv_file), "--backend", a.backend, "--no-kv"]
        args += ["--capacity", str(opts["capacity"]), "--dram", str(opts["dram"])]
        args += ["--slot-size", str(OBJ), "--config", str(tmp / "serve.toml")]
        if a.poll_us is not None:
            args += ["--poll-us", str(a.poll_us)]
        (tmp / "serve.toml").write_text(
            f'[device]\nwbuf = {opts["wbuf"]}\nslots = 32\nstripe_unit = "1M"\n'
        )
        with DaemonProcess(args, tmp / "chm.sock") as d:
            # the same DRAM kind as the daemon's (memfd), so the ratio is the
            # daemon's cost; an anonymous pool (THP where allowed) for reference
            emb = chm.Device.open(targets=[emb_file], backend=a.backend, pool="memfd", **opts)
            anon = chm.Device.open(targets=[anon_file], backend=a.backend, pool="anon", **opts)
            rem = chm.connect(d.socket)
            dst = np.empty(OBJ, np.uint8)
            _embedded_pass(emb, n, dst)  # warm all (page cache, pool pages)
            _embedded_pass(anon, n, dst)
            _remote_pass(rem, n, dst)
            e_bw, r_bw, a_bw = [], [], []
            for _ in range(a.reps):
                e_bw.append(_embedded_pass(emb, n, dst))
                r_bw.append(_remote_pass(rem, n, dst))
                a_bw.append(_embedded_pass(anon, n, dst))
            anon.close()
            for _ in range(10):  # warm both paths
                _rtt(rem, emb, 1)
            c0, r0, t0 = _cpu_s(d.pid), _requests(rem), time.perf_counter()
            rt = _rtt(rem, emb, a.rtt_iters)
            # the daemon's CPU per request over the alternating runs (its
            # polling included), and over 1 s with the client connected, idle
            cpu_req = (_cpu_s(d.pid) - c0) / (_requests(rem) - r0)
            busy_s = time.perf_counter() - t0
            time.sleep(0.1)
            c0 = _cpu_s(d.pid)
            time.sleep(1.0)
            cpu_idle = _cpu_s(d.pid) - c0
            polls = rem.daemon_stats()["daemon"]
            rem.close()
            emb.close()
            one, four = [], []
            for _ in range(max(1, a.reps // 2)):
                one.append(_clients(d.socket, 1, n))
                four.append(_clients(d.socket, 4, n))
        bw_ratio = ratio(median(r_bw), median(e_bw))
        cl_ratio = ratio(median(four), median(one))
        q = np.quantile
        table(
            "staged read bandwidth (16 x 4 MiB in flight, copied out)",
            ["path", "median", "min", "max"],
            [
                [
                    "embedded, memfd pool",
                    fmt_bw(median(e_bw)),
                    fmt_bw(min(e_bw)),
                    fmt_bw(max(e_bw)),
                ],
                ["embedded, anon pool", fmt_bw(median(a_bw)), fmt_bw(min(a_bw)), fmt_bw(max(a_bw))],
                ["daemon chm.connect", fmt_bw(median(r_bw)), fmt_bw(min(r_bw)), fmt_bw(max(r_bw))],
                ["1 client process", fmt_bw(median(one)), fmt_bw(min(one)), fmt_bw(max(one))],
                ["4 client processes", fmt_bw(median(four)), fmt_bw(min(four)), fmt_bw(max(four))],
            ],
        )
        trips = max(rt["trips_batched"])
        trips_staged = max(rt["trips_staged"])
        table(
            f"request path ({a.rtt_iters} alternating runs; load average "
            f"{' '.join(load0)} before, {' '.join(loadavg())} after)",
            ["path", "round trips", "median", "p99"],
            [
                ["daemon, ping() between batches", "1",
                 f"{q(rt['ping'], 0.5) * 1e6:.1f} us", f"{q(rt['ping'], 0.99) * 1e6:.1f} us"],
                ["daemon, ping() back to back", "1",
                 f"{q(rt['ping_burst'], 0.5) * 1e6:.1f} us",
                 f"{q(rt['ping_burst'], 0.99) * 1e6:.1f} us"],
                ["32 x 4 KiB, daemon, prefetch/wait/release_many", f"{trips:g}",
                 f"{q(rt['batched'], 0.5) * 1e6:.0f} us", f"{q(rt['batched'], 0.99) * 1e6:.0f} us"],
                ["32 x 4 KiB, daemon, prefetch_many(wait=True)", f"{trips_staged:g}",
                 f"{q(rt['staged'], 0.5) * 1e6:.0f} us", f"{q(rt['staged'], 0.99) * 1e6:.0f} us"],
                ["32 x 4 KiB, embedded, per object", "-",
                 f"{q(rt['embedded'], 0.5) * 1e6:.0f} us",
                 f"{q(rt['embedded'], 0.99) * 1e6:.0f} us"],
            ],
        )  # fmt: skip
        table(
            f"daemon CPU (poll_us {'default' if a.poll_us is None else a.poll_us}; "
            f"the runs above took "
            f"{busy_s:.1f} s)",
            ["what", "figure"],
            [
                ["CPU s per 1000 requests, the runs above", f"{cpu_req * 1000:.3f} s"],
                ["CPU s over 1 s, client connected and idle", f"{cpu_idle:.3f} s"],
                ["requests found by polling / polls missed",
                 f"{polls.get('poll_hits', '-')} / {polls.get('poll_misses', '-')}"],
                ["time spent polling, all runs", f"{polls.get('poll_ns', 0) / 1e9:.2f} s"],
            ],
        )  # fmt: skip
        rtt_us = float(q(rt["ping_burst"], 0.5)) * 1e6
        v.check(
            "daemon round trip in a request loop (back to back), median (us)",
            rtt_us,
            a.target_rtt_us,
            higher=False,
            fmt=lambda x: f"{x:.1f} us",
            speed=True,
        )
        v.check(
            "round trips of a 32-object prefetch + wait + release",
            trips,
            a.target_trips,
            higher=False,
            fmt=lambda x: f"{x:g}",
        )
        v.check("daemon / embedded staged read bandwidth", bw_ratio, a.target_ratio)
        v.check("4 clients / 1 client aggregate bandwidth", cl_ratio, a.target_clients)
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(
                json.dumps(
                    {
                        "embedded_bps": e_bw,
                        "embedded_anon_bps": a_bw,
                        "daemon_bps": r_bw,
                        "one_client_bps": one,
                        "four_clients_bps": four,
                        "ping_s": {"median": q(rt["ping"], 0.5), "p99": q(rt["ping"], 0.99)},
                        "ping_burst_s": {
                            "median": q(rt["ping_burst"], 0.5),
                            "p99": q(rt["ping_burst"], 0.99),
                        },
                        "batch_daemon_s": {
                            "median": q(rt["batched"], 0.5),
                            "p99": q(rt["batched"], 0.99),
                            "round_trips": trips,
                        },
                        "batch_daemon_staged_s": {
                            "median": q(rt["staged"], 0.5),
                            "p99": q(rt["staged"], 0.99),
                            "round_trips": trips_staged,
                        },
                        "batch_embedded_s": {
                            "median": q(rt["embedded"], 0.5),
                            "p99": q(rt["embedded"], 0.99),
                        },
                        "daemon_cpu_s_per_request": cpu_req,
                        "daemon_cpu_s_idle_1s": cpu_idle,
                        "daemon_polls": {
                            k: polls.get(k) for k in ("poll_hits", "poll_misses", "poll_ns")
                        },
                        "loadavg": [load0, loadavg()],
                        "verdicts": v.to_dict(),
                    },
                    indent=2,
                )
            )
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
