#!/usr/bin/env python3
"""Replays a multi-turn workload through the baseline KV caches.

The workload is synthetic multi-turn chat (chm.sim.workloads.ChatWorkload) or a
trace in the Mooncake format (--trace). With --arrival closed, --concurrency
users at a time each send their next turn a think time after the modeled
first token, so each system's own TTFT paces its replay. Every system of chm.sim.replay.baselines
replays the same requests; the tool prints the parameters it used and a
summary per system, and writes to --out:

    results.json     parameters, workload, per-turn summaries, capacity sweep
    per_request.csv  one row per (system, request)
    per_turn.csv     one row per (system, turn)
    per_turn.png     prefix hit rate and modeled TTFT per turn per system
    capacity.png     hit rate of one shared LRU tier vs its capacity

    python tools/replay/replay_baselines.py --out out/replay
    python tools/replay/replay_baselines.py --save-trace chat.jsonl --out out/s
    python tools/replay/replay_baselines.py --trace chat.jsonl --out out/t
    python tools/replay/replay_baselines.py --set gpu.mfu=0.4 --set fs-ssd.tier.latency_s=1e-3 ...
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from chm.errors import InvalidArgument
from chm.sim.replay import (
    GPUS,
    MODELS,
    SYSTEMS,
    RequestResult,
    TurnSummary,
    capacity_sweep,
    configure,
    param_rows,
    per_turn,
    simulate,
    simulate_closed_loop,
    write_csv,
    write_json,
)
from chm.sim.replay.plots import plot_capacity_sweep, plot_per_turn
from chm.sim.workloads import (
    ChatWorkload,
    Request,
    TraceFormatError,
    generate_chat,
    read_mooncake,
    synthetic_trace,
    trace_requests,
    write_mooncake,
)
from chm.sizes import format_size, parse_size

console = Console(highlight=False, markup=False)  # paths and messages print as they are


def _range(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, int]:
    lo, sep, hi = value.partition(":")
    try:
        return (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected LOW:HIGH or N tokens", ctx, param) from None


def _sizes(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        sizes = [parse_size(v) for v in value.split(",") if v.strip()]
    except InvalidArgument as exc:
        raise click.BadParameter(exc.strerror or str(exc), ctx, param) from None
    if not sizes or min(sizes) <= 0:
        raise click.BadParameter(f"{value!r}: expected positive sizes, e.g. 64G,1T", ctx, param)
    return sizes


def _params_table(params: dict[str, dict[str, str]]) -> Table:
    t = Table(title="parameters (override with --set SCOPE.NAME=VALUE)", title_justify="left")
    t.add_column("scope", style="bold")
    t.add_column("NAME=VALUE", overflow="fold")
    for scope, values in params.items():
        t.add_row(scope, ", ".join(f"{k}={v}" for k, v in values.items()))
    return t


def _write_outputs(
    out: Path,
    workload: dict[str, Any],
    params: dict[str, Any],
    results: list[RequestResult],
    turns_summary: list[TurnSummary],
    sweep: list[tuple[int, float]],
    no_plots: bool,
    label: str,
) -> list[str]:
    """Writes the JSON, CSVs and PNGs; returns the file names written."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(
        out / "results.json",
        {
            "workload": workload,
            "parameters": params,
            "per_turn": [t.row() for t in turns_summary],
            "capacity_sweep": [{"capacity_bytes": c, "hit_rate": h} for c, h in sweep],
        },
    )
    write_csv(out / "per_request.csv", [r.row() for r in results])
    write_csv(out / "per_turn.csv", [t.row() for t in turns_summary])
    written = ["results.json", "per_request.csv", "per_turn.csv"]
    if no_plots:
        return written
    try:
        if any(t.turn is not None for t in turns_summary):
            plot_per_turn(turns_summary, out / "per_turn.png", title=label)
            written.append("per_turn.png")
        else:
            console.print("no per-turn plot: the requests have no turns (--infer-sessions)")
        plot_capacity_sweep({"shared LRU tier, no G1": sweep}, out / "capacity.png", title=label)
        written.append("capacity.png")
    except ImportError as exc:  # matplotlib is an optional extra
        console.print(f"no plots: {exc}", style="yellow", markup=False)
    return written


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--trace",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A Mooncake-format trace (JSON lines); default: synthetic chat.",
)
@click.option("--infer-sessions", is_flag=True, help="Infer a trace's turns from its prefixes.")
@click.option("--users", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--turns", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--system-prompt-tokens", type=click.IntRange(min=0), default=2048, show_default=True)
@click.option("--user-tokens", default="4000:12000", callback=_range, show_default=True)
@click.option("--output-tokens", default="200:1000", callback=_range, show_default=True)
@click.option("--think-time", type=click.FloatRange(min=0), default=5.0, show_default=True)
@click.option(
    "--arrival", type=click.Choice(["poisson", "closed"]), default="poisson", show_default=True
)
@click.option("--session-rate", type=click.FloatRange(min=0, min_open=True), default=1.0)
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--block-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--model", type=click.Choice(list(MODELS)), default="llama-3.1-8b", show_default=True)
@click.option("--gpu", type=click.Choice(list(GPUS)), default="a100-80g", show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--systems", default=",".join(SYSTEMS), show_default=True)
@click.option("--set", "sets", multiple=True, metavar="SCOPE.NAME=VALUE")
@click.option("--capacities", default="16G,64G,256G,1T,2T", callback=_sizes, show_default=True)
@click.option(
    "--save-trace",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the synthetic workload here as a Mooncake-format trace.",
)
@click.option("--no-plots", is_flag=True, help="Do not write the PNGs.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def main(
    trace: Path | None,
    infer_sessions: bool,
    users: int,
    turns: int,
    system_prompt_tokens: int,
    user_tokens: tuple[int, int],
    output_tokens: tuple[int, int],
    think_time: float,
    arrival: str,
    session_rate: float,
    concurrency: int,
    seed: int,
    block_tokens: int,
    model: str,
    gpu: str,
    workers: int,
    systems: str,
    sets: tuple[str, ...],
    capacities: list[int],
    save_trace: Path | None,
    no_plots: bool,
    out: Path,
) -> None:
    """Replay a workload through the baseline KV caches; write JSON, CSV and plots."""
    try:
        setup = configure(model, gpu, [s.strip() for s in systems.split(",") if s.strip()], sets)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    workload: dict[str, Any]
    requests: list[Request]
    if trace is not None:
        if save_trace is not None:
            raise click.UsageError(
                "--save-trace writes a synthetic workload; --trace is one already"
            )
        try:
            requests = trace_requests(
                read_mooncake(trace), block_tokens=block_tokens, infer_sessions=infer_sessions
            )
        except TraceFormatError as exc:
            raise click.ClickException(str(exc)) from None
        if not requests:
            raise click.ClickException(f"{trace}: the trace has no requests")
        workload = {"trace": str(trace), "requests": len(requests), "block_tokens": block_tokens}
    else:
        try:
            wl = ChatWorkload(
                users=users,
                turns=turns,
                system_prompt_tokens=system_prompt_tokens,
                user_tokens=user_tokens,
                output_tokens=output_tokens,
                think_time_s=think_time,
                arrival=arrival,  # type: ignore[arg-type]  # click.Choice checked it
                session_rate_per_s=session_rate,
                concurrency=concurrency,
                block_tokens=block_tokens,
                seed=seed,
            )
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        requests = generate_chat(wl)
        workload = dataclasses.asdict(wl) | {"requests": len(requests)}
        if save_trace is not None:
            n = write_mooncake(save_trace, synthetic_trace(wl))
            console.print(f"wrote the workload as a Mooncake trace: {save_trace} ({n} lines)")

    pm = setup.prefill
    try:
        hbm_kv = pm.hbm_kv_bytes()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    shown: dict[str, dict[str, str]] = {}
    scoped: list[tuple[str, object]] = [("model", pm.model), ("gpu", pm.gpu)]
    for name, spec in setup.systems.items():
        scoped.append((name, spec))
        if spec.tier_capacity_bytes:  # a system without a tier loads nothing
            scoped.append((f"{name}.tier", spec.tier))
    for scope, obj in scoped:
        shown[scope] = {r[0]: r[1] for r in param_rows(obj) if r[0] != "tier"}
    derived = {
        "block_bytes": pm.model.block_bytes(block_tokens),
        "hbm_kv_bytes_per_worker": hbm_kv,
        "workers": workers,
    }
    shown["derived"] = {k: str(v) for k, v in derived.items()}
    params: dict[str, Any] = {
        "model": dataclasses.asdict(pm.model),
        "gpu": dataclasses.asdict(pm.gpu),
        "systems": {n: dataclasses.asdict(s) for n, s in setup.systems.items()},
        "derived": derived,
    }
    console.print(_params_table(shown))
    console.print(
        f"workload: {len(requests)} requests, {sum(len(r.block_keys) for r in requests)} "
        f"blocks of {block_tokens} tokens ({format_size(pm.model.block_bytes(block_tokens))}); "
        f"{pm.gpu.name} leaves {format_size(hbm_kv, exact=False)} of HBM "
        "for KV per worker"
    )

    results: list[RequestResult] = []
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("replaying", total=len(requests) * len(setup.systems) + len(capacities))
        closed = trace is None and arrival == "closed"
        for spec in setup.systems.values():
            if closed:  # each system's own TTFT paces its users
                results += simulate_closed_loop(
                    requests,
                    spec,
                    pm,
                    concurrency=concurrency,
                    workers=workers,
                    progress=lambda n: bar.advance(task, n),
                )
            else:
                results += simulate(
                    requests, spec, pm, workers=workers, progress=lambda n: bar.advance(task, n)
                )
        sweep = []
        for cap in capacities:
            sweep += capacity_sweep(requests, [cap], pm, workers=workers)
            bar.advance(task, 1)
    turns_summary = per_turn(results)

    summary = Table(title="per system, whole workload", title_justify="left")
    for col in ("system", "hit rate", "from HBM", "loaded from tier", "mean TTFT"):
        summary.add_column(col, justify="left" if col == "system" else "right")
    for name in setup.systems:
        rs = [r for r in results if r.system == name]
        hit = sum(r.cached_tokens for r in rs) / sum(r.input_tokens for r in rs)
        summary.add_row(
            name,
            f"{hit:.1%}",
            format_size(sum(r.gpu_bytes for r in rs), exact=False),
            format_size(sum(r.tier_bytes for r in rs), exact=False),
            f"{sum(r.ttft_s for r in rs) / len(rs):.3f} s",
        )
    console.print(summary)

    try:
        written = _write_outputs(
            out,
            workload,
            params,
            results,
            turns_summary,
            sweep,
            no_plots,
            f"{pm.model.name}, {workers} worker{'s' if workers != 1 else ''}",
        )
    except OSError as exc:
        raise click.ClickException(f"could not write to {out}: {exc}") from None
    console.print(f"wrote {', '.join(written)} to {out}")


if __name__ == "__main__":
    main()
