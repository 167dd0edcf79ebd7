#!/usr/bin/env python3
"""Resident blocks: warm retrieve against the page cache, cold retrieve
against today's prefetch mode, and prefix loads in virtual time.

Multi-turn workload (real time, every byte verified by its xxh3 checksum):
``--users`` users x ``--turns`` turns, each turn adds ``--blocks`` blocks
of the block size and re-reads the user's whole history. Three tiers read
it side by side, in alternating repetitions:

- ``prefetch``: a chm Store on a prefetch-mode device as it is today (no
  resident region; ``--window`` of staging DRAM);
- ``resident``: the same, plus a resident region big enough for the data
  (apart from the window, so the window is the same) and the Store's
  default admission (:mod:`chm.kv.residency`);
- ``page cache``: one plain file, ``preadv`` into the same buffers.

A repetition is a cold pass (a freshly opened device; the file dropped from
the page cache) and then a warm pass (the same again). Retrieve GB/s is the
bytes loaded over the time spent in the load calls. Targets: resident warm
>= 0.8x the page cache's warm, resident cold >= 0.95x prefetch cold.

Virtual time (ghost backend, fpga-cxlhm timing): a trace whose requests
all open with one shared system-prompt block, then private blocks; the
prefix-load time (the system block) with and without residency. And the
admission choice: the three policies and none on a mixed workload (shared
system prompt, multi-turn users, a one-hit-wonder stream of twice the DRAM).

    python tools/bench/resident_bench.py --quick
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np
import xxhash

import chm
from chm.kv import Store
from chm.kv import residency as R
from chm.sizes import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

MiB = 1 << 20
WBUF = 32 * MiB
_hash = xxhash.xxh3_64_intdigest


def stride(block: int) -> int:
    return (block + 4095) // 4096 * 4096 + 8192


def block_data(key: int, block: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(key).integers(0, 256, block, dtype=np.uint8)


class Workload:
    """Keys of each user's turns; ``history(u, t)`` is what turn t re-reads."""

    def __init__(self, users: int, turns: int, blocks: int) -> None:
        self.users, self.turns, self.blocks = users, turns, blocks
        self.keys = [
            [[(u * turns + t) * blocks + b for b in range(blocks)] for t in range(turns)]
            for u in range(users)
        ]

    def all_keys(self) -> list[int]:
        return [k for u in self.keys for t in u for k in t]

    def history(self, u: int, t: int) -> list[int]:
        return [k for turn in self.keys[u][: t + 1] for k in turn]


class StoreTier:
    def __init__(self, root: Path, name: str, block: int, window: int, resident: int, backend: str):
        self.root = root / name
        self.block, self.window, self.resident, self.backend = block, window, resident, backend
        self.store: Store | None = None

    def open(self) -> None:
        opts: dict[str, Any] = {"wbuf": WBUF}
        if self.resident:
            opts["resident"] = self.resident
        self.store = Store.open(
            self.root,
            capacity=max(1 << 30, 4 * self.resident),
            backend=self.backend,
            dram=self.window + WBUF + self.resident,
            slot_size=self.block,
            device_options=opts,
        )

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def fill(self, keys: list[int]) -> None:
        self.open()
        assert self.store is not None
        for k in keys:
            st = self.store.put([k], [block_data(k, self.block)])
            if st[0] != st[0].STORED:
                raise SystemExit(f"put of block {k} was {st[0].name}")
            self.store.flush()
        self.close()

    def load(self, keys: list[int], dsts: list[np.ndarray[Any, Any]]) -> int:
        assert self.store is not None
        n = self.store.load_prefix(keys, dsts[: len(keys)])
        if n != len(keys):
            raise SystemExit(f"{self.root.name}: loaded {n} of {len(keys)} blocks")
        return n


class FileTier:
    def __init__(self, root: Path, block: int) -> None:
        self.path = root / "blocks.bin"
        self.block = block
        self.sums: dict[int, int] = {}
        self.fd = -1

    def fill(self, keys: list[int]) -> None:
        with open(self.path, "wb") as f:
            for k in keys:
                b = block_data(k, self.block)
                self.sums[k] = _hash(b.data)
                f.seek(k * self.block)
                f.write(b.tobytes())
            f.flush()
            os.fsync(f.fileno())

    def open(self) -> None:
        self.fd = os.open(self.path, os.O_RDONLY)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def drop_cache(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def load(self, keys: list[int], dsts: list[np.ndarray[Any, Any]]) -> int:
        for k, d in zip(keys, dsts, strict=False):
            m = d.data
            if os.preadv(self.fd, [m], k * self.block) != self.block or _hash(m) != self.sums[k]:
                raise SystemExit(f"page cache: block {k} read short or wrong")
        return len(keys)


def one_pass(
    wl: Workload, load: Callable[[list[int], list[np.ndarray[Any, Any]]], int], dsts: list[Any]
) -> tuple[int, float]:
    """Every user's turns in order, re-reading the history; (bytes, seconds)."""
    nbytes, secs = 0, 0.0
    block = dsts[0].size
    for t in range(wl.turns):
        for u in range(wl.users):
            keys = wl.history(u, t)
            t0 = time.perf_counter()
            n = load(keys, dsts)
            secs += time.perf_counter() - t0
            nbytes += n * block
    return nbytes, secs


def multi_turn(
    root: Path, block: int, wl: Workload, window: int, reps: int, backend: str
) -> dict[str, dict[str, bl.Series]]:
    keys = wl.all_keys()
    data = len(keys) * stride(block)
    tiers: dict[str, Any] = {
        "prefetch": StoreTier(root, "prefetch", block, window, 0, backend),
        "resident": StoreTier(root, "resident", block, window, data, backend),
        "page cache": FileTier(root, block),
    }
    for t in tiers.values():
        t.fill(keys)
    dsts = [np.zeros(block, np.uint8) for _ in range(wl.turns * wl.blocks)]
    out = {
        name: {p: bl.Series(f"{name} {p} {block // MiB} MiB", "GB/s") for p in ("cold", "warm")}
        for name in tiers
    }
    names = list(tiers)
    for rep in range(reps):
        for name in bl.rotate(names, rep):
            tier = tiers[name]
            if isinstance(tier, FileTier):
                tier.drop_cache()
            tier.open()
            try:
                for phase in ("cold", "warm"):
                    nbytes, secs = one_pass(wl, tier.load, dsts)
                    out[name][phase].add(nbytes / secs / 1e9)
            finally:
                tier.close()
    return out


# ---- virtual time


def _virtual(window_slots: int, block: int, resident: int) -> chm.Device:
    return chm.Device.open(
        backend="ghost",
        clock="virtual",
        capacity="1T",
        mode="prefetch",
        dram=window_slots * stride(block) + resident + WBUF,
        wbuf=WBUF,
        slot_size=block,
        timing="fpga-cxlhm",
        resident=resident,
    )


def prefix_trace(requests: int, private: int, block: int, resident: bool) -> tuple[float, float]:
    """Requests that each open with the shared system-prompt block, then
    ``private`` blocks of their own; (median prefix-load ns, total ns)."""
    dev = _virtual(8, block, 8 * stride(block) if resident else 0)
    try:
        adm = R.make_admission(R.DEFAULT, dev.stats().resident_entries_total) if resident else None
        nxt = block
        prefix = []
        t_start = dev.stats().clock_now_ns
        for _ in range(requests):
            t0 = dev.stats().clock_now_ns
            R.load_blocks(dev, [(0, block)], adm, 8)
            prefix.append(dev.stats().clock_now_ns - t0)
            R.load_blocks(dev, [(nxt + i * block, block) for i in range(private)], adm, 8)
            nxt += private * block
        return bl.median(prefix), dev.stats().clock_now_ns - t_start
    finally:
        dev.close()


def policies(block: int, entries: int) -> list[tuple[str, int, int, int, float]]:
    """(policy, resident hits, retained, evictions, virtual s) on a mixed
    workload: 8 users x 6 turns (one new block a turn, the history re-read,
    all opening with one shared system-prompt block), and after each
    request 2 one-hit blocks (the stream is twice the DRAM in all)."""
    rows = []
    for name in (None, *R.POLICIES):
        dev = _virtual(8, block, entries * stride(block))
        try:
            adm = R.make_admission(name, entries) if name else None
            fresh = iter(range(1, 1 << 30))

            def new(fresh: Any = fresh) -> tuple[int, int]:
                return (next(fresh) * block, block)

            hist: list[list[tuple[int, int]]] = [[] for _ in range(8)]
            t0 = dev.stats().clock_now_ns
            for _turn in range(6):
                for h in hist:
                    h.append(new())
                    R.load_blocks(dev, [(0, block), *h], adm, 8)
                    R.load_blocks(dev, [new(), new()], adm, 8)
            s = dev.stats()
            rows.append(
                (
                    name or "none",
                    s.resident_hits,
                    s.resident_retained,
                    s.resident_evictions,
                    (s.clock_now_ns - t0) / 1e9,
                )
            )
        finally:
            dev.close()
    return rows


@click.command()
@click.option("--users", default=2, show_default=True)
@click.option("--turns", default=4, show_default=True)
@click.option("--blocks", default=4, show_default=True, help="new blocks per turn")
@click.option("--sizes", default="4,16", show_default=True, help="block sizes, MiB")
@click.option("--window", default="128M", show_default=True, help="staging window of chm")
@click.option("--reps", default=3, show_default=True)
@click.option("--backend", default="uring", show_default=True, help="uring or pread")
@click.option("--dir", "where", default=None, help="backing directory (default: a temp dir)")
@click.option("--quick", is_flag=True, help="smoke test: 1 user, 2 turns, 1 repetition")
@click.option("--json", "json_path", default=None)
def main(
    users: int,
    turns: int,
    blocks: int,
    sizes: str,
    window: str,
    reps: int,
    backend: str,
    where: str | None,
    quick: bool,
    json_path: str | None,
) -> None:
    if quick:
        users, turns, blocks, reps, sizes = 1, 2, 2, 1, "4"
    win = parse_size(window)
    verd = bl.Verdicts("resident_bench", quick=quick)
    results: dict[str, Any] = {"environment": bl.environment()}
    wl = Workload(users, turns, blocks)
    with contextlib.ExitStack() as stack:
        root = Path(where) if where else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for mib in (int(x) for x in sizes.split(",")):
            block = mib * MiB
            sub = root / f"b{mib}"
            sub.mkdir(parents=True, exist_ok=True)
            out = multi_turn(sub, block, wl, win, reps, backend)
            bl.table(
                f"retrieve GB/s, {users} users x {turns} turns x {blocks} blocks of {mib} MiB "
                f"(history re-read each turn), median of {reps} alternating repetitions",
                ["tier", "cold", "warm", "cold min..max", "warm min..max"],
                [
                    (
                        name,
                        f"{s['cold'].median:.2f}",
                        f"{s['warm'].median:.2f}",
                        "{:.2f}..{:.2f}".format(*bl.spread(s["cold"].values)),
                        "{:.2f}..{:.2f}".format(*bl.spread(s["warm"].values)),
                    )
                    for name, s in out.items()
                ],
            )
            warm = bl.ratio(out["resident"]["warm"].median, out["page cache"]["warm"].median)
            cold = bl.ratio(out["resident"]["cold"].median, out["prefetch"]["cold"].median)
            today_warm = bl.ratio(out["prefetch"]["warm"].median, out["page cache"]["warm"].median)
            bl.console.print(
                f"  {mib} MiB: resident warm / page cache warm {bl.fmt_ratio(warm)} "
                f"(prefetch mode today: {bl.fmt_ratio(today_warm)}); "
                f"resident cold / prefetch cold {bl.fmt_ratio(cold)}"
            )
            results[f"{mib}MiB"] = {
                n: {p: x.to_dict() for p, x in s.items()} for n, s in out.items()
            }
            verd.check(f"{mib} MiB warm retrieve, resident / page cache", warm, 0.8, speed=True)
            verd.check(f"{mib} MiB cold retrieve, resident / prefetch", cold, 0.95, speed=True)

    block = 16 * MiB
    p_off, t_off = prefix_trace(200, 3, block, False)
    p_on, t_on = prefix_trace(200, 3, block, True)
    bl.table(
        "virtual time: 200 requests opening with one shared 16 MiB system-prompt block, "
        "3 private blocks each (fpga-cxlhm timing)",
        ["residency", "median prefix load", "whole trace"],
        [
            ("off", f"{p_off / 1e3:.1f} us", f"{t_off / 1e6:.2f} ms"),
            ("on", f"{p_on / 1e3:.1f} us", f"{t_on / 1e6:.2f} ms"),
        ],
    )
    results["prefix_trace"] = {"off_ns": p_off, "on_ns": p_on, "total_off": t_off, "total_on": t_on}
    rows = policies(block, 32)
    bl.table(
        "admission policies, virtual time: 32 resident entries of 16 MiB, 8 users x 6 turns "
        "with a shared system prompt, 2 one-hit blocks after each request",
        ["policy", "resident hits", "retained", "evictions", "virtual s"],
        [(n, h, r, e, f"{s:.4f}") for n, h, r, e, s in rows],
    )
    results["policies"] = rows
    bl.write_json(json_path, results)
    verd.check("prefix load with / without residency", bl.ratio(p_on, p_off), 1.0, higher=False)
    best = max(h for _, h, _, _, _ in rows)
    chosen = next(h for n, h, _, _, _ in rows if n == R.DEFAULT)
    verd.check(f"default admission ({R.DEFAULT}) hits / best policy's", chosen / best, 1.0)
    sys.exit(verd.finish())


if __name__ == "__main__":
    main()
