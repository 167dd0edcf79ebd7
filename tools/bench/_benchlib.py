"""Shared helpers of the benchmark scripts: statistics, a filled data file,
fio, the result table, the JSON report and the verdicts.

Numbers, not asserts: every figure printed comes from a measurement taken in
the same run; targets are compared against, never assumed. Every benchmark
records its targets in a :class:`Verdicts` and ends with
``raise SystemExit(verdicts.finish())``: the verdict lines are the last
lines printed, and a missed target is a non-zero exit status.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Wide enough for the tables when stdout is a file or a pipe.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 132)

MiB = 1 << 20
GiB = 1 << 30


# ---------------------------------------------------------------- statistics


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs: Sequence[float]) -> tuple[float, float]:
    """(min, max), NaNs when empty."""
    return (min(xs), max(xs)) if xs else (float("nan"), float("nan"))


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """a[i] / b[i] for runs measured next to each other (drift cancels)."""
    return [x / y for x, y in zip(a, b, strict=False) if y]


def rotate(items: Sequence[Any], k: int) -> list[Any]:
    """items rotated by k: alternating repetitions start with a different one."""
    if not items:
        return []
    k %= len(items)
    return list(items[k:]) + list(items[:k])


@dataclass
class Series:
    """Repeated measurements of one quantity."""

    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    extra: list[dict[str, Any]] = field(default_factory=list)

    def add(self, value: float, **extra: Any) -> None:
        self.values.append(value)
        self.extra.append(extra)

    @property
    def median(self) -> float:
        return median(self.values)

    def to_dict(self) -> dict[str, Any]:
        lo, hi = spread(self.values)
        return {
            "name": self.name,
            "unit": self.unit,
            "median": self.median,
            "min": lo,
            "max": hi,
            "values": self.values,
            "runs": self.extra,
        }


# ---------------------------------------------------------------- formatting


def fmt_bw(bps: float) -> str:
    if bps != bps:
        return "n/a"
    return f"{bps / MiB:,.0f} MiB/s"


def fmt_rate(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:,.0f}/s"


def fmt_ratio(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}x"


def fmt_pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def verdict(value: float, target: float, *, higher: bool = True) -> str:
    """'met' / 'MISSED' against a target (NaN is missed)."""
    if value != value:
        return "MISSED (no data)"
    ok = value >= target if higher else value <= target
    return "met" if ok else "MISSED"


@dataclass(frozen=True)
class Target:
    """One measured figure against its target.

    ``smoke``: judged as a ``--quick`` run judges a speed figure: met when a
    figure was measured (finite, and above zero when higher is better); the
    full target is still shown beside it.
    """

    name: str
    value: float
    target: float
    higher: bool = True
    fmt: Callable[[float], str] = fmt_ratio
    smoke: bool = False

    @property
    def met(self) -> bool:
        """NaN (nothing measured) is never met."""
        v = self.value
        if v != v:
            return False
        if self.smoke:
            return math.isfinite(v) and (v > 0 if self.higher else True)
        return v >= self.target if self.higher else v <= self.target

    def line(self) -> str:
        op = ">=" if self.higher else "<="
        verdict_ = "met" if self.met else "MISSED"
        if self.smoke:
            want = "a figure above zero" if self.higher else "a finite figure"
            return (
                f"{verdict_}: {self.name} = {self.fmt(self.value)} (--quick smoke target: "
                f"{want}; a full run's target is {op} {self.fmt(self.target)})"
            )
        return (
            f"{verdict_}: {self.name} = {self.fmt(self.value)} "
            f"(target {op} {self.fmt(self.target)})"
        )


class Verdicts:
    """The targets one benchmark run checked, reported last.

    ``check()`` records a figure and returns its verdict text for inline use;
    ``finish()`` prints one line per target and a summary line, last, and
    returns the exit status: 0 when every target was met (or none was
    measured), 1 when one was missed.

    ``quick``: the run is a ``--quick`` smoke run, whose sizes are too small
    for speed targets to mean anything. A figure checked with ``speed=True``
    is then judged only on having been measured (a smoke target: exit 0 when
    the code works); correctness figures (lost or wrong blocks, hit counts,
    virtual-time results) keep their targets in every run.
    """

    def __init__(self, benchmark: str, *, quick: bool = False) -> None:
        self.benchmark = benchmark
        self.quick = quick
        self.targets: list[Target] = []

    def check(
        self,
        name: str,
        value: float,
        target: float,
        *,
        higher: bool = True,
        fmt: Callable[[float], str] = fmt_ratio,
        speed: bool = False,
    ) -> str:
        t = Target(name, float(value), float(target), higher, fmt, smoke=speed and self.quick)
        self.targets.append(t)
        return "met" if t.met else ("MISSED (no data)" if value != value else "MISSED")

    @property
    def missed(self) -> list[Target]:
        return [t for t in self.targets if not t.met]

    def to_dict(self) -> dict[str, Any]:
        return {
            "quick": self.quick,
            "targets": [
                {
                    "name": t.name,
                    "value": t.value,
                    "target": t.target,
                    "smoke": t.smoke,
                    "met": t.met,
                }
                for t in self.targets
            ],
            "all_met": not self.missed,
        }

    def finish(self) -> int:
        """Prints the verdict lines (the run's last output); returns the exit status."""
        out = Console(highlight=False, markup=False, width=10_000)
        out.print()
        kind = " (--quick: speed figures judged as smoke targets)" if self.quick else ""
        out.print(f"{self.benchmark} verdicts{kind}:")
        for t in self.targets:
            out.print(f"  {t.line()}")
        n, missed = len(self.targets), self.missed
        if not n:
            out.print(f"{self.benchmark}: no target was measured in this run")
            return 0
        if missed:
            names = ", ".join(t.name for t in missed)
            out.print(f"{self.benchmark}: MISSED {len(missed)} of {n} targets ({names})")
            return 1
        out.print(f"{self.benchmark}: all {n} targets met")
        return 0


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for r in rows:
        t.add_row(*(str(x) for x in r))
    console.print(t)


def progress() -> Progress:
    """A progress bar that goes to stderr, so stdout stays a clean report."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


# ---------------------------------------------------------------- environment


def environment() -> dict[str, Any]:
    """What the numbers were measured on."""
    import chm

    env: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "chm": chm.__version__,
        "chm_c": chm.version(),
        "argv": sys.argv,
    }
    env["loadavg_at_start"] = loadavg()
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                if k in ("MemTotal", "MemAvailable"):
                    env[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return env


def loadavg() -> list[str]:
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[:3]
    except OSError:
        return []


def block_queue(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The request-queue limits of the block device holding path (if found)."""
    st = os.stat(Path(path).parent if not Path(path).exists() else path)
    base = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    q = base / "queue"
    if not q.exists():  # a partition: the queue belongs to the parent disk
        q = base.resolve().parent / "queue"
    out: dict[str, Any] = {"device": base.resolve().name}
    for k in ("max_segments", "max_sectors_kb", "nr_requests", "rotational", "scheduler"):
        with contextlib.suppress(OSError):
            out[k] = (q / k).read_text().strip()
    return out


def rss_now() -> int:
    """Resident set size of this process now, bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def json_path_option(value: str | None) -> str | None:
    """A click tool's --json: the file must be creatable, its directory
    existing (checked before the run, a usage error otherwise)."""
    import click

    if value is None:
        return None
    p = Path(value)
    if p.is_dir():
        raise click.BadParameter(f"{value!r} is a directory", param_hint="--json")
    if not p.resolve().parent.is_dir():
        raise click.BadParameter(
            f"{value!r}: directory {str(p.resolve().parent)!r} does not exist",
            param_hint="--json",
        )
    return value


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    console.print(f"JSON results written to {p}")


# ---------------------------------------------------------------- data file


def _allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _looks_filled(path: Path, size: int) -> bool:
    """Allocated to at least size and with non-zero bytes where sampled."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    if st.st_size < size or _allocated_bytes(path) < size:
        return False
    samples = 16
    with open(path, "rb") as f:
        for i in range(samples):
            off = (size // samples) * i
            f.seek(off)
            if not any(f.read(4096)):
                return False
    return True


def ensure_filled_file(path: str | os.PathLike[str], size: int, *, quiet: bool = False) -> bool:
    """Makes path a regular file of at least size bytes of written, non-zero data.

    Sparse holes (or unwritten extents) are served by the filesystem without
    any device I/O, so a read benchmark over them measures nothing. The data
    is written with fio (direct I/O, fresh random buffers) when available,
    else from os.urandom. Returns True when the file was (re)written.
    """
    p = Path(path)
    if _looks_filled(p, size):
        return False
    p.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:
        console.print(f"writing {size / GiB:.2f} GiB of random data to {p} ...")
    t0 = time.perf_counter()
    fio = shutil.which("fio")
    if fio:
        bs = 16 * MiB if size % (16 * MiB) == 0 else 4096
        cmd = [
            fio,
            "--name=fill",
            f"--filename={p}",
            f"--size={size}",
            f"--bs={bs}",
            "--rw=write",
            "--direct=1",
            "--ioengine=psync",
            "--refill_buffers",
            "--end_fsync=1",
            "--output-format=terse",
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    else:
        chunk = 16 * MiB
        with open(p, "wb") as f:
            left = size
            while left:
                n = min(chunk, left)
                f.write(os.urandom(n))
                left -= n
            f.flush()
            os.fsync(f.fileno())
    if not _looks_filled(p, size):
        raise RuntimeError(f"{p}: still not fully allocated with data after filling")
    if not quiet:
        console.print(f"  done in {time.perf_counter() - t0:.1f} s")
    return True


# ---------------------------------------------------------------- fio


def fio_read(
    path: str | os.PathLike[str],
    size: int,
    *,
    bs: int,
    iodepth: int,
    offset: int = 0,
    engine: str = "io_uring",
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """One sequential O_DIRECT read of [offset, offset+size) with fio.

    Returns fio's own figures: bandwidth in bytes/s, runtime in ms, bytes.
    """
    fio = shutil.which("fio")
    if not fio:
        raise RuntimeError("fio not found (apt-get install fio)")
    cmd = [
        fio,
        "--name=chm-ref",
        f"--filename={os.fspath(path)}",
        f"--offset={offset}",
        f"--size={size}",
        f"--bs={bs}",
        f"--iodepth={iodepth}",
        "--rw=read",
        "--direct=1",
        f"--ioengine={engine}",
        "--output-format=json",
        *extra,
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    j = json.loads(out[out.index("{") :])
    job = j["jobs"][0]
    if job.get("error"):
        raise RuntimeError(f"fio error {job['error']}: {' '.join(cmd)}")
    rd = job["read"]
    return {
        "bw_bps": float(rd["bw_bytes"]),
        "runtime_ms": float(rd["runtime"]),
        "bytes": int(rd["io_bytes"]),
        "clat_mean_us": float(rd["clat_ns"]["mean"]) / 1000.0,
        "cmd": " ".join(cmd),
    }


# ---------------------------------------------------------------- timing


def run_for(seconds: float, step: Callable[[int], int], chunk: int) -> tuple[int, float]:
    """Calls step(chunk) (which does chunk operations and returns how many it
    did) until seconds have passed; returns (operations, elapsed)."""
    done = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        done += step(chunk)
        now = time.perf_counter()
        if now >= deadline:
            return done, now - t0
