#!/usr/bin/env python3
"""Refill bandwidth of the staging window next to fio, and the Python-level
prefetch cycle rate.

(a) chm, io_uring backend: prefetch + wait + release over 16 MiB objects with
    a sliding window of 8 in flight (keep 8 outstanding, wait the oldest,
    release it, issue the next) over a file region of real data;
(b) fio --ioengine=io_uring --direct=1 --bs=16M --iodepth=8 --rw=read over the
    same file and region, alternating with (a) for N repetitions; the ratio
    (a)/(b) is the headline (target >= 0.9). The pread backend is measured in
    the same rotation for reference;
(c) cycles/s of `h = dev.prefetch(a, 4096); h.wait(); h.release()` and of
    `with dev.prefetch(a, 4096) as h: h.wait()` on the ghost backend
    (slot_size=4K; target >= 150,000/s), plus the bare _lowlevel calls as the
    floor the driver wrapper sits on. With --profile, a cProfile of the loops
    shows where the time goes.

Devices use the shipped defaults unless a device option is given on the
command line (--queue-depth, --max-io, --dram, --slots, ...); --sweep compares
a few settings side by side.

    python tools/bench/refill_bw.py --quick
    python tools/bench/refill_bw.py --json results/refill_bw.json

The verdict lines are printed last; the exit status is 1 when a target was
missed (--target-ratio / --target-cycles move the targets).
"""

from __future__ import annotations

import collections
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import click

import chm
from chm import _lowlevel as _ll

# _benchlib.py sits next to this file, which is on sys.path when the script is
# run as a file; `python -m tools.bench.refill_bw` puts the repository there instead.
if __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

TARGET_RATIO = 0.9
TARGET_CYCLES = 150_000.0
DEFAULT_FILE = "/var/tmp/chm-bench-refill.img"


# ---------------------------------------------------------------- (a) chm refill


def chm_refill(
    path: str, size: int, obj: int, window: int, backend: str, dev_opts: dict[str, Any]
) -> dict[str, Any]:
    """One pass of prefetch+wait+release over [0, size) with window in flight."""
    n = size // obj
    opts = dict(dev_opts)
    # objects must fit a slot; the shipped slot_size (32M) already does for 16M
    with chm.Device.open(targets=path, capacity=size, backend=backend, **opts) as dev:
        q: collections.deque[chm.Handle] = collections.deque()
        nxt = 0
        t0 = time.perf_counter()
        while nxt < n and len(q) < window:
            q.append(dev.prefetch(nxt * obj, obj))
            nxt += 1
        while q:
            h = q.popleft()
            h.wait()
            h.release()
            if nxt < n:
                q.append(dev.prefetch(nxt * obj, obj))
                nxt += 1
        dt = time.perf_counter() - t0
        st = dev.stats()
        cfg = dev.config
    return {
        "bw_bps": n * obj / dt,
        "seconds": dt,
        "bytes": n * obj,
        "refill_lat_mean_ms": st.refill_lat_sum_ns / max(1, st.refill_lat_count) / 1e6,
        "prefetch_queued": st.prefetch_queued,
        "bytes_read_ssd": st.bytes_read_ssd,
        "slots": st.slots_total,
        "queue_depth": cfg["queue_depth"],
        "max_io": cfg["max_io"],
        "slot_bytes": cfg["slot_bytes"],
        "dram_bytes": cfg["dram_bytes"],
        "sqpoll": cfg["sqpoll"],
        "pool_hugepages": st.pool_hugepages,
    }


def check_data(path: str, size: int, obj: int) -> None:
    """The staged bytes equal the file's: a fast wrong answer is no answer."""
    probe = [0, (size // obj // 2) * obj, size - obj]
    with (
        chm.Device.open(targets=path, capacity=size, backend="uring") as dev,
        open(path, "rb") as f,
    ):
        for addr in probe:
            with dev.prefetch(addr, obj) as h:
                view = h.wait()
                f.seek(addr)
                want = f.read(obj)
                same = view == want
                del view
            if not same:
                raise click.ClickException(f"staged bytes at {addr:#x} differ from the file")


# ---------------------------------------------------------------- (c) cycles


def _addr_mask(dev: chm.Device) -> int:
    n = 1
    while n * 2 * 4096 <= min(dev.capacity, 1 << 30):
        n *= 2
    return n - 1


def cycles_explicit(dev: chm.Device, n: int, base: int) -> int:
    mask = _addr_mask(dev)
    prefetch = dev.prefetch
    for i in range(base, base + n):
        h = prefetch((i & mask) << 12, 4096)
        h.wait()
        h.release()
    return n


def cycles_with(dev: chm.Device, n: int, base: int) -> int:
    mask = _addr_mask(dev)
    prefetch = dev.prefetch
    for i in range(base, base + n):
        with prefetch((i & mask) << 12, 4096) as h:
            h.wait()
    return n


def cycles_lowlevel(dev: chm.Device, n: int, base: int) -> int:
    mask = _addr_mask(dev)
    ptr = dev._ptr
    pf, wt, rl, forever = (
        _ll.prefetch_object,
        _ll.prefetch_wait_buffer,
        _ll.prefetch_release,
        _ll.UINT64_MAX,
    )
    for i in range(base, base + n):
        t = pf(ptr, (i & mask) << 12, 4096, 0)
        wt(ptr, t, forever)
        rl(ptr, t)
    return n


FORMS = {
    "explicit": ("h = dev.prefetch(a, 4096); h.wait(); h.release()", cycles_explicit),
    "with": ("with dev.prefetch(a, 4096) as h: h.wait()", cycles_with),
    "lowlevel": ("chm._lowlevel calls only (floor, not a user API)", cycles_lowlevel),
}


def measure_cycles(dev: chm.Device, form: str, seconds: float) -> float:
    fn = FORMS[form][1]
    fn(dev, 2000, 0)  # warm-up: thread-local scratch, caches
    state = {"base": 0}

    def step(k: int) -> int:
        fn(dev, k, state["base"])
        state["base"] += k
        return k

    done, dt = bl.run_for(seconds, step, 5000)
    return done / dt


def profile_cycles(dev: chm.Device, form: str, n: int, top: int = 14) -> str:
    pr = cProfile.Profile()
    pr.enable()
    FORMS[form][1](dev, n, 0)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).strip_dirs().sort_stats("tottime").print_stats(top)
    lines = [ln for ln in s.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
    return "\n".join(lines[start:])


def phase_breakdown(dev: chm.Device, n: int) -> dict[str, dict[str, float]]:
    """Per-call cost of each step, without a profiler: n prefetches, then n
    waits, then n releases, timed phase by phase (n must fit the slots)."""
    mask = _addr_mask(dev)
    out: dict[str, dict[str, float]] = {}
    ptr = dev._ptr
    pf, wt, rl, forever = (
        _ll.prefetch_object,
        _ll.prefetch_wait_buffer,
        _ll.prefetch_release,
        _ll.UINT64_MAX,
    )
    clock = time.perf_counter
    t0 = clock()
    toks = [pf(ptr, (i & mask) << 12, 4096, 0) for i in range(n)]
    t1 = clock()
    for t in toks:
        wt(ptr, t, forever)
    t2 = clock()
    for t in toks:
        rl(ptr, t)
    t3 = clock()
    out["lowlevel"] = {"prefetch": t1 - t0, "wait": t2 - t1, "release": t3 - t2}
    prefetch = dev.prefetch
    t0 = clock()
    hs = [prefetch((i & mask) << 12, 4096) for i in range(n)]
    t1 = clock()
    for h in hs:
        h.wait()
    t2 = clock()
    for h in hs:
        h.release()
    t3 = clock()
    out["Handle"] = {"prefetch": t1 - t0, "wait": t2 - t1, "release": t3 - t2}
    for d in out.values():
        for k in d:
            d[k] = d[k] / n * 1e6  # us per call
    return out


# ---------------------------------------------------------------- main


def parse_opt_sizes(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="A few seconds: smoke test, numbers not meaningful.")
@click.option(
    "--file",
    "path",
    default=DEFAULT_FILE,
    show_default=True,
    help="Data file (created and filled with random data if needed).",
)
@click.option("--size", default=None, help="Region to read [default: 2G, quick 256M].")
@click.option("--object-size", default="16M", show_default=True, help="Object (fio bs) size.")
@click.option("--window", default=8, show_default=True, help="Prefetches in flight (fio iodepth).")
@click.option("--reps", default=None, type=int, help="Repetitions [default: 5, quick 1].")
@click.option(
    "--cycle-seconds",
    default=None,
    type=float,
    help="Seconds per cycles/s measurement [default: 1.5, quick 0.2].",
)
@click.option("--queue-depth", default=None, type=int, help="Device queue_depth [shipped].")
@click.option("--max-io", default=None, help="Device max_io (default: shipped).")
@click.option("--dram", default=None, help="Device dram (default: shipped).")
@click.option("--slots", default=None, type=int, help="Device slots (default: shipped).")
@click.option("--slot-size", default=None, help="Device slot_size (default: shipped).")
@click.option("--stripe-unit", default=None, help="Device stripe_unit (default: shipped).")
@click.option("--sqpoll", is_flag=True, default=None, help="Device sqpoll=1.")
@click.option(
    "--sweep", is_flag=True, help="Also compare a few device settings (uring) side by side."
)
@click.option("--no-pread", is_flag=True, help="Skip the pread reference.")
@click.option("--no-cycles", is_flag=True, help="Skip part (c).")
@click.option(
    "--profile", is_flag=True, help="cProfile the cycle loops (printed before the verdicts)."
)
@click.option(
    "--target-ratio",
    default=TARGET_RATIO,
    show_default=True,
    type=float,
    help="Target for chm uring / fio bandwidth.",
)
@click.option(
    "--target-cycles",
    default=TARGET_CYCLES,
    show_default=True,
    type=float,
    help="Target for prefetch+wait+release cycles/s.",
)
@click.option(
    "--keep-file/--remove-file",
    default=False,
    show_default=True,
    help="Keep the data file for the next run.",
)
@click.option("--json", "json_path", default=None, help="Write the results as JSON here.")
def main(
    quick: bool,
    path: str,
    size: str | None,
    object_size: str,
    window: int,
    reps: int | None,
    cycle_seconds: float | None,
    queue_depth: int | None,
    max_io: str | None,
    dram: str | None,
    slots: int | None,
    slot_size: str | None,
    stripe_unit: str | None,
    sqpoll: bool | None,
    sweep: bool,
    no_pread: bool,
    no_cycles: bool,
    profile: bool,
    target_ratio: float,
    target_cycles: float,
    keep_file: bool,
    json_path: str | None,
) -> None:
    """Refill bandwidth vs fio (target >= 0.9x) and prefetch cycles/s (target >= 150k/s).

    Exits 1 when a target is missed.
    """
    verdicts = bl.Verdicts("refill_bw", quick=quick)
    fio_label = f"fio bs={object_size} qd={window}"
    region = chm.parse_size(size or ("256M" if quick else "2G"))
    obj = chm.parse_size(object_size)
    nreps = reps if reps is not None else (1 if quick else 5)
    csec = cycle_seconds if cycle_seconds is not None else (0.2 if quick else 1.5)
    if region % obj or region < obj * window:
        raise click.BadParameter("size must be a multiple of object-size and hold a window")
    dev_opts = parse_opt_sizes(
        {
            "queue_depth": queue_depth,
            "max_io": max_io,
            "dram": dram,
            "slots": slots,
            "slot_size": slot_size,
            "stripe_unit": stripe_unit,
            "sqpoll": 1 if sqpoll else None,
        }
    )
    results: dict[str, Any] = {
        "benchmark": "refill_bw",
        "env": bl.environment(),
        "params": {
            "file": path,
            "region_bytes": region,
            "object_bytes": obj,
            "window": window,
            "reps": nreps,
            "device_options": dev_opts or "shipped defaults",
            "quick": quick,
        },
    }
    bl.console.print(
        f"[b]refill_bw[/b]: {region / bl.GiB:.2f} GiB region of {path}, {obj // bl.MiB} MiB "
        f"objects, window {window}, {nreps} rep(s); "
        f"device options: {dev_opts or 'shipped defaults'}"
    )

    results["params"]["file_written"] = bl.ensure_filled_file(path, region)
    results["params"]["block_queue"] = bq = bl.block_queue(path)
    bl.console.print(
        "  backing device: " + ", ".join(f"{k}={v}" for k, v in bq.items() if k != "scheduler")
    )
    try:
        check_data(path, region, obj)
        systems: list[tuple[str, Any]] = [
            (fio_label, lambda: bl.fio_read(path, region, bs=obj, iodepth=window)),
            ("chm uring", lambda: chm_refill(path, region, obj, window, "uring", dev_opts)),
        ]
        qd = int(dev_opts.get("queue_depth", 0)) or int(chm.Config()["queue_depth"])
        mio = chm.parse_size(dev_opts.get("max_io", 0)) or int(chm.Config()["max_io"])
        shape = f"fio bs={mio // 1024}K qd={qd}"
        systems.append(
            (shape, lambda: bl.fio_read(path, region, bs=mio, iodepth=qd)),
        )
        systems.append(
            (
                "chm uring pool=memfd",
                lambda: chm_refill(
                    path, region, obj, window, "uring", {**dev_opts, "pool": "memfd"}
                ),
            )
        )
        if not no_pread:
            systems.append(
                ("chm pread", lambda: chm_refill(path, region, obj, window, "pread", dev_opts))
            )
        series = {name: bl.Series(name, "B/s") for name, _ in systems}
        with bl.progress() as prog:
            task = prog.add_task("refill", total=nreps * len(systems))
            for r in range(nreps):
                for name, fn in bl.rotate(systems, r):
                    prog.update(task, description=f"rep {r + 1}: {name}")
                    res = fn()
                    series[name].add(res.pop("bw_bps"), rep=r, **res)
                    prog.advance(task)
        fio_s, uring_s = series[fio_label], series["chm uring"]
        ratio_med = bl.ratio(uring_s.median, fio_s.median)
        paired = bl.paired_ratios(uring_s.values, fio_s.values)
        rows = []
        for name, s in series.items():
            lo, hi = bl.spread(s.values)
            rows.append(
                [
                    name,
                    bl.fmt_bw(s.median),
                    f"{bl.fmt_bw(lo)} .. {bl.fmt_bw(hi)}",
                    bl.fmt_ratio(bl.ratio(s.median, fio_s.median)),
                ]
            )
        bl.table(
            f"(a)+(b) refill bandwidth, median of {nreps} alternating rep(s)",
            ["system", "median", "range", "vs fio"],
            rows,
        )
        u0 = uring_s.extra[0]
        lat_ms = bl.median([e["refill_lat_mean_ms"] for e in uring_s.extra])
        bl.console.print(
            f"  chm device: queue_depth={u0['queue_depth']} max_io={u0['max_io'] // 1024}K "
            f"slots={u0['slots']} slot_size={u0['slot_bytes'] // bl.MiB}M "
            f"dram={u0['dram_bytes'] // bl.MiB}M sqpoll={u0['sqpoll']}; "
            f"mean refill latency {lat_ms:.1f} ms"
        )
        bl.console.print(
            f"  '{shape}' reads the region with the I/O shape chm's fills use (max_io-sized "
            "I/Os, queue_depth in flight): the backend's own overhead is the gap to it."
        )
        m0 = series["chm uring pool=memfd"].extra[0]
        bl.console.print(
            "  'chm uring pool=memfd' stages into the shareable pool a daemon serves from "
            f"(pool_hugepages={m0['pool_hugepages']}: collapsed into huge pages where the "
            "kernel can, else 4 KiB pages, as fio's malloc'd buffers are); the default anon "
            f"pool is THP-backed (pool_hugepages={u0['pool_hugepages']}), so one 1 MiB I/O is "
            "one DMA segment."
        )
        met = verdicts.check(f"chm uring / {fio_label}", ratio_med, target_ratio, speed=True)
        bl.console.print(
            f"  ratio chm uring / {fio_label}: {bl.fmt_ratio(ratio_med)} (ratio of medians), "
            f"{bl.fmt_ratio(bl.median(paired))} (median of paired reps) -- target >= "
            f"{target_ratio}: [b]{met}[/b]"
        )
        results["refill"] = {name: s.to_dict() for name, s in series.items()}
        results["refill"]["ratio_uring_vs_fio"] = ratio_med
        results["refill"]["ratio_uring_vs_fio_paired_median"] = bl.median(paired)
        results["refill"]["target_ratio"] = target_ratio
        results["refill"]["target_met"] = bool(ratio_med >= target_ratio)

        if sweep:
            results["sweep"] = run_sweep(path, region, obj, window, nreps, quick)
    finally:
        if not keep_file:
            Path(path).unlink(missing_ok=True)

    if not no_cycles:
        results["cycles"] = run_cycles(nreps, csec, profile, quick, target_cycles, verdicts)

    results["verdicts"] = verdicts.to_dict()
    bl.write_json(json_path, results)
    raise SystemExit(verdicts.finish())


def run_sweep(path: str, region: int, obj: int, window: int, nreps: int, quick: bool) -> Any:
    """A few uring settings against the shipped defaults, alternating."""
    settings: list[tuple[str, dict[str, Any]]] = [
        ("shipped", {}),
        ("max_io=4M", {"max_io": "4M"}),
        ("max_io=16M stripe=16M", {"max_io": "16M", "stripe_unit": "16M"}),
        ("queue_depth=16", {"queue_depth": 16}),
        ("queue_depth=256", {"queue_depth": 256}),
        ("sqpoll=1", {"sqpoll": 1}),
        ("dram=320M", {"dram": "320M"}),
        ("slot_size=16M", {"slot_size": "16M"}),
    ]
    if quick:
        settings = settings[:2]
    series = {name: bl.Series(name, "B/s") for name, _ in settings}
    fio_s = bl.Series("fio", "B/s")
    with bl.progress() as prog:
        task = prog.add_task("sweep", total=nreps * (len(settings) + 1))
        for r in range(nreps):
            fio_s.add(bl.fio_read(path, region, bs=obj, iodepth=window)["bw_bps"])
            prog.advance(task)
            for name, opts in bl.rotate(settings, r):
                prog.update(task, description=f"sweep rep {r + 1}: {name}")
                res = chm_refill(path, region, obj, window, "uring", opts)
                series[name].add(res.pop("bw_bps"), **res)
                prog.advance(task)
    base = series["shipped"].median
    rows = [[f"fio bs={obj // bl.MiB}M qd={window}", bl.fmt_bw(fio_s.median), "", ""]]
    for name, s in series.items():
        rows.append(
            [
                name,
                bl.fmt_bw(s.median),
                bl.fmt_ratio(bl.ratio(s.median, fio_s.median)),
                bl.fmt_ratio(bl.ratio(s.median, base)),
            ]
        )
    bl.table(
        "device-option sweep (uring), medians",
        ["setting", "median", "vs fio", "vs shipped"],
        rows,
    )
    out = {name: s.to_dict() for name, s in series.items()}
    out["fio"] = fio_s.to_dict()
    return out


def run_cycles(
    nreps: int,
    seconds: float,
    profile: bool,
    quick: bool,
    target_cycles: float,
    verdicts: bl.Verdicts,
) -> Any:
    forms = list(FORMS)
    series = {f: bl.Series(f, "cycles/s") for f in forms}
    phases: list[dict[str, dict[str, float]]] = []
    with chm.Device.open(capacity="64G", backend="ghost", slot_size="4K") as dev:
        st = dev.stats()
        nphase = min(st.slots_total, 2000 if quick else 20000)
        with bl.progress() as prog:
            task = prog.add_task("cycles", total=nreps * len(forms))
            for r in range(nreps):
                for f in bl.rotate(forms, r):
                    prog.update(task, description=f"cycles rep {r + 1}: {f}")
                    series[f].add(measure_cycles(dev, f, seconds))
                    prog.advance(task)
                phases.append(phase_breakdown(dev, nphase))
        rows = []
        for f in forms:
            s = series[f]
            lo, hi = bl.spread(s.values)
            target = bl.verdict(s.median, target_cycles) if f != "lowlevel" else "(reference)"
            per = f"{1e6 / s.median:.2f} us" if s.median else "n/a"
            rows.append([f, bl.fmt_rate(s.median), f"{lo:,.0f} .. {hi:,.0f}", per, target])
        bl.console.print()
        bl.table(
            f"(c) prefetch+wait+release of 4 KiB objects, ghost backend ({st.slots_total} "
            f"slots of 4K), median of {nreps} rep(s) x {seconds:g} s; load avg "
            f"{' '.join(bl.loadavg())}",
            ["loop", "cycles/s", "range", "per cycle", f"target {target_cycles:,.0f}/s"],
            rows,
        )
        for f in forms:
            bl.console.print(f"  {f:9s} {FORMS[f][0]}")
        med_phase = {
            layer: {
                k: bl.median([p[layer][k] for p in phases]) for k in ("prefetch", "wait", "release")
            }
            for layer in ("lowlevel", "Handle")
        }
        bl.table(
            f"    per-call cost by step ({nphase:,} calls per step, batched; median us/call)",
            ["layer", "prefetch", "wait", "release", "sum"],
            [
                [layer, *(f"{v:.2f}" for v in d.values()), f"{sum(d.values()):.2f}"]
                for layer, d in med_phase.items()
            ],
        )
        for f in ("explicit", "with"):
            verdicts.check(
                f"prefetch cycles/s ({f})",
                series[f].median,
                target_cycles,
                fmt=bl.fmt_rate,
                speed=True,
            )
        profiles: dict[str, str] = {}
        if profile:
            for f in ("explicit", "with"):
                n = 20_000 if quick else 100_000
                profiles[f] = profile_cycles(dev, f, n)
                bl.console.print(
                    f"\ncProfile of the '{f}' loop ({n:,} cycles; the profiler inflates "
                    "Python-level calls: compare shares, not absolute times):"
                )
                print(profiles[f])
    out: dict[str, Any] = {f: series[f].to_dict() for f in forms}
    out["target_cycles_per_s"] = target_cycles
    out["target_met"] = {f: bool(series[f].median >= target_cycles) for f in ("explicit", "with")}
    out["per_call_us"] = med_phase
    out["profiles"] = profiles
    out["loadavg_at_end"] = bl.loadavg()
    return out


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
