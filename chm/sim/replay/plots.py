"""Plots of replay results (PNG, matplotlib; install ``chm[plots]``).

Each function takes results of :mod:`chm.sim.replay` and writes one PNG. They use
matplotlib's object API (no pyplot, no global state), so they are safe in
servers and tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from chm.sim.replay.results import TurnSummary
from chm.sizes import format_size

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "plot_capacity_sweep",
    "plot_load_bandwidth",
    "plot_per_turn",
    "plot_size_sweep",
    "plot_wbuf_sweep",
]


_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_DASHES = ("-", "--", "-.", ":")


def _figure(width: float, height: float, panels: int = 1) -> tuple[Figure, list[Axes]]:
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - exercised when matplotlib is absent
        raise ImportError(
            "plots need matplotlib: pip install 'chm[plots]' (or matplotlib)"
        ) from exc
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def plot_per_turn(
    summaries: Iterable[TurnSummary], path: str | os.PathLike[str], *, title: str = ""
) -> None:
    """Per-turn prefix hit rate and mean modeled TTFT, one line per system.

    Summaries without a turn are left out (a trace without sessions has no
    turns); with none left this is a ValueError.
    """
    by_system: dict[str, list[TurnSummary]] = {}
    for s in summaries:
        if s.turn is not None:
            by_system.setdefault(s.system, []).append(s)
    if not by_system:
        raise ValueError("plot_per_turn: no summary has a turn")
    fig, (hit, ttft) = _figure(10, 4, panels=2)
    for i, (system, rows) in enumerate(by_system.items()):
        rows.sort(key=lambda r: r.turn or 0)
        turns = [(r.turn or 0) + 1 for r in rows]
        # distinct markers and dashes, so systems with equal results stay visible
        m, ls = _MARKERS[i % len(_MARKERS)], _DASHES[i % len(_DASHES)]
        hit.plot(turns, [100 * r.hit_rate for r in rows], label=system, marker=m, ls=ls)
        ttft.plot(turns, [r.mean_ttft_s for r in rows], label=system, marker=m, ls=ls)
    hit.set(xlabel="turn", ylabel="prefix hit rate (%)", ylim=(0, 100))
    ttft.set(xlabel="turn", ylabel="mean modeled TTFT (s)", ylim=(0, None))
    for ax in (hit, ttft):
        ax.grid(alpha=0.3)
        ax.set_xticks(sorted({(r.turn or 0) + 1 for rows in by_system.values() for r in rows}))
    hit.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=120)


def plot_capacity_sweep(
    sweeps: Mapping[str, Sequence[tuple[int, float]]],
    path: str | os.PathLike[str],
    *,
    title: str = "",
) -> None:
    """Prefix hit rate vs tier capacity (bytes, log scale), one line per label."""
    if not sweeps or not any(sweeps.values()):
        raise ValueError("plot_capacity_sweep: no points")
    fig, (ax,) = _figure(6, 4)
    ticks: set[int] = set()
    for i, (label, points) in enumerate(sweeps.items()):
        pts = sorted(points)
        ticks.update(c for c, _ in pts)
        m, ls = _MARKERS[i % len(_MARKERS)], _DASHES[i % len(_DASHES)]
        ax.plot([c for c, _ in pts], [100 * h for _, h in pts], label=label, marker=m, ls=ls)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks), [format_size(t, exact=False) for t in sorted(ticks)])
    ax.set(xlabel="tier capacity", ylabel="prefix hit rate (%)", ylim=(0, 100))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=120)


def plot_load_bandwidth(
    series: Mapping[str, Sequence[tuple[float, float]]],
    path: str | os.PathLike[str],
    *,
    xlabel: str = "turn",
    title: str = "",
) -> None:
    """Effective load bandwidth (B/s, plotted in GB/s) per x, one line per system."""
    if not series or not any(series.values()):
        raise ValueError("plot_load_bandwidth: no points")
    fig, (ax,) = _figure(6, 4)
    for i, (label, points) in enumerate(series.items()):
        pts = sorted(points)
        m, ls = _MARKERS[i % len(_MARKERS)], _DASHES[i % len(_DASHES)]
        ax.plot([x for x, _ in pts], [y / 1e9 for _, y in pts], label=label, marker=m, ls=ls)
    ax.set(xlabel=xlabel, ylabel="effective load bandwidth (GB/s)", ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=120)


def plot_wbuf_sweep(
    points: Sequence[tuple[int, float, float]],
    path: str | os.PathLike[str],
    *,
    title: str = "",
) -> None:
    """Write skip rate and load bandwidth (B/s) vs write-buffer size (bytes)."""
    if not points:
        raise ValueError("plot_wbuf_sweep: no points")
    pts = sorted(points)
    fig, (skip, bw) = _figure(10, 4, panels=2)
    xs = [p[0] for p in pts]
    skip.plot(xs, [100 * p[1] for p in pts], marker="o")
    bw.plot(xs, [p[2] / 1e9 for p in pts], marker="s", ls="--")
    skip.set(xlabel="write buffer", ylabel="writes skipped (%)", ylim=(0, 100))
    bw.set(xlabel="write buffer", ylabel="load bandwidth (GB/s)", ylim=(0, None))
    for ax in (skip, bw):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [format_size(x, exact=False) for x in xs])
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=120)


def plot_size_sweep(
    series: Mapping[str, Sequence[tuple[int, float]]],
    path: str | os.PathLike[str],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
) -> None:
    """A value vs a size (bytes, log scale), one line per label."""
    if not series or not any(series.values()):
        raise ValueError("plot_size_sweep: no points")
    fig, (ax,) = _figure(6, 4)
    ticks: set[int] = set()
    for i, (label, points) in enumerate(series.items()):
        pts = sorted(points)
        ticks.update(x for x, _ in pts)
        m, ls = _MARKERS[i % len(_MARKERS)], _DASHES[i % len(_DASHES)]
        ax.plot([x for x, _ in pts], [y for _, y in pts], label=label, marker=m, ls=ls)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks), [format_size(t, exact=False) for t in sorted(ticks)])
    ax.set(xlabel=xlabel, ylabel=ylabel, ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=120)
