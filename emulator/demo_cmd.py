"""``chm-emu demo``: a multi-turn KV replay, local DRAM vs CXL-HM lru vs prefetch."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from chm.backend import uring_unavailable
from chm.errors import ChmError
from chm.sim.replay.demo import (
    DEMO_DILATION,
    DEMO_SYSTEMS,
    DemoConfig,
    demo_turns,
    pacing_sentence,
    run_demo,
    summary_sentences,
)
from chm.sim.replay.results import per_turn, write_csv, write_json
from chm.sizes import format_size

console = Console(highlight=False)

_SHORT = {"local-dram-lru": "local", "cxlhm-lru": "lru", "cxlhm-prefetch": "pf"}


@click.command()
@click.option("--users", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--turns", type=click.IntRange(min=2), default=6, show_default=True)
@click.option(
    "--backend",
    type=click.Choice(["auto", "uring", "pread"]),
    default="auto",
    show_default=True,
    help="I/O backend of the devices; auto: io_uring if this host allows it, else pread.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for the JSON, CSV and PNG results [default: chm-demo in the temp directory].",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--dilation",
    type=click.IntRange(1, 1_000_000),
    default=DEMO_DILATION,
    show_default=True,
    help="Time dilation of the devices: their timing model runs this many times slower "
    "than modeled, so this host's disk keeps up; times are reported in device time.",
)
def demo(
    users: int, turns: int, backend: str, out_dir: Path | None, seed: int, dilation: int
) -> None:
    """Replay a small multi-turn chat through a local DRAM cache and CXL-HM (lru, prefetch).

    The CXL-HM devices run in real time on sparse files in a temporary
    directory, paced to the fpga-cxlhm timing preset time-dilated by
    --dilation, with the same device DRAM; the local DRAM cache holds as
    much KV as that DRAM. Prints a per-turn table (device time), whether the
    host kept up with the dilated devices, and writes the results (and
    plots, with matplotlib) to --out. `chm-emu stage-demo` shows the staging
    window itself.
    """
    if out_dir is None:
        out_dir = Path(tempfile.gettempdir()) / "chm-demo"
    cfg = DemoConfig(users=users, turns=turns, backend=backend, seed=seed, time_dilation=dilation)
    n = len(cfg.workload())
    console.print(
        f"[bold]workload[/] {users} users x {turns} turns ({n} requests), {cfg.model}; "
        f"device blocks {format_size(cfg.device_block_bytes, exact=False)} "
        f"(the model's blocks scaled down), device DRAM "
        f"{format_size(cfg.dram_bytes, exact=False)}, timing {cfg.timing} dilated "
        f"x{dilation} (bandwidths and TTFTs in device time)"
    )
    tmp = Path(tempfile.mkdtemp(prefix="chm-demo-"))
    t0 = time.perf_counter()
    try:
        with Progress(console=console, transient=True) as prog:
            task = prog.add_task("replaying", total=n * len(DEMO_SYSTEMS))
            try:
                results, skips, used, pacing = run_demo(
                    cfg, tmp, progress=lambda k: prog.advance(task, k)
                )
            except ChmError as exc:
                raise click.ClickException(f"could not run the devices in {tmp}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    refused = uring_unavailable()
    if backend == "auto" and used == "pread" and refused:
        console.print(f"[yellow]io_uring is unavailable here ({refused}); using the pread backend.")
    rows = demo_turns(results, skips)
    table = Table(
        title=f"per turn (backend {used}, {time.perf_counter() - t0:.1f} s wall)",
        caption="local: local DRAM cache; lru, pf: CXL-HM in lru and prefetch mode",
    )
    table.add_column("turn", justify="right")
    for s in DEMO_SYSTEMS:
        table.add_column(f"{_SHORT[s]}\nhit", justify="right")
        table.add_column("GB/s", justify="right")
        table.add_column("TTFT ms", justify="right")
    by = {(r.system, r.turn): r for r in rows}
    for t in sorted({r.turn for r in rows}):
        cells = [str(t + 1)]
        for s in DEMO_SYSTEMS:
            r = by[(s, t)]
            bw = f"{r.load_bw_Bps / 1e9:.2f}" if r.load_bw_Bps else "-"
            cells += [f"{r.hit_rate:.0%}", bw, f"{r.mean_ttft_s * 1e3:.0f}"]
        table.add_row(*cells)
    console.print(table)
    console.print(summary_sentences(rows))
    kept_up = all(p.kept_up for p in pacing)
    console.print(pacing_sentence(pacing, dilation), style=None if kept_up else "bold red")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(
        out_dir / "demo.json",
        {
            "config": {k: str(v) for k, v in vars(cfg).items()},
            "turns": [r.row() for r in rows],
            "pacing": [p.row() for p in pacing],
        },
    )
    write_csv(out_dir / "demo_turns.csv", [r.row() for r in rows])
    write_csv(out_dir / "demo_requests.csv", [x.row() for rs in results.values() for x in rs])
    if importlib.util.find_spec("matplotlib") is None:
        console.print(
            f"results in {out_dir}/; for the plots install matplotlib "
            "(.venv/bin/pip install matplotlib) and run again"
        )
        return
    from chm.sim.replay.plots import plot_load_bandwidth, plot_per_turn

    plot_per_turn(
        per_turn(x for rs in results.values() for x in rs),
        out_dir / "demo_per_turn.png",
        title="per-turn hit rate and modeled TTFT",
    )
    plot_load_bandwidth(
        {
            s: [(r.turn + 1, r.load_bw_Bps) for r in rows if r.system == s and r.load_bw_Bps]
            for s in ("cxlhm-lru", "cxlhm-prefetch")
        },
        out_dir / "demo_load_bw.png",
        title="CXL-HM load bandwidth per turn",
    )
    console.print(f"results and plots in {out_dir}/ (demo_per_turn.png, demo_load_bw.png)")
