#!/usr/bin/env python3
"""Batched prefetch + release from Python, next to one call per object.

Each cycle issues 32 prefetches of 4 KiB objects on a ghost-backend device
(slot_size=4K, 32 slots: fills complete at once, no data moves), then
releases the 32 handles: with ``dev.prefetch_batch`` + ``HandleBatch.release``
(two device calls and no Python object per element), with
``dev.prefetch_many`` + ``dev.release_many`` (two device calls, a Handle per
element) and with ``dev.prefetch`` + ``Handle.release`` per object, in
alternating repetitions. Target: the HandleBatch form >= 1,000,000
objects/s. Its ratio to the one-object calls is printed beside it. Verdict
lines come last; exit status 1 on a miss.

    python tools/bench/batch_rate.py --quick
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

import chm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

BATCH = 32
OBJ = 4096
TARGET = 1_000_000.0


def handle_batch(dev: chm.Device, seconds: float) -> float:
    addrs = [i * OBJ for i in range(BATCH)]
    lens = [OBJ] * BATCH
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            b = dev.prefetch_batch(addrs, lens)
            b.release()
            n += BATCH
        if not b.ok:
            raise click.ClickException(f"a batch failed: {b.statuses.tolist()}")
    return n / (time.perf_counter() - t0)


def batched(dev: chm.Device, seconds: float) -> float:
    addrs = [i * OBJ for i in range(BATCH)]
    lens = [OBJ] * BATCH
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            hs = dev.prefetch_many(addrs, lens)
            errs = dev.release_many(hs)  # type: ignore[arg-type]
            n += BATCH
        if any(not isinstance(h, chm.Handle) for h in hs) or any(errs):
            raise click.ClickException(f"a batch failed: {hs} {errs}")
    return n / (time.perf_counter() - t0)


def single(dev: chm.Device, seconds: float) -> float:
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            hs = [dev.prefetch(i * OBJ, OBJ) for i in range(BATCH)]
            for h in hs:
                h.release()
            n += BATCH
    return n / (time.perf_counter() - t0)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="A few seconds: smoke test, numbers not meaningful.")
@click.option("--reps", type=int, default=None, help="Alternating repetitions (default 5).")
@click.option("--json", "json_path", default=None, help="Write the results as JSON here.")
def main(quick: bool, reps: int | None, json_path: str | None) -> None:
    nreps = reps or (2 if quick else 5)
    secs = 0.3 if quick else 1.0
    kinds = {
        "prefetch_batch + release": handle_batch,
        "prefetch_many + release_many": batched,
        "prefetch + release": single,
    }
    series = {k: bl.Series(k, "objects/s") for k in kinds}
    with chm.Device.open(
        capacity="1G", dram="1M", wbuf="256K", slot_size="4K", slots=BATCH, backend="ghost"
    ) as dev:
        for r in range(nreps):
            for k in bl.rotate(list(kinds), r):
                series[k].add(kinds[k](dev, secs))
    b, m, s = (series[k] for k in kinds)
    bl.table(
        f"{BATCH} x {OBJ // 1024} KiB objects per cycle, ghost backend",
        ["calls", "median", "min", "max"],
        [
            (x.name, bl.fmt_rate(x.median), *(bl.fmt_rate(v) for v in bl.spread(x.values)))
            for x in series.values()
        ],
    )
    speedup = bl.median(bl.paired_ratios(b.values, s.values))
    speedup_many = bl.median(bl.paired_ratios(b.values, m.values))
    bl.write_json(
        json_path,
        {
            "environment": bl.environment(),
            "series": {x.name: x.to_dict() for x in series.values()},
            "speedup": speedup,
            "speedup_vs_many": speedup_many,
            "target": TARGET,
            "target_met": b.median >= TARGET,
        },
    )
    bl.console.print(f"  HandleBatch / one-object calls: {bl.fmt_ratio(speedup)}")
    bl.console.print(f"  HandleBatch / prefetch_many + release_many: {bl.fmt_ratio(speedup_many)}")
    verd = bl.Verdicts("batch_rate", quick=quick)
    verd.check(
        "HandleBatch prefetch + release, objects/s", b.median, TARGET, fmt=bl.fmt_rate, speed=True
    )
    sys.exit(verd.finish())


if __name__ == "__main__":
    main()
