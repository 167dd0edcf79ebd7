#!/usr/bin/env python3
"""Simulation speed: a million mixed 64 MiB block accesses in virtual time.

Replays a synthetic multi-turn chat (Llama-3.1-8B, 512-token blocks = 64 MiB,
no GPU cache, so every block access reaches the device: reads of the tier's
hits and writes of the blocks it lacks) through chm.sim.replay.CxlhmReplay on
ghost devices in virtual time, open loop, in prefetch mode and lru mode, at
each device capacity given (default 2 TB and 16 TB, 64 GB of DRAM; lru
mode with --lru-line lines, default 1 MiB: the cache's cost is per line, and
64 KiB lines make a 64 MiB access 1,024 line lookups, about 0.08 ms of host
time, so lru mode at 64 KiB replays in about twice this target's 60 s).
Each replay runs in its own process, so its peak resident memory is its own.
Prints per run the accesses, the wall time of the replay, accesses per
second, the CPU time (the wall time on a shared host includes waiting for
a core) and the peak RSS, then the verdicts (last; exit 1 on a miss):

- every replay of >= 1,000,000 accesses finishes in under 60 s of wall time;
- the peak RSS at the largest capacity is within 10 % of the smallest's
  (memory stays flat as the device grows). The workload is the same on
  every device: the replay's block index places blocks in the smallest
  capacity's range (CxlhmReplay's tier_bytes), so the index, the serving
  side's metadata, is the same size and only the device differs.

    python tools/replay/sim_speed.py
    python tools/replay/sim_speed.py --users 64 --capacities 2T   # a quick run
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _benchlib as bl

from chm.sim.replay import configure
from chm.sim.replay.cxlhm import CxlhmReplay, replay_cxlhm
from chm.sim.replay.cxlhm_run import GhostSetup, open_ghost
from chm.sim.workloads import ChatWorkload, generate_chat
from chm.sizes import format_size, parse_size

console = Console(highlight=False, markup=False)
TARGET_WALL_S = 60.0
TARGET_ACCESSES = 1_000_000
TARGET_RSS_GROWTH = 1.10


def _workload(users: int, turns: int, seed: int) -> ChatWorkload:
    return ChatWorkload(
        users=users,
        turns=turns,
        system_prompt_tokens=2048,
        user_tokens=(4000, 12000),
        output_tokens=(200, 1000),
        think_time_s=30.0,
        session_rate_per_s=4.0,
        block_tokens=512,
        seed=seed,
    )


def _child(args: dict[str, Any]) -> dict[str, Any]:
    """One replay in this process; its figures."""
    requests = generate_chat(_workload(args["users"], args["turns"], args["seed"]))
    prefill = configure("llama-3.1-8b", "a100-80g").prefill
    block = prefill.model.block_bytes(512)
    setup = GhostSetup(
        capacity_bytes=args["capacity"], dram_bytes=args["dram"], wbuf_bytes=args["wbuf"]
    )
    system = f"cxlhm-{args['mode']}"
    rss_before = bl.rss_now()
    extra = {"lru_line": args["lru_line"]} if args["mode"] == "lru" else {}
    with open_ghost(setup, args["mode"], block, **extra) as dev:
        rss_open = bl.rss_now()
        rp = CxlhmReplay(
            dev,
            system,
            prefill,
            gpu_cache=False,
            device_block_bytes=block,
            open_loop=True,
            workers=args["workers"],
            tier_bytes=args["tier"],
        )
        t0, c0 = time.perf_counter(), time.process_time()
        res = replay_cxlhm(requests, rp)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        st = dev.stats()
    reads = sum(r.device_load_bytes for r in res) // block
    writes = sum(r.writes_offered for r in res)
    return {
        "mode": args["mode"],
        "capacity": args["capacity"],
        "workers": args["workers"],
        "requests": len(requests),
        "reads": reads,
        "writes": writes,
        "accesses": reads + writes,
        "skipped": sum(r.writes_skipped for r in res),
        "wall_s": wall,
        "cpu_s": cpu,
        "simulated_s": st.clock_now_ns / 1e9,
        "rss_before_open": rss_before,
        "rss_open": rss_open,
        "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "indexed_blocks": len(rp._tier) if rp._tier is not None else 0,
    }


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--users", type=click.IntRange(min=1), default=2400, show_default=True)
@click.option("--turns", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--modes", default="prefetch,lru", show_default=True)
@click.option("--capacities", default="2T,16T", show_default=True)
@click.option("--dram", default="64G", show_default=True)
@click.option("--wbuf", default="1G", show_default=True, help="prefetch mode write buffer")
@click.option("--lru-line", default="1M", show_default=True, help="lru mode line size")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Concurrent workers in simulated time (chm.sim.replay.cxlhm's event queue).",
)
@click.option("--json", "json_out", default=None, help="Write the figures to this file.")
@click.option(
    "--quick", is_flag=True, help="A smoke run: at most 64 users; speed judged as smoke targets."
)
@click.option("--child", default=None, hidden=True)
def main(
    users: int,
    turns: int,
    seed: int,
    modes: str,
    capacities: str,
    dram: str,
    wbuf: str,
    lru_line: str,
    workers: int,
    json_out: str | None,
    quick: bool,
    child: str | None,
) -> None:
    """Replay a million block accesses per device and report wall time and memory."""
    if child is not None:
        print(json.dumps(_child(json.loads(child))))
        return
    if quick:
        users = min(users, 64)
    caps = [parse_size(c) for c in capacities.split(",") if c.strip()]
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    for m in mode_list:
        if m not in ("prefetch", "lru"):
            raise click.BadParameter(f"--modes: {m!r} is not prefetch or lru")
    console.print(
        f"workload: {users} users x {turns} turns of chat, 64 MiB blocks (Llama-3.1-8B, "
        f"512 tokens), open loop, {workers} worker(s); ghost devices in virtual time with "
        f"{format_size(parse_size(dram), exact=False)} DRAM, lru mode with "
        f"{format_size(parse_size(lru_line), exact=False)} lines"
    )
    runs: list[dict[str, Any]] = []
    for mode in mode_list:
        for cap in caps:
            args = dict(
                users=users,
                turns=turns,
                seed=seed,
                mode=mode,
                capacity=cap,
                dram=parse_size(dram),
                wbuf=parse_size(wbuf),
                lru_line=parse_size(lru_line),
                workers=workers,
                tier=min(caps),
            )
            p = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(args)],
                capture_output=True,
                text=True,
                check=False,
            )
            if p.returncode:
                raise click.ClickException(f"{mode} at {cap} bytes failed:\n{p.stderr}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            runs.append(r)
            console.print(
                f"{mode:8} {format_size(cap, exact=False):>7}: {r['accesses']:,} accesses "
                f"({r['reads']:,} reads, {r['writes']:,} writes, {r['skipped']:,} skipped) "
                f"in {r['wall_s']:.1f} s wall ({r['cpu_s']:.1f} s CPU) = "
                f"{r['accesses'] / r['wall_s']:,.0f}/s, "
                f"{r['simulated_s']:.0f} s simulated; peak RSS "
                f"{r['rss_peak'] / 2**20:,.0f} MiB (device open: "
                f"+{(r['rss_open'] - r['rss_before_open']) / 2**20:,.1f} MiB), "
                f"{r['indexed_blocks']:,} blocks indexed"
            )
    v = bl.Verdicts("sim_speed", quick=quick)
    for r in runs:
        name = f"{r['mode']} {format_size(r['capacity'], exact=False)}"
        v.check(
            f"{name} accesses",
            r["accesses"],
            TARGET_ACCESSES,
            fmt=lambda x: f"{x:,.0f}",
            speed=True,
        )
        v.check(
            f"{name} wall time",
            r["wall_s"],
            TARGET_WALL_S,
            higher=False,
            fmt=lambda x: f"{x:.1f} s",
            speed=True,
        )
    if len(caps) > 1:
        for mode in mode_list:
            mine = [r for r in runs if r["mode"] == mode]
            lo = min(mine, key=lambda r: r["capacity"])
            hi = max(mine, key=lambda r: r["capacity"])
            v.check(
                f"{mode} peak RSS {format_size(hi['capacity'], exact=False)} / "
                f"{format_size(lo['capacity'], exact=False)}",
                bl.ratio(hi["rss_peak"], lo["rss_peak"]),
                TARGET_RSS_GROWTH,
                higher=False,
            )
    bl.write_json(json_out, {"runs": runs, "verdicts": v.to_dict()})
    sys.exit(v.finish())


if __name__ == "__main__":
    main()
