#!/usr/bin/env python3
"""Two sessions, one flooding the refill queue: the other's prefetch latency.

A ghost-backend device in real time with a modeled SSD (2 ms per read, 16
channels: fills take the model's time, no data moves), 8 slots and a 32-entry
refill queue. A probe session issues one 4 KiB prefetch at a time, waits for
it and releases it, with a short pause between; the latency is issue to
view. A flooder session (its own thread; quota slots + queue - 4, so the
probe can always queue) keeps the queue full: it tops its outstanding
prefetches up with ``prefetch_many`` and waits on and releases the oldest,
one at a time. Repetitions alternate probe alone / probe with the flooder;
each gives the probe's p50 and p99. Target: the median p99 with the flooder
<= 2x the median p99 alone (the refill queue is served round-robin across
sessions, so the probe waits for one slot, not behind the flooder's whole
queue). For contrast, a third kind runs the probe inside the flooder's own
session, where requests are served FIFO: what every caller got when one
queue was shared by all. Verdict lines come last; exit status 1 on a miss.

    python tools/bench/session_fairness.py --quick
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time
from pathlib import Path

import click
import numpy as np

import chm
from chm.errors import WouldBlock

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

OBJ = 4096
SLOTS = 8
QUEUE = 32
READ_LAT_NS = 2_000_000
TARGET = 2.0
FLOOD_QUOTA = SLOTS + QUEUE - 4  # leaves the probe room in the shared queue


def open_device() -> chm.Device:
    return chm.Device.open(
        capacity="1G",
        dram="1M",
        wbuf="256K",
        slot_size="4K",
        slots=SLOTS,
        refill_queue=QUEUE,
        backend="ghost",
        clock="real",
        ssd_read_lat_ns=READ_LAT_NS,
        ssd_channels=16,
    )


class Flooder:
    """Keeps quota - 4 prefetches of its session outstanding until stopped
    (in a session of its own, or in ``sess``, shared with the probe)."""

    def __init__(self, dev: chm.Device, sess: chm.Session | None = None) -> None:
        self.own = sess is None
        self.sess = dev.session(quota=FLOOD_QUOTA) if sess is None else sess
        self.stop = threading.Event()
        self.done = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        want = FLOOD_QUOTA - 4
        live: collections.deque[chm.Handle] = collections.deque()
        nxt = 0
        while not self.stop.is_set():
            n = want - len(live)
            if n > 0:
                addrs = [((nxt + i) % 4096) * OBJ for i in range(n)]
                nxt += n
                for h in self.sess.prefetch_many(addrs, [OBJ] * n):
                    if isinstance(h, chm.Handle):
                        live.append(h)
            if live:
                h = live.popleft()
                h.wait(10.0)
                h.release()
                self.done += 1
        self.sess.release_many(list(live))

    def __enter__(self) -> Flooder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30.0)
        if self.own:
            self.sess.close()


def probe(sess: chm.Session, samples: int) -> list[float]:
    """Issue-to-view latencies (s) of one prefetch at a time."""
    out: list[float] = []
    addr = 900 * OBJ
    while len(out) < samples:
        t0 = time.perf_counter()
        try:
            h = sess.prefetch(addr, OBJ)
        except WouldBlock:  # the shared queue is full for an instant
            time.sleep(0.0005)
            continue
        h.wait(10.0)
        out.append(time.perf_counter() - t0)
        h.release()
        time.sleep(0.001)
    return out


def fmt_ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="A few seconds: smoke test, numbers not meaningful.")
@click.option("--reps", type=int, default=None, help="Alternating repetitions (default 5).")
@click.option("--samples", type=int, default=None, help="Probe prefetches per repetition.")
@click.option("--json", "json_path", default=None, help="Write the results as JSON here.")
def main(quick: bool, reps: int | None, samples: int | None, json_path: str | None) -> None:
    nreps = reps or (2 if quick else 5)
    nsamp = samples or (50 if quick else 300)
    sys.setswitchinterval(0.0005)  # the two Python threads share the GIL
    kinds = ["alone", "flooded", "same session"]
    p50 = {k: bl.Series(f"{k} p50", "s") for k in kinds}
    p99 = {k: bl.Series(f"{k} p99", "s") for k in kinds}
    flood_rate: list[float] = []
    with open_device() as dev, dev.session(quota=4) as sess:
        probe(sess, 10)  # warm up
        for r in range(nreps):
            for kind in bl.rotate(kinds, r):
                if kind == "alone":
                    lat = probe(sess, nsamp)
                elif kind == "flooded":
                    with Flooder(dev) as fl:
                        time.sleep(0.05)  # let it fill the queue
                        d0, t0 = fl.done, time.perf_counter()
                        lat = probe(sess, nsamp)
                        flood_rate.append((fl.done - d0) / (time.perf_counter() - t0))
                else:
                    with dev.session(quota=FLOOD_QUOTA) as common, Flooder(dev, common):
                        time.sleep(0.05)
                        lat = probe(common, nsamp)
                p50[kind].add(float(np.percentile(lat, 50)))
                p99[kind].add(float(np.percentile(lat, 99)))
        st = dev.stats()
    bl.table(
        f"probe prefetch latency, {OBJ // 1024} KiB objects, ghost backend in real time "
        f"({READ_LAT_NS / 1e6:.0f} ms modeled read), {SLOTS} slots, queue {QUEUE}",
        ["probe", "median p50", "median p99", "p99 min", "p99 max"],
        [
            (
                k,
                fmt_ms(p50[k].median),
                fmt_ms(p99[k].median),
                *map(fmt_ms, bl.spread(p99[k].values)),
            )
            for k in kinds
        ],
    )
    ratio = bl.ratio(p99["flooded"].median, p99["alone"].median)
    paired = bl.median(bl.paired_ratios(p99["flooded"].values, p99["alone"].values))
    shared = bl.ratio(p99["same session"].median, p99["alone"].median)
    bl.console.print(
        f"  flooder: {bl.fmt_rate(bl.median(flood_rate))} prefetches served while the probe ran; "
        f"queued {st.prefetch_queued}, rejected {st.prefetch_rejected} in all"
    )
    bl.console.print(f"  p99 flooded / alone: {bl.fmt_ratio(ratio)} (paired by repetition: "
                     f"{bl.fmt_ratio(paired)})")  # fmt: skip
    bl.console.print(f"  p99 in the flooder's session (FIFO) / alone: {bl.fmt_ratio(shared)}")
    bl.write_json(
        json_path,
        {
            "environment": bl.environment(),
            "series": {x.name: x.to_dict() for x in (*p50.values(), *p99.values())},
            "flood_rate": flood_rate,
            "p99_ratio": ratio,
            "p99_ratio_same_session": shared,
            "target": TARGET,
            "target_met": ratio <= TARGET,
        },
    )
    verd = bl.Verdicts("session_fairness", quick=quick)
    verd.check("probe p99 flooded / alone", ratio, TARGET, higher=False, speed=True)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    sys.exit(verd.finish())


if __name__ == "__main__":
    main()
