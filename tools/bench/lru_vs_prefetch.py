#!/usr/bin/env python3
"""The paper's LRU failure (Fig. 5) and write isolation (section 3.3), in one run.

(a) Multi-turn one-hit-wonder reads. Turn t re-reads the whole prefix of
    n_t = prefix + t * growth KV blocks in order, then appends `growth` new
    blocks. The device DRAM is smaller than one turn's footprint. Readers:
      prefetch/view  prefetch mode; a window of W = min(128 MB / S_block, N)
                     prefetches in flight; each block is copied out of its
                     view into a host buffer, then released
      prefetch/read  the same, but each block is read with dev.read_into()
                     after its wait (a DRAM hit; the timing model charges the
                     host transfer for it, which it does not for views)
      lru            lru mode, same DRAM, dev.read_into() block by block
      lru+hints      lru mode, prefetch hints W blocks ahead, dev.read_into()
      direct         no DRAM: every read goes to the SSD
    Each reader runs under each clock (--clocks): `real` (io_uring on a file
    of real data, no timing model: this machine's disk) and `virtual` (ghost
    backend, simulated clock, timing preset --timing). Effective read
    bandwidth = bytes read / time spent in the read phases.
(b) The same readers (prefetch/view, lru) scanning a prefix larger than DRAM,
    alone and then with a thread appending 16 MiB blocks via dev.write() as
    fast as it can. Prefetch mode should keep >= 0.9x its read-only bandwidth
    (the write buffer skips rather than stalls: the skip rate is printed); lru
    mode's read bandwidth drops.
(c) A virtual-time replay of multi-turn traffic on a 2 TB ghost device with
    64 GB of DRAM (or the largest DRAM that opens here): wall time next to
    simulated time.

    python tools/bench/lru_vs_prefetch.py --quick
    python tools/bench/lru_vs_prefetch.py --json results/lru_vs_prefetch.json

The verdict lines are printed last; the exit status is 1 when a target was
missed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np

import chm
from chm.kv.window import SlidingWindow, w_max

# _benchlib.py sits next to this file, which is on sys.path when the script is
# run as a file; `python -m tools.bench.lru_vs_prefetch` puts the repository there instead.
if __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

TARGET_LRU_RATIO = 1.35
TARGET_WRITE_KEEP = 0.9
DEFAULT_FILE = "/var/tmp/chm-bench-lru.img"
VERDICTS = bl.Verdicts("lru_vs_prefetch")  # every target this run checks


# ---------------------------------------------------------------- clocks


@dataclass(frozen=True)
class Clock:
    name: str
    desc: str
    dev: dict[str, Any]
    needs_file: bool
    virtual: bool
    appends: bool = True


def make_clocks(preset: str) -> dict[str, Clock]:
    return {
        "real": Clock(
            "real",
            "io_uring backend on a file of real data, no timing model (this machine's disk)",
            {"backend": "uring"},
            True,
            False,
        ),
        "virtual": Clock(
            "virtual",
            f"ghost backend, clock=virtual, timing={preset} (simulated time; no data moves)",
            {"backend": "ghost", "clock": "virtual", "timing": preset},
            False,
            True,
        ),
        "virtual-ro": Clock(
            "virtual-ro",
            f"as 'virtual' (timing={preset}) but without the per-turn appends: reads only",
            {"backend": "ghost", "clock": "virtual", "timing": preset},
            False,
            True,
            False,
        ),
        "real+timing": Clock(
            "real+timing",
            f"io_uring on the file, timing={preset} paced in wall time (slows the host down "
            "to the model where the model is slower; cannot speed it up)",
            {"backend": "uring", "timing": preset},
            True,
            False,
        ),
        "paced": Clock(
            "paced",
            f"ghost backend, clock=real, timing={preset}: the model's speeds in wall time, "
            "no data moves",
            {"backend": "ghost", "timing": preset},
            False,
            False,
        ),
    }


class Timer:
    """Elapsed time on the clock the device runs on (wall or simulated)."""

    def __init__(self, dev: chm.Device, virtual: bool) -> None:
        self.dev = dev
        self.virtual = virtual
        self.total = 0.0
        self._t0 = 0.0

    def now(self) -> float:
        if self.virtual:
            return self.dev.stats().clock_now_ns / 1e9
        return time.perf_counter()

    def __enter__(self) -> Timer:
        self._t0 = self.now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.total += self.now() - self._t0


# ---------------------------------------------------------------- readers


def copy_out(dst: np.ndarray[Any, Any], view: memoryview) -> None:
    """Copies a staged block into the host buffer (an RDMA read's stand-in)."""
    np.copyto(dst[: len(view)], np.frombuffer(view, dtype=np.uint8))


def read_prefetch(
    dev: chm.Device,
    first: int,
    n: int,
    block: int,
    window: int,
    dst: np.ndarray[Any, Any],
    via_read: bool,
    stop: Callable[[], bool] | None = None,
) -> int:
    """Reads blocks [first, first+n) through a sliding prefetch window.

    Returns how many were read (fewer when stop() turned true)."""
    done = 0
    with SlidingWindow(dev, [(i * block, block) for i in range(first, first + n)], window) as win:
        for j, h in win:
            v = h.wait()
            if via_read:
                del v
                dev.read_into((first + j) * block, dst)
            else:
                copy_out(dst, v)
                del v
            done += 1
            if stop is not None and stop():
                break
    return done


def read_plain(
    dev: chm.Device,
    first: int,
    n: int,
    block: int,
    window: int,
    dst: np.ndarray[Any, Any],
    hints: bool,
    stop: Callable[[], bool] | None = None,
) -> int:
    """dev.read_into() block by block; with hints, prefetch calls W ahead."""
    ranges = [(i * block, block) for i in range(first, first + n)] if hints else []
    done = 0
    with SlidingWindow(dev, ranges, window) as win:
        for i in range(first, first + n):
            dev.read_into(i * block, dst)
            done += 1
            if hints:
                win.release(win.pop()[1])
            if stop is not None and stop():
                break
    return done


@dataclass(frozen=True)
class Reader:
    name: str
    mode: str
    desc: str

    def device_opts(self, block: int, dram: int, wbuf: int) -> dict[str, Any]:
        if self.mode == "prefetch":
            return {"mode": "prefetch", "dram": dram, "wbuf": wbuf, "slot_size": block}
        if self.mode == "lru":
            return {"mode": "lru", "dram": dram, "slot_size": block}
        return {"mode": "direct"}

    def read(
        self,
        dev: chm.Device,
        first: int,
        n: int,
        block: int,
        window: int,
        dst: np.ndarray[Any, Any],
        stop: Callable[[], bool] | None = None,
    ) -> int:
        if self.name == "prefetch/view":
            return read_prefetch(dev, first, n, block, window, dst, False, stop)
        if self.name == "prefetch/read":
            return read_prefetch(dev, first, n, block, window, dst, True, stop)
        return read_plain(dev, first, n, block, window, dst, self.name == "lru+hints", stop)


READERS = {
    r.name: r
    for r in (
        Reader("prefetch/view", "prefetch", "window of prefetches, copy out of the view"),
        Reader("prefetch/read", "prefetch", "window of prefetches, dev.read_into after wait"),
        Reader("lru", "lru", "dev.read_into, no hints"),
        Reader("lru+hints", "lru", "dev.read_into, prefetch hints W ahead"),
        Reader("direct", "direct", "dev.read_into, no DRAM"),
    )
}


# ---------------------------------------------------------------- (a)


def check_data(path: str, capacity: int, wl: Workload) -> None:
    """Every reader returns the file's bytes: a fast wrong answer is no answer."""
    probe = [0, (wl.prefix // 2) * wl.block]
    with open(path, "rb") as f:
        want = []
        for addr in probe:
            f.seek(addr)
            want.append(f.read(wl.block))
    dst = np.empty(wl.block, dtype=np.uint8)
    for r in READERS.values():
        opts: dict[str, Any] = {"capacity": capacity, "targets": path, "backend": "uring"}
        opts.update(r.device_opts(wl.block, wl.dram, wl.wbuf))
        with chm.Device.open(**opts) as dev:
            for addr, w in zip(probe, want, strict=True):
                i = addr // wl.block
                r.read(dev, i, 1, wl.block, 1, dst)
                if dst.tobytes() != w:
                    raise click.ClickException(f"{r.name}: bytes at {addr:#x} differ from the file")


@dataclass
class Workload:
    block: int
    prefix: int  # blocks before turn 0
    growth: int  # blocks appended per turn
    turns: int
    dram: int
    wbuf: int

    @property
    def blocks_total(self) -> int:
        return self.prefix + self.growth * self.turns

    def reads_per_run(self) -> int:
        return sum(self.prefix + self.growth * t for t in range(self.turns))


STAT_KEYS = (
    "read_hits",
    "read_misses",
    "bytes_read_ssd",
    "bytes_from_dram",
    "bytes_written_ssd",
    "prefetch_completed",
    "prefetch_queued",
    "lru_hits",
    "lru_misses",
    "lru_refills",
    "lru_dirty_evictions",
    "lru_writeback_bytes",
    "wr_admitted",
    "wr_skipped",
    "wr_flushed_bytes",
    "read_wait_flush_ns",
    "pacing_late",
    "pacing_late_ns",
)


def stat_delta(after: chm.Stats, before: chm.Stats) -> dict[str, int]:
    d = after - before
    return {k: int(getattr(d, k)) for k in STAT_KEYS}


def multi_turn(
    reader: Reader, clock: Clock, wl: Workload, path: str | None, capacity: int
) -> dict[str, Any]:
    """One run of the multi-turn pattern on a fresh device."""
    opts: dict[str, Any] = {"capacity": capacity, **clock.dev}
    opts.update(reader.device_opts(wl.block, wl.dram, wl.wbuf))
    if clock.needs_file:
        opts["targets"] = path
    dst = np.empty(wl.block, dtype=np.uint8)
    src = np.random.default_rng(1).integers(0, 256, wl.block, dtype=np.uint8)
    with chm.Device.open(**opts) as dev:
        lru_line = int(dev.config["lru_line_bytes"])
        st0 = dev.stats()
        rt = Timer(dev, clock.virtual)
        wall0 = time.perf_counter()
        sim0 = st0.clock_now_ns
        per_turn = []
        admitted = skipped = 0
        for t in range(wl.turns):
            n = wl.prefix + wl.growth * t
            window = w_max(wl.block, n)
            before = rt.total
            with rt:
                got = reader.read(dev, 0, n, wl.block, window, dst)
            assert got == n
            per_turn.append(n * wl.block / max(rt.total - before, 1e-12))
            for j in range(wl.growth if clock.appends else 0):
                if dev.write((n + j) * wl.block, src):
                    admitted += 1
                else:
                    skipped += 1
        wall = time.perf_counter() - wall0
        st1 = dev.stats()
    nbytes = wl.reads_per_run() * wl.block
    d = stat_delta(st1, st0)
    lookups = d["lru_hits"] + d["lru_misses"]
    reads = d["read_hits"] + d["read_misses"]
    return {
        "read_bw_bps": nbytes / rt.total,
        "read_seconds": rt.total,
        "bytes_read": nbytes,
        "wall_seconds": wall,
        "sim_seconds": (st1.clock_now_ns - sim0) / 1e9 if clock.virtual else None,
        "per_turn_bw_bps": per_turn,
        "writes_admitted": admitted,
        "writes_skipped": skipped,
        "lru_hit_rate": d["lru_hits"] / lookups if lookups else None,
        "dram_hit_rate": d["read_hits"] / reads if reads else None,
        "lru_refill_bytes": d["lru_refills"] * lru_line,
        "stats": d,
    }


def part_a(
    wl: Workload,
    clocks: list[Clock],
    readers: list[Reader],
    reps: int,
    path: str,
    capacity: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for clock in clocks:
        series = {r.name: bl.Series(r.name, "B/s") for r in readers}
        with bl.progress() as prog:
            task = prog.add_task(f"(a) {clock.name}", total=reps * len(readers))
            for rep in range(reps):
                for r in bl.rotate(readers, rep):
                    prog.update(task, description=f"(a) {clock.name} rep {rep + 1}: {r.name}")
                    res = multi_turn(r, clock, wl, path, capacity)
                    series[r.name].add(res.pop("read_bw_bps"), rep=rep, **res)
                    prog.advance(task)
        report_a(clock, wl, series, reps)
        out[clock.name] = summarize_a(clock, series)
    return out


def _med(series: bl.Series, key: str) -> float:
    vals = [e[key] for e in series.extra if e.get(key) is not None]
    return bl.median(vals) if vals else float("nan")


def _med_stat(series: bl.Series, key: str) -> float:
    return bl.median([e["stats"][key] for e in series.extra])


def report_a(clock: Clock, wl: Workload, series: dict[str, bl.Series], reps: int) -> None:
    rows = []
    for name, s in series.items():
        hit = _med(s, "lru_hit_rate") if name.startswith("lru") else _med(s, "dram_hit_rate")
        if name == "prefetch/view":
            staged = _med_stat(s, "prefetch_completed") / max(1, wl.reads_per_run())
            hit = staged  # every block is read from its staged view
        writes = (
            _med(s, "writes_skipped") / (wl.growth * wl.turns) if clock.appends else float("nan")
        )
        rows.append(
            [
                name,
                bl.fmt_bw(s.median),
                f"{bl.fmt_bw(min(s.values))} .. {bl.fmt_bw(max(s.values))}",
                bl.fmt_pct(hit),
                f"{_med(s, 'lru_refill_bytes') / bl.MiB:,.0f}" if name.startswith("lru") else "-",
                f"{_med_stat(s, 'lru_dirty_evictions'):,.0f}" if name.startswith("lru") else "-",
                f"{_med_stat(s, 'bytes_read_ssd') / bl.MiB:,.0f}",
                bl.fmt_pct(writes) if name.startswith("prefetch") else "-",
            ]
        )
    unit = "simulated" if clock.virtual else "wall"
    bl.console.print()
    bl.table(
        f"(a) multi-turn reads, clock '{clock.name}' ({unit} time), median of {reps} rep(s)",
        [
            "reader",
            "read bw",
            "range",
            "DRAM hits",
            "LRU refill MiB",
            "dirty evict",
            "SSD read MiB",
            "wr skipped",
        ],
        rows,
    )
    bl.console.print(f"  clock: {clock.desc}")
    pv = series.get("prefetch/view")
    pr = series.get("prefetch/read")
    for lru_name in ("lru", "lru+hints"):
        ls = series.get(lru_name)
        if ls is None:
            continue
        for p in (pv, pr):
            if p is None:
                continue
            rmed = bl.ratio(p.median, ls.median)
            paired = bl.median(bl.paired_ratios(p.values, ls.values))
            what = f"{p.name} / {lru_name}, {clock.name} clock"
            met = VERDICTS.check(what, rmed, TARGET_LRU_RATIO, speed=True)
            bl.console.print(
                f"  {p.name} / {lru_name}: {bl.fmt_ratio(rmed)} (paired {bl.fmt_ratio(paired)})"
                f" -- paper >= {TARGET_LRU_RATIO}x: [b]{met}[/b]"
            )


def summarize_a(clock: Clock, series: dict[str, bl.Series]) -> dict[str, Any]:
    out: dict[str, Any] = {"clock": clock.desc}
    out["readers"] = {n: s.to_dict() for n, s in series.items()}
    ratios: dict[str, Any] = {}
    for p in ("prefetch/view", "prefetch/read"):
        for lr in ("lru", "lru+hints"):
            if p in series and lr in series:
                r = bl.ratio(series[p].median, series[lr].median)
                ratios[f"{p} / {lr}"] = {
                    "ratio": r,
                    "paired_median": bl.median(
                        bl.paired_ratios(series[p].values, series[lr].values)
                    ),
                    "target": TARGET_LRU_RATIO,
                    "met": bool(r >= TARGET_LRU_RATIO),
                }
    out["ratios"] = ratios
    return out


# ---------------------------------------------------------------- (b)


@dataclass
class WriterStats:
    offered: int = 0
    admitted: int = 0
    skipped: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def writer_loop(
    dev: chm.Device,
    first: int,
    nblocks: int,
    block: int,
    stop: threading.Event,
    ws: WriterStats,
    rate: float,
) -> None:
    """Appends blocks round-robin over [first, first+nblocks): as fast as it
    can (rate 0), or offering `rate` blocks per second."""
    src = np.random.default_rng(2).integers(0, 256, block, dtype=np.uint8)
    i = 0
    t0 = time.perf_counter()
    try:
        while not stop.is_set():
            if rate > 0:
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0 and stop.wait(delay):
                    break
            ok = dev.write((first + i % nblocks) * block, src)
            ws.offered += 1
            if ok:
                ws.admitted += 1
            else:
                ws.skipped += 1
            i += 1
    except chm.ChmError as exc:  # e.g. the device closing under us
        ws.errors.append(str(exc))
    ws.seconds = time.perf_counter() - t0


def scan_for(
    reader: Reader,
    dev: chm.Device,
    nblocks: int,
    block: int,
    seconds: float,
    dst: np.ndarray[Any, Any],
) -> tuple[int, float]:
    """Re-reads blocks [0, nblocks) in passes for `seconds`; (blocks, elapsed)."""
    window = w_max(block, nblocks)
    t0 = time.perf_counter()
    deadline = t0 + seconds
    done = 0

    def stop() -> bool:
        return time.perf_counter() >= deadline

    while not stop():
        done += reader.read(dev, 0, nblocks, block, window, dst, stop)
    return done, time.perf_counter() - t0


def isolation_run(
    reader: Reader,
    clock: Clock,
    wl: Workload,
    nblocks: int,
    wblocks: int,
    seconds: float,
    with_writer: bool,
    path: str | None,
    capacity: int,
    rate: float,
) -> dict[str, Any]:
    opts: dict[str, Any] = {"capacity": capacity, **clock.dev}
    opts.update(reader.device_opts(wl.block, wl.dram, wl.wbuf))
    if clock.needs_file:
        opts["targets"] = path
    dst = np.empty(wl.block, dtype=np.uint8)
    ws = WriterStats()
    with chm.Device.open(**opts) as dev:
        st0 = dev.stats()
        stop = threading.Event()
        th = None
        if with_writer:
            th = threading.Thread(
                target=writer_loop,
                args=(dev, nblocks, wblocks, wl.block, stop, ws, rate),
                name="kv-writer",
                daemon=True,
            )
            th.start()
        try:
            blocks, dt = scan_for(reader, dev, nblocks, wl.block, seconds, dst)
        finally:
            stop.set()
            if th is not None:
                th.join()
        st1 = dev.stats()
    d = stat_delta(st1, st0)
    return {
        "read_bw_bps": blocks * wl.block / dt,
        "blocks_read": blocks,
        "seconds": dt,
        "writer": {
            "offered": ws.offered,
            "admitted": ws.admitted,
            "skipped": ws.skipped,
            "skip_rate": ws.skipped / ws.offered if ws.offered else None,
            "admitted_bw_bps": ws.admitted * wl.block / ws.seconds if ws.seconds else 0.0,
            "offered_per_s": ws.offered / ws.seconds if ws.seconds else 0.0,
            "errors": ws.errors,
        },
        "stats": d,
    }


def part_b(
    wl: Workload,
    clock: Clock,
    reps: int,
    seconds: float,
    nblocks: int,
    wblocks: int,
    path: str,
    capacity: int,
    rate: float,
) -> dict[str, Any]:
    readers = [READERS["prefetch/view"], READERS["lru"]]
    cases = [(r, w) for r in readers for w in (False, True)]
    series = {(r.name, w): bl.Series(f"{r.name} {'rw' if w else 'ro'}", "B/s") for r, w in cases}
    with bl.progress() as prog:
        task = prog.add_task("(b)", total=reps * len(cases))
        for rep in range(reps):
            for r, w in bl.rotate(cases, rep):
                label = "with writer" if w else "read-only"
                prog.update(task, description=f"(b) rep {rep + 1}: {r.name} {label}")
                res = isolation_run(
                    r, clock, wl, nblocks, wblocks, seconds, w, path, capacity, rate
                )
                series[(r.name, w)].add(res.pop("read_bw_bps"), rep=rep, **res)
                prog.advance(task)
    rows = []
    out: dict[str, Any] = {
        "clock": clock.desc,
        "reader_blocks": nblocks,
        "seconds": seconds,
        "writer_rate": rate or "as fast as it can",
    }
    for r in readers:
        ro, rw = series[(r.name, False)], series[(r.name, True)]
        keep = bl.ratio(rw.median, ro.median)
        paired = bl.median(bl.paired_ratios(rw.values, ro.values))
        wr = [e["writer"] for e in rw.extra]
        skip = bl.median([x["skip_rate"] for x in wr if x["skip_rate"] is not None])
        offered = bl.median([x["offered_per_s"] for x in wr])
        adm_bw = bl.median([x["admitted_bw_bps"] for x in wr])
        evict = bl.median([e["stats"]["lru_dirty_evictions"] for e in rw.extra])
        wait_flush = bl.median([e["stats"]["read_wait_flush_ns"] for e in rw.extra]) / 1e9
        is_pf = r.mode == "prefetch"
        rows.append(
            [
                r.name,
                bl.fmt_bw(ro.median),
                bl.fmt_bw(rw.median),
                f"{bl.fmt_ratio(keep)} (paired {bl.fmt_ratio(paired)})",
                f"{offered:,.0f}/s",
                bl.fmt_bw(adm_bw),
                bl.fmt_pct(skip) if is_pf else "-",
                f"{wait_flush:.2f} s" if is_pf else f"{evict:,.0f} dirty evict",
            ]
        )
        out[r.name] = {
            "read_only": ro.to_dict(),
            "with_writer": rw.to_dict(),
            "keep_ratio": keep,
            "keep_ratio_paired_median": paired,
            "write_skip_rate": skip if is_pf else None,
            "writes_offered_per_s": offered,
            "writes_admitted_bw_bps": adm_bw,
        }
    bl.console.print()
    bl.table(
        f"(b) reads with a concurrent write stream, clock '{clock.name}', {nblocks} blocks of "
        f"{wl.block // bl.MiB} MiB re-read for {seconds:g} s per phase, writer "
        f"{f'{rate:g} blocks/s' if rate else 'as fast as it can'}, median of {reps} rep(s)",
        [
            "reader",
            "read-only",
            "with writer",
            "with/without",
            "writes offered",
            "admitted",
            "skipped",
            "reads behind flush / evictions",
        ],
        rows,
    )
    pf_keep = out["prefetch/view"]["keep_ratio"]
    lru_keep = out["lru"]["keep_ratio"]
    bl.console.print(
        f"  prefetch keeps {bl.fmt_ratio(pf_keep)} of its read-only bandwidth (target >= "
        f"{TARGET_WRITE_KEEP}: [b]"
        f"{VERDICTS.check('prefetch read bw kept under writes', pf_keep, TARGET_WRITE_KEEP, speed=True)}"  # noqa: E501
        "[/b]); lru keeps "
        f"{bl.fmt_ratio(lru_keep)} ({'drops' if lru_keep < 1 else 'does not drop'})"
    )
    out["target_keep"] = TARGET_WRITE_KEEP
    out["prefetch_target_met"] = bool(pf_keep >= TARGET_WRITE_KEEP)
    return out


# ---------------------------------------------------------------- (c)


def open_largest(opts: dict[str, Any], dram: int, floor: int) -> tuple[chm.Device, int, list[str]]:
    """Opens with dram, halving on ENOMEM down to floor; returns notes on what failed."""
    notes: list[str] = []
    d = dram
    while True:
        try:
            return chm.Device.open(dram=d, **opts), d, notes
        except chm.ChmError as exc:
            notes.append(f"dram={chm.format_size(d)}: {exc}")
            if d // 2 < floor:
                raise
            d //= 2


def replay(
    dev: chm.Device, block: int, users: int, turns: int, prefix: int, growth: int, appends: bool
) -> dict[str, Any]:
    """Multi-turn traffic: each turn, each user's request reads its whole
    prefix through a W_max window, then appends `growth` blocks."""
    region = prefix + growth * turns  # blocks per user
    src = np.zeros(block, dtype=np.uint8)
    per_turn = []
    reads = writes_ok = writes_skip = 0
    st0 = dev.stats()
    wall0 = time.perf_counter()
    with bl.progress() as prog:
        task = prog.add_task(f"(c) replay{'' if appends else ', reads only'}", total=turns)
        for t in range(turns):
            s_t = dev.stats().clock_now_ns
            w_t = time.perf_counter()
            n = prefix + growth * t
            window = w_max(block, n)
            for u in range(users):
                base = u * region
                ranges = [((base + i) * block, block) for i in range(n)]
                with SlidingWindow(dev, ranges, window) as win:
                    for _, h in win:
                        h.wait()
                reads += n
                for j in range(growth if appends else 0):
                    if dev.write((base + n + j) * block, src):
                        writes_ok += 1
                    else:
                        writes_skip += 1
            sim = (dev.stats().clock_now_ns - s_t) / 1e9
            per_turn.append(
                {
                    "turn": t,
                    "footprint_bytes": users * n * block,
                    "bytes_read": users * n * block,
                    "sim_seconds": sim,
                    "wall_seconds": time.perf_counter() - w_t,
                    "sim_read_bw_bps": users * n * block / sim if sim else float("nan"),
                }
            )
            prog.advance(task)
    wall = time.perf_counter() - wall0
    st1 = dev.stats()
    sim_total = (st1.clock_now_ns - st0.clock_now_ns) / 1e9
    d = st1 - st0
    return {
        "appends": appends,
        "bytes_read": reads * block,
        "sim_seconds": sim_total,
        "wall_seconds": wall,
        "sim_read_bw_bps": reads * block / sim_total if sim_total else None,
        "writes_admitted": writes_ok,
        "writes_skipped": writes_skip,
        "per_turn": per_turn,
        "stats_delta": {k: int(getattr(d, k)) for k in STAT_KEYS},
    }


def part_c(
    capacity: int,
    dram: int,
    block: int,
    users: int,
    turns: int,
    prefix: int,
    growth: int,
    preset: str,
) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "backend": "ghost",
        "clock": "virtual",
        "timing": preset,
        "capacity": capacity,
        "mode": "prefetch",
        "slot_size": block,
    }
    if users * (prefix + growth * turns) * block > capacity:
        raise click.BadParameter("(c): users x blocks per user exceed the capacity")
    rss0 = bl.rss_now()
    rss_dev = 0
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    got = dram
    pool = slots = 0
    t_open = 0.0
    for appends in (True, False):
        t0 = time.perf_counter()
        dev, got, notes = open_largest(opts, dram, 64 * bl.MiB)
        t_open = time.perf_counter() - t0
        with dev:
            st = dev.stats()
            pool, slots = st.pool_bytes, st.slots_total
            runs.append(replay(dev, block, users, turns, prefix, growth, appends))
            rss_dev = max(rss_dev, bl.rss_now())
    rows = []
    for t in range(turns):
        a, r = runs[0]["per_turn"][t], runs[1]["per_turn"][t]
        rows.append(
            [
                t,
                f"{a['footprint_bytes'] / bl.GiB:,.1f}",
                f"{a['sim_seconds']:.2f}",
                f"{a['wall_seconds']:.2f}",
                bl.fmt_bw(a["sim_read_bw_bps"]),
                f"{r['sim_seconds']:.2f}",
                f"{r['wall_seconds']:.2f}",
                bl.fmt_bw(r["sim_read_bw_bps"]),
            ]
        )
    a, r = runs
    rows.append(
        [
            "all",
            f"{a['bytes_read'] / bl.GiB:,.1f} read",
            f"{a['sim_seconds']:.2f}",
            f"{a['wall_seconds']:.2f}",
            bl.fmt_bw(a["sim_read_bw_bps"]),
            f"{r['sim_seconds']:.2f}",
            f"{r['wall_seconds']:.2f}",
            bl.fmt_bw(r["sim_read_bw_bps"]),
        ]
    )
    bl.console.print()
    bl.table(
        f"(c) virtual-time replay: {chm.format_size(capacity)} ghost device, "
        f"dram={chm.format_size(got)} ({'as asked' if got == dram else 'LARGEST THAT OPENED'}),"
        f" timing={preset}, {users} users x {turns} turns, {block // bl.MiB} MiB blocks, "
        f"prefix {prefix} + {growth}*t blocks per user",
        [
            "turn",
            "footprint GiB",
            "sim s",
            "wall s",
            "sim read bw",
            "sim s (ro)",
            "wall s (ro)",
            "sim bw (ro)",
        ],
        rows,
    )
    bl.console.print(
        f"  with appends: {a['sim_seconds']:.2f} s simulated in {a['wall_seconds']:.2f} s wall "
        f"({a['sim_seconds'] / a['wall_seconds']:.1f}x real time); writes admitted "
        f"{a['writes_admitted']}, skipped {a['writes_skipped']}, flushed "
        f"{a['stats_delta']['wr_flushed_bytes'] / bl.GiB:.1f} GiB"
    )
    bl.console.print(
        f"  reads only (ro): {r['sim_seconds']:.2f} s simulated in {r['wall_seconds']:.2f} s "
        f"wall ({r['sim_seconds'] / r['wall_seconds']:.1f}x real time)"
    )
    bl.console.print(
        f"  pool: {pool / bl.GiB:.1f} GiB mapped ({slots} slots of {block // bl.MiB} MiB), "
        f"open took {t_open:.2f} s; RSS of this process with the device open "
        f"{rss_dev / bl.GiB:.2f} GiB ({rss0 / bl.GiB:.2f} GiB before it was opened)"
    )
    for note in notes:
        bl.console.print(f"  [b]could not open[/b] {note}")
    return {
        "capacity": capacity,
        "dram_asked": dram,
        "dram_opened": got,
        "open_failures": notes,
        "open_seconds": t_open,
        "pool_bytes": pool,
        "slots": slots,
        "rss_bytes_device_open": rss_dev,
        "rss_bytes_before": rss0,
        "timing": preset,
        "users": users,
        "turns": turns,
        "prefix_blocks": prefix,
        "growth_blocks": growth,
        "block_bytes": block,
        "with_appends": a,
        "reads_only": r,
    }


# ---------------------------------------------------------------- main


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="A few seconds: smoke test, numbers not meaningful.")
@click.option("--parts", default="a,b,c", show_default=True, help="Which parts to run.")
@click.option(
    "--clocks",
    default="real,virtual,virtual-ro",
    show_default=True,
    help="(a) clocks: real, virtual, virtual-ro, real+timing, paced.",
)
@click.option("--timing", "preset", default="fpga-cxlhm", show_default=True, help="Preset.")
@click.option(
    "--readers",
    default=",".join(READERS),
    show_default=True,
    help="(a) readers.",
)
@click.option("--block-size", default=None, help="KV block size [16M; quick 4M].")
@click.option("--dram", default=None, help="Device DRAM for (a)/(b) [256M; quick 48M].")
@click.option("--wbuf", default=None, help="Write buffer share (prefetch) [32M; quick 8M].")
@click.option("--prefix", default=None, type=int, help="(a) blocks before turn 0 [24; quick 16].")
@click.option("--growth", default=None, type=int, help="(a) blocks appended per turn [8; q 4].")
@click.option("--turns", default=None, type=int, help="(a) turns [4; quick 2].")
@click.option("--reps", default=None, type=int, help="Repetitions [3; quick 1].")
@click.option("--b-seconds", default=None, type=float, help="(b) seconds per phase [3; q 0.5].")
@click.option("--b-clock", default="real", show_default=True, help="(b) clock.")
@click.option(
    "--b-writer-rate",
    "b_rate",
    default=0.0,
    show_default=True,
    help="(b) blocks/s the writer offers; 0: as fast as it can.",
)
@click.option("--c-capacity", default="2T", show_default=True, help="(c) device capacity.")
@click.option("--c-dram", default="64G", show_default=True, help="(c) device DRAM.")
@click.option("--c-users", default=None, type=int, help="(c) conversations [32; quick 4].")
@click.option("--c-turns", default=None, type=int, help="(c) turns [8; quick 3].")
@click.option("--c-prefix", default=None, type=int, help="(c) blocks per user at turn 0 [64].")
@click.option("--c-growth", default=None, type=int, help="(c) blocks per user per turn [8].")
@click.option("--file", "path", default=DEFAULT_FILE, show_default=True, help="Data file.")
@click.option("--keep-file/--remove-file", default=False, show_default=True)
@click.option("--json", "json_path", default=None, help="Write the results as JSON here.")
def main(
    quick: bool,
    parts: str,
    clocks: str,
    preset: str,
    readers: str,
    block_size: str | None,
    dram: str | None,
    wbuf: str | None,
    prefix: int | None,
    growth: int | None,
    turns: int | None,
    reps: int | None,
    b_seconds: float | None,
    b_clock: str,
    b_rate: float,
    c_capacity: str,
    c_dram: str,
    c_users: int | None,
    c_turns: int | None,
    c_prefix: int | None,
    c_growth: int | None,
    path: str,
    keep_file: bool,
    json_path: str | None,
) -> None:
    """LRU vs prefetch (paper Fig. 5), write isolation (section 3.3), 2 TB virtual replay."""
    todo = {p.strip() for p in parts.split(",") if p.strip()}
    all_clocks = make_clocks(preset)
    try:
        clock_list = [all_clocks[c.strip()] for c in clocks.split(",") if c.strip()]
        reader_list = [READERS[r.strip()] for r in readers.split(",") if r.strip()]
        clock_b = all_clocks[b_clock]
    except KeyError as exc:
        raise click.BadParameter(f"unknown name {exc}") from None
    wl = Workload(
        block=chm.parse_size(block_size or ("4M" if quick else "16M")),
        prefix=prefix if prefix is not None else (16 if quick else 24),
        growth=growth if growth is not None else (4 if quick else 8),
        turns=turns if turns is not None else (2 if quick else 4),
        dram=chm.parse_size(dram or ("48M" if quick else "256M")),
        wbuf=chm.parse_size(wbuf or ("8M" if quick else "32M")),
    )
    nreps = reps if reps is not None else (1 if quick else 3)
    VERDICTS.quick = quick  # --quick: speed figures are judged as smoke targets
    bsec = b_seconds if b_seconds is not None else (0.5 if quick else 3.0)
    b_nblocks = wl.prefix
    b_wblocks = max(wl.growth * wl.turns, 4)
    nblocks_file = max(wl.blocks_total, b_nblocks + b_wblocks)
    capacity = -(-nblocks_file * wl.block // (64 * bl.MiB)) * 64 * bl.MiB
    results: dict[str, Any] = {
        "benchmark": "lru_vs_prefetch",
        "env": bl.environment(),
        "params": {
            "quick": quick,
            "timing": preset,
            "block_bytes": wl.block,
            "dram_bytes": wl.dram,
            "wbuf_bytes": wl.wbuf,
            "prefix_blocks": wl.prefix,
            "growth_blocks": wl.growth,
            "turns": wl.turns,
            "reps": nreps,
            "file": path,
            "capacity": capacity,
        },
    }
    footprint0 = wl.prefix * wl.block
    bl.console.print(
        f"[b]lru_vs_prefetch[/b]: {wl.block // bl.MiB} MiB blocks; turn t reads "
        f"{wl.prefix} + {wl.growth}*t blocks then appends {wl.growth}; {wl.turns} turns; "
        f"device DRAM {chm.format_size(wl.dram)} vs smallest per-turn footprint "
        f"{chm.format_size(footprint0)}; W_max = {w_max(wl.block, wl.prefix)}; {nreps} rep(s)"
    )
    if footprint0 <= wl.dram:
        bl.console.print(
            "  [b]warning[/b]: DRAM holds a whole turn: this is not the one-hit-wonder regime"
        )

    need_file = ("a" in todo and any(c.needs_file for c in clock_list)) or (
        "b" in todo and clock_b.needs_file
    )
    try:
        if need_file:
            results["params"]["file_written"] = bl.ensure_filled_file(path, capacity)
        if need_file:
            check_data(path, capacity, wl)
        if "a" in todo:
            results["a"] = part_a(wl, clock_list, reader_list, nreps, path, capacity)
        if "b" in todo:
            results["b"] = part_b(
                wl, clock_b, nreps, bsec, b_nblocks, b_wblocks, path, capacity, b_rate
            )
    finally:
        if need_file and not keep_file:
            Path(path).unlink(missing_ok=True)
    if "c" in todo:
        results["c"] = part_c(
            capacity=chm.parse_size(c_capacity),
            dram=chm.parse_size(c_dram),
            block=chm.parse_size(block_size or "16M"),
            users=c_users if c_users is not None else (4 if quick else 32),
            turns=c_turns if c_turns is not None else (3 if quick else 8),
            prefix=c_prefix if c_prefix is not None else (8 if quick else 64),
            growth=c_growth if c_growth is not None else (2 if quick else 8),
            preset=preset,
        )
    results["env"]["loadavg_at_end"] = bl.loadavg()
    results["verdicts"] = VERDICTS.to_dict()
    bl.write_json(json_path, results)
    raise SystemExit(VERDICTS.finish())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
