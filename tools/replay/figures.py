#!/usr/bin/env python3
"""The paper's figures 8, 9, 10 and 12, one command each (chm.sim.replay.figures).

Each subcommand prints its parameters (every one overridable with --set
NAME=VALUE), replays the figure's systems, writes to --out (with --json PATH,
results.json's document also goes to PATH)

    results.json     parameters, summary, claims with their verdicts
    per_request.csv  one row per (system, request); CXL-HM rows add device columns
    per_turn.csv     one row per (system, turn)
    <figure>.png     the figure

and prints the verdicts against the paper's statements last (exit 1 when
one is missed). --quick replays a small workload on a scaled device, a
smoke test: too small for the paper's statements, it is judged on producing
every figure, each printed beside its full-run target (sizes and policy:
chm.sim.replay.quick); without --out it writes to a temporary directory, removed at exit.

    python tools/replay/figures.py fig8 --out out/fig8
    python tools/replay/figures.py fig9 --out out/fig9 --timeouts 0.1,2
    python tools/replay/figures.py fig10 --out out/fig10 --buffers 5G,10G,20G,40G,80G
    python tools/replay/figures.py fig12 --out out/fig12 --set redis_bytes=32G
    python tools/replay/figures.py fig12 --quick --json out/fig12-quick.json
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _benchlib as bl

from chm.errors import InvalidArgument
from chm.sim.replay import figures as F
from chm.sim.replay import quick as Q
from chm.sim.replay.params import apply_overrides, param_rows, parse_overrides
from chm.sim.replay.results import write_csv, write_json
from chm.sizes import parse_size

console = Console(highlight=False, markup=False)
T = TypeVar("T")


def _params(default: T, quick: bool, sets: tuple[str, ...], figure: str) -> T:
    over = Q.QUICK_OVERRIDES | Q.QUICK_FIGURE_OVERRIDES[figure] if quick else {}
    try:
        over |= parse_overrides(sets)
        return apply_overrides(default, over)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--set") from None


def _run(
    name: str,
    params: Any,
    work: Callable[[Callable[[int], None]], F.FigureData],
    total: int,
    out: Path | None,
    no_plots: bool,
    plot: Callable[[F.FigureData, Path], None],
    quick: bool,
    json_path: str | None,
) -> None:
    console.print(f"{name} parameters:")
    for pname, value, unit, meaning in param_rows(params):
        console.print(f"  {pname} = {value} {unit}".rstrip() + f"  ({meaning})")
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("replaying", total=total)
            fig = work(lambda n: bar.advance(task, n))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    turns = fig.turns()
    for t in turns:
        if t.turn is not None:
            console.print(
                f"  {t.system:<16} turn {t.turn + 1}: hit rate {t.hit_rate:6.1%}, "
                f"mean TTFT {t.mean_ttft_s:8.3f} s"
            )
    for label, pts in fig.sweeps.items():
        console.print(f"  {label}: " + ", ".join(f"{x:g}: {y:.3f}" for x, y in pts))
    for key in (
        "hymcache_queued_ttft_mean_s",
        "hymcache_pd_transfer_mean_s",
        "hymcache_decode_queue_mean_s",
        "hymcache_decode_step_mean_s",
    ):
        if key in fig.summary:
            console.print(f"  {key} = {fig.summary[key]:.4f} s")
    console.print(f"replayed in {wall:.1f} s wall, {cpu:.1f} s CPU")
    v = bl.Verdicts(name, quick=quick)
    for c in fig.claims:
        if quick:
            # a smoke run's workload is too small for the paper's statements:
            # it is judged on producing the figure; the full target is shown
            label, met = Q.smoke_claim(c.name, c.value, c.target, higher=c.higher)
            v.check(label, float(met), 1.0, fmt=lambda x: "yes" if x >= 1 else "no")
            continue
        v.check(
            f"{c.name} (paper: {c.paper})",
            c.value,
            c.target,
            higher=c.higher,
            fmt=lambda x: f"{x:.3g}",
        )
    doc = {
        "figure": fig.figure,
        "environment": bl.environment(),
        "parameters": dataclasses.asdict(params),
        "summary": fig.summary,
        "claims": [dataclasses.asdict(c) | {"met": c.met} for c in fig.claims],
        "wall_s": wall,
        "cpu_s": cpu,
        "verdicts": v.to_dict(),
    }
    with tempfile.TemporaryDirectory(prefix=f"chm-{name}-") as tmp:
        where = out if out is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        write_json(where / "results.json", doc)
        write_csv(where / "per_request.csv", fig.rows())
        write_csv(where / "per_turn.csv", [t.row() for t in turns])
        if not no_plots:
            try:
                plot(fig, where / f"{fig.figure}.png")
            except ImportError as exc:
                console.print(f"no plot: {exc}")
        if out is not None:
            console.print(f"wrote results to {out}")
        else:
            console.print("no --out: the files went to a temporary directory, removed at exit")
    bl.write_json(json_path, doc)
    sys.exit(v.finish())


def _plot_turns(title: str) -> Callable[[F.FigureData, Path], None]:
    def plot(fig: F.FigureData, path: Path) -> None:
        from chm.sim.replay.plots import plot_per_turn

        plot_per_turn(fig.turns(), path, title=title)

    return plot


_common = [
    click.option(
        "--set", "sets", multiple=True, metavar="NAME=VALUE", help="Override a parameter."
    ),
    click.option(
        "--quick",
        is_flag=True,
        help="A smoke run: a small workload on a scaled device, each figure judged on "
        "being measured (--out defaults to a temporary directory).",
    ),
    click.option("--no-plots", is_flag=True),
    click.option(
        "--out",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Directory for results.json, the CSV files and the plot (required unless "
        "--quick or --json; without it they go to a temporary directory, removed at exit).",
    ),
    click.option(
        "--json",
        "json_path",
        default=None,
        callback=lambda ctx, param, value: bl.json_path_option(value),
        help="Write the results as JSON here (results.json's document: parameters, "
        "summary, claims, verdicts).",
    ),
]


def _need_out(out: Path | None, quick: bool, json_path: str | None) -> None:
    if out is None and not quick and json_path is None:
        raise click.UsageError("Missing option '--out' (needed unless --quick or --json is given).")


def common(f: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(_common):
        f = opt(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Regenerate one of the paper's figures."""


@main.command()
@click.option(
    "--baseline",
    "baseline_sets",
    multiple=True,
    metavar="SCOPE.NAME=VALUE",
    help="Override a baseline (e.g. remote-dram-pool.tier.latency_s=5e-5).",
)
@click.option(
    "--session-rates",
    default="1",
    show_default=True,
    help="Conversation start rates (1/s) the hit-rate gain is also replayed with.",
)
@common
def fig8(
    baseline_sets: tuple[str, ...],
    session_rates: str,
    sets: tuple[str, ...],
    quick: bool,
    no_plots: bool,
    out: Path | None,
    json_path: str | None,
) -> None:
    """Fig. 8: PD-disaggregated 4P-1D-1S, Qwen2.5-32B, against Mooncake's 1 TB pool."""
    _need_out(out, quick, json_path)
    p = _params(F.PdParams(), quick, sets, "fig8")
    rates = _floats(session_rates)
    total = p.users * p.turns * 4
    _run(
        "fig8",
        p,
        lambda prog: F.fig8_pd(p, baseline_sets, prog, rates),
        total,
        out,
        no_plots,
        _plot_turns("Fig. 8: PD 4P-1D-1S, Qwen2.5-32B"),
        quick,
        json_path,
    )


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected numbers") from None


@main.command()
@click.option(
    "--timeouts",
    default="0.1,2",
    show_default=True,
    help="Load timeouts (s) the NVMe-oF systems are also replayed with.",
)
@common
def fig9(
    timeouts: str,
    sets: tuple[str, ...],
    quick: bool,
    no_plots: bool,
    out: Path | None,
    json_path: str | None,
) -> None:
    """Fig. 9: NVMe-oF raw block device vs XFS, with the timeout fallback."""
    _need_out(out, quick, json_path)
    p = _params(F.NvmeofParams(), quick, sets, "fig9")
    ts = _floats(timeouts)
    total = p.users * p.turns * 4

    def plot(fig: F.FigureData, path: Path) -> None:
        from chm.sim.replay.plots import plot_per_turn

        plot_per_turn(fig.turns(), path, title=f"Fig. 9: NVMe-oF, timeout {p.load_timeout_s:g} s")

    work = lambda prog: F.fig9_nvmeof(p, ts, prog)  # noqa: E731
    _run("fig9", p, work, total, out, no_plots, plot, quick, json_path)


@main.command()
@click.option(
    "--buffers",
    default="5G,10G,20G,40G,80G",
    show_default=True,
    help="Host transfer-buffer sizes (must include knee_bytes and a larger one).",
)
@click.option(
    "--drains",
    default="12.5e9,50e9",
    show_default=True,
    help="Mooncake drain rates (B/s) its knee ratio is also replayed with.",
)
@common
def fig10(
    buffers: str,
    drains: str,
    sets: tuple[str, ...],
    quick: bool,
    no_plots: bool,
    out: Path | None,
    json_path: str | None,
) -> None:
    """Fig. 10: host transfer-buffer sweep, Mooncake vs HyMCache."""
    _need_out(out, quick, json_path)
    p = _params(F.TransferBufferParams(), quick, sets, "fig10")
    try:
        bufs = [parse_size(b.strip()) for b in buffers.split(",") if b.strip()]
    except InvalidArgument as exc:
        raise click.BadParameter(f"--buffers {buffers!r}: {exc.strerror}") from None
    if quick and buffers == "5G,10G,20G,40G,80G":
        bufs = list(Q.QUICK_TRANSFER_BUFFERS)
    total = p.users * p.turns * 2 * len(bufs)

    def plot(fig: F.FigureData, path: Path) -> None:
        from chm.sim.replay.plots import plot_size_sweep

        plot_size_sweep(
            {k: [(int(x), y) for x, y in v] for k, v in fig.sweeps.items()},
            path,
            xlabel="host transfer buffer",
            ylabel="mean TTFT (s)",
            title="Fig. 10: transfer-buffer sensitivity",
        )

    ds = _floats(drains)
    work = lambda prog: F.fig10_transfer_buffer(p, bufs, prog, ds)  # noqa: E731
    _run("fig10", p, work, total, out, no_plots, plot, quick, json_path)


@main.command()
@common
def fig12(
    sets: tuple[str, ...],
    quick: bool,
    no_plots: bool,
    out: Path | None,
    json_path: str | None,
) -> None:
    """Fig. 12: Redis-backed LMCache (store failures when full) vs HyMCache."""
    _need_out(out, quick, json_path)
    p = _params(F.RedisParams(), quick, sets, "fig12")
    total = p.users * p.turns * 3
    _run(
        "fig12",
        p,
        lambda prog: F.fig12_redis(p, prog),
        total,
        out,
        no_plots,
        _plot_turns("Fig. 12: Redis-backed LMCache vs HyMCache"),
        quick,
        json_path,
    )


if __name__ == "__main__":
    main()
