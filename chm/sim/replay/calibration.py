"""Fitting a timing preset's SSD parameters to latency and bandwidth points.

A point is one steady-state measurement of the drive: ``queue_depth`` I/Os
of ``size_bytes`` kept in flight (reads or writes), with their mean latency
and the bandwidth they reached -- as a datasheet states it ("14 GB/s
sequential read at 128 KiB", "70 us 4 KiB random read at QD1") or as fio
measures it (:func:`fio_points`).

The model is the device's (``fw_spec/cost.yaml``, ``csrc/timing.c``) in
steady state: ``C`` channels, each taking ``lat + size * C / bw`` per I/O,
and a pipe taking ``size / bw``, so with ``q`` I/Os in flight

    IOPS      X = min(min(q, C) / (lat + size * C / bw), bw / size)
    bandwidth     X * size
    latency       q / X                      (Little's law)

:func:`fit` searches ``C`` (1..64, the core's range), ``lat`` and ``bw``
(log grids, refined around the best) for the least squared log error of
latency and bandwidth over the points -- a plain grid search, exact for
three parameters and deterministic -- and :func:`residuals` gives each
point's relative errors.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Fit",
    "Point",
    "fio_points",
    "fit",
    "parse_fio",
    "predict",
    "residuals",
    "spec_points",
]

MAX_CHANNELS = 64


@dataclass(frozen=True)
class Point:
    """One steady-state measurement: size, queue depth, mean latency, bandwidth."""

    size_bytes: int
    queue_depth: int
    latency_s: float
    bandwidth_Bps: float
    op: str = "read"  # or "write"
    source: str = ""

    def __post_init__(self) -> None:
        if self.size_bytes < 1 or self.queue_depth < 1:
            raise ValueError(f"Point: size and queue depth must be >= 1, got {self}")
        if not (self.latency_s > 0 and self.bandwidth_Bps > 0):
            raise ValueError(f"Point: latency and bandwidth must be > 0, got {self}")
        if self.op not in ("read", "write"):
            raise ValueError(f"Point: op must be read or write, got {self.op!r}")


@dataclass(frozen=True)
class Fit:
    """Fitted SSD parameters of one direction, and the fit's error."""

    op: str
    lat_ns: int
    bw_bps: int
    channels: int
    rms_log_error: float  # over latency and bandwidth of every point

    def options(self) -> dict[str, int]:
        """The device options (chm config names) these parameters set."""
        return {
            f"ssd_{self.op}_lat_ns": self.lat_ns,
            f"ssd_{self.op}_bw_bps": self.bw_bps,
            "ssd_channels": self.channels,
        }


Array = np.ndarray[Any, Any]


def predict(
    size: float | Array, qd: float | Array, lat_s: float, bw: float, channels: int
) -> tuple[Array, Array]:
    """(mean latency s, bandwidth B/s) of the steady-state model."""
    s = np.asarray(size, dtype=float)
    q = np.asarray(qd, dtype=float)
    per_chan = lat_s + s * channels / bw
    iops = np.minimum(np.minimum(q, channels) / per_chan, bw / s)
    return q / iops, iops * s


def _error(pts: Sequence[Point], lat: Array, bw: Array, c: int) -> Array:
    """Sum of squared log errors for every (lat, bw) pair of the grids."""
    err = np.zeros(np.broadcast(lat, bw).shape)
    for p in pts:
        per_chan = lat + p.size_bytes * c / bw
        iops = np.minimum(min(p.queue_depth, c) / per_chan, bw / p.size_bytes)
        err += np.log(p.queue_depth / iops / p.latency_s) ** 2
        err += np.log(iops * p.size_bytes / p.bandwidth_Bps) ** 2
    return err


def fit(points: Sequence[Point], op: str = "read") -> Fit:
    """The (lat, bw, channels) that fit the ``op`` points best (see the module doc)."""
    pts = [p for p in points if p.op == op]
    if len(pts) < 2:
        raise ValueError(f"fit: need at least 2 {op} points, got {len(pts)}")
    lat_g = np.geomspace(1e-6, 1e-2, 161)[:, None]  # 1 us .. 10 ms
    bw_g = np.geomspace(1e8, 1e12, 161)[None, :]  # 0.1 .. 1000 GB/s
    best = (math.inf, 0.0, 0.0, 1)
    for c in range(1, MAX_CHANNELS + 1):
        e = _error(pts, lat_g, bw_g, c)
        i, j = np.unravel_index(int(np.argmin(e)), e.shape)
        if e[i, j] < best[0]:
            best = (float(e[i, j]), float(lat_g[i, 0]), float(bw_g[0, j]), c)
    _, lat, bw, c = best
    # refine around the best: two rounds of a finer grid
    for span in (1.1, 1.01):
        lat_f = np.geomspace(lat / span, lat * span, 81)[:, None]
        bw_f = np.geomspace(bw / span, bw * span, 81)[None, :]
        for cc in range(max(1, c - 2), min(MAX_CHANNELS, c + 2) + 1):
            e = _error(pts, lat_f, bw_f, cc)
            i, j = np.unravel_index(int(np.argmin(e)), e.shape)
            if e[i, j] <= best[0]:
                best = (float(e[i, j]), float(lat_f[i, 0]), float(bw_f[0, j]), cc)
        _, lat, bw, c = best
    rms = math.sqrt(best[0] / (2 * len(pts)))
    return Fit(op, round(lat * 1e9), round(bw), c, rms)


def residuals(points: Sequence[Point], f: Fit) -> list[tuple[Point, float, float]]:
    """Each ``f.op`` point with its relative latency and bandwidth error
    (model / point - 1)."""
    out = []
    for p in points:
        if p.op != f.op:
            continue
        lat, bw = predict(p.size_bytes, p.queue_depth, f.lat_ns / 1e9, f.bw_bps, f.channels)
        out.append((p, float(lat) / p.latency_s - 1, float(bw) / p.bandwidth_Bps - 1))
    return out


def parse_fio(doc: dict[str, object], op: str = "read") -> list[Point]:
    """Points from fio's JSON output (``--output-format=json``), one per job:
    block size and iodepth from the job's options, mean completion latency
    and bandwidth from its ``op`` statistics."""
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise ValueError("parse_fio: no jobs in fio's output")
    out = []
    for job in jobs:
        opts = job.get("job options", {})
        st = job.get(op, {})
        try:
            size = _size(str(opts["bs"]))
            qd = int(opts.get("iodepth", 1))
            lat = float(st["clat_ns"]["mean"]) / 1e9
            bw = float(st["bw_bytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"parse_fio: job {job.get('jobname')!r}: missing {exc}") from None
        if lat > 0 and bw > 0:
            out.append(Point(size, qd, lat, bw, op, f"fio {job.get('jobname', '')}".strip()))
    return out


def _size(text: str) -> int:
    t = text.strip().lower().rstrip("b").rstrip("i")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)


def fio_points(
    path: str | Path,
    sizes: Sequence[int],
    depths: Sequence[int],
    *,
    runtime_s: float = 2.0,
    file_bytes: int = 256 << 20,
    op: str = "read",
    fio: str = "fio",
) -> list[Point]:
    """Measures ``path`` (a file, created at ``file_bytes`` if missing) with
    fio: O_DIRECT random ``op`` s, io_uring, one job per (size, depth), each
    ``runtime_s`` long; their points."""
    if op not in ("read", "write"):
        raise ValueError(f"fio_points: op must be read or write, got {op!r}")
    args = [
        fio,
        "--output-format=json",
        f"--filename={path}",
        f"--size={file_bytes}",
        "--direct=1",
        "--ioengine=io_uring",
        f"--rw=rand{op}",
        "--time_based",
        f"--runtime={runtime_s}s",
        "--stonewall",
    ]
    for s in sizes:
        for q in depths:
            args += [f"--name=bs{s}-qd{q}", f"--bs={s}", f"--iodepth={q}"]
    p = subprocess.run(args, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"fio failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return parse_fio(json.loads(p.stdout), op)


def spec_points(entries: Sequence[dict[str, object]]) -> list[Point]:
    """Points from ``fw_spec/timing_presets.yaml`` entries: ``size``, ``qd``
    and one of ``latency_us`` or ``bandwidth_GBps`` (the other by Little's
    law), ``op`` and ``source``."""
    out = []
    for e in entries:
        try:
            size, qd = int(str(e["size"])), int(str(e["qd"]))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"spec_points: {e!r}: needs integer size and qd ({exc})") from None
        if ("latency_us" in e) == ("bandwidth_GBps" in e):
            raise ValueError(f"spec_points: {e!r}: give one of latency_us or bandwidth_GBps")
        if "latency_us" in e:
            lat = float(str(e["latency_us"])) / 1e6
            bw = qd * size / lat
        else:
            bw = float(str(e["bandwidth_GBps"])) * 1e9
            lat = qd * size / bw
        out.append(Point(size, qd, lat, bw, str(e.get("op", "read")), str(e.get("source", ""))))
    return out
