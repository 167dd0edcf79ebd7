"""The built-in multi-turn replay: a local DRAM cache vs CXL-HM lru vs prefetch.

A small synthetic chat workload is replayed in real time through two
embedded devices (lru mode and prefetch mode) over sparse files in a
directory, with the same device DRAM, and through the local DRAM LRU
baseline holding as much KV as that DRAM (in the model's bytes). Device
blocks are the model's blocks scaled down by ``scale`` so the run is small;
load times are scaled back (see :mod:`chm.replay.cxlhm`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chm
from chm.replay.baselines import BaselineReplay, SystemSpec
from chm.replay.cxlhm import CxlhmReplay, replay_cxlhm
from chm.replay.prefill import GPUS, MODELS, PrefillModel
from chm.replay.results import RequestResult
from chm.replay.tiers import TIERS
from chm.workloads.records import Request
from chm.workloads.synthetic import ChatWorkload, generate_chat

__all__ = ["DemoConfig", "DemoTurn", "demo_turns", "run_demo", "summary_sentences"]

DEMO_SYSTEMS = ("local-dram-lru", "cxlhm-lru", "cxlhm-prefetch")


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo (defaults: about 10 s on a 2-core machine)."""

    users: int = 8
    turns: int = 6
    device_block_bytes: int = 2 << 20  # the model's 16 MiB blocks scaled by 8
    dram_bytes: int = 64 << 20
    wbuf_bytes: int = 16 << 20
    capacity_bytes: int = 4 << 30
    timing: str = "fpga-cxlhm"
    backend: str = "auto"
    model: str = "llama-3.1-8b"
    gpu: str = "a100-80g"
    seed: int = 0

    def workload(self) -> list[Request]:
        return generate_chat(ChatWorkload(users=self.users, turns=self.turns, seed=self.seed))


@dataclass(frozen=True)
class DemoTurn:
    """One system's turn: hit rate, load bandwidth, mean modeled TTFT."""

    system: str
    turn: int
    requests: int
    hit_rate: float
    load_bytes: int  # the model's bytes loaded from the tier
    load_bw_Bps: float  # 0 without a load
    mean_ttft_s: float
    writes_skipped: int

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _device(cfg: DemoConfig, mode: str, target: Path) -> chm.Device:
    kw: dict[str, Any] = dict(
        targets=[target],
        create=True,
        capacity=cfg.capacity_bytes,
        dram=cfg.dram_bytes,
        mode=mode,
        timing=cfg.timing,
    )
    if mode == "prefetch":
        kw.update(slot_size=cfg.device_block_bytes, wbuf=cfg.wbuf_bytes)
    return chm.Device.open(backend=cfg.backend, **kw)


def run_demo(
    cfg: DemoConfig, directory: Path, progress: Callable[[int], None] | None = None
) -> tuple[dict[str, list[RequestResult]], dict[str, list[int]], str]:
    """Replays the workload through the three systems; results, skips, backend.

    Returns per system its request results and per request the writes
    skipped (0 for the baseline, which writes into host DRAM), and the
    device backend used.
    """
    prefill = PrefillModel(MODELS[cfg.model], GPUS[cfg.gpu])
    reqs = cfg.workload()
    scale = prefill.model.block_bytes(reqs[0].block_tokens) / cfg.device_block_bytes
    base = BaselineReplay(
        SystemSpec(
            "local-dram-lru",
            gpu_cache=False,
            tier_capacity_bytes=int(cfg.dram_bytes * scale),
            tier=TIERS["local-dram"],
        ),
        prefill,
    )
    out: dict[str, list[RequestResult]] = {"local-dram-lru": []}
    skips: dict[str, list[int]] = {"local-dram-lru": []}
    for r in reqs:
        out["local-dram-lru"].append(base.step(r))
        skips["local-dram-lru"].append(0)
        if progress is not None:
            progress(1)
    backend = ""
    for system, mode in (("cxlhm-lru", "lru"), ("cxlhm-prefetch", "prefetch")):
        with _device(cfg, mode, directory / f"{mode}.img") as dev:
            backend = dev.backend
            rp = CxlhmReplay(
                dev,
                system,
                prefill,
                gpu_cache=False,
                device_block_bytes=cfg.device_block_bytes,
            )
            res = replay_cxlhm(reqs, rp, progress=progress)
        out[system] = [x.result for x in res]
        skips[system] = [x.writes_skipped for x in res]
    return out, skips, backend


def demo_turns(
    results: dict[str, list[RequestResult]], skips: dict[str, list[int]]
) -> list[DemoTurn]:
    """Per system and turn: hit rate, load bandwidth (model bytes / load time), TTFT."""
    rows = []
    for system, rs in results.items():
        turns = sorted({r.turn for r in rs if r.turn is not None})
        for t in turns:
            sel = [i for i, r in enumerate(rs) if r.turn == t]
            inp = sum(rs[i].input_tokens for i in sel)
            b = sum(rs[i].tier_bytes for i in sel)
            ls = sum(rs[i].load_s for i in sel)
            rows.append(
                DemoTurn(
                    system=system,
                    turn=t,
                    requests=len(sel),
                    hit_rate=sum(rs[i].cached_tokens for i in sel) / inp if inp else 0.0,
                    load_bytes=b,
                    load_bw_Bps=b / ls if ls > 0 else 0.0,
                    mean_ttft_s=sum(rs[i].ttft_s for i in sel) / len(sel),
                    writes_skipped=sum(skips[system][i] for i in sel),
                )
            )
    return rows


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def summary_sentences(turns: list[DemoTurn]) -> str:
    """Two sentences on what the table shows, from its numbers."""
    by: dict[str, list[DemoTurn]] = {}
    for t in turns:
        by.setdefault(t.system, []).append(t)
    last = max(t.turn for t in turns)
    local_last = next(t for t in by["local-dram-lru"] if t.turn == last)
    cx_last = next(t for t in by["cxlhm-prefetch"] if t.turn == last)
    local_first = min(by["local-dram-lru"], key=lambda t: t.turn)
    if cx_last.hit_rate > local_last.hit_rate:
        cmp = "keeps more"
    elif cx_last.hit_rate < local_last.hit_rate:
        cmp = "keeps less"
    else:
        cmp = "keeps as much"
    s1 = (
        f"By turn {last + 1} the local DRAM cache's hit rate went from "
        f"{local_first.hit_rate:.0%} to {local_last.hit_rate:.0%}, while CXL-HM with the same "
        f"DRAM {cmp} reuse ({cx_last.hit_rate:.0%}), because its SSD holds what the DRAM cannot."
    )

    def bw(system: str) -> float:
        rs = by[system]
        b = sum(t.load_bytes for t in rs)
        s = sum(t.load_bytes / t.load_bw_Bps for t in rs if t.load_bw_Bps > 0)
        return b / s if s > 0 else 0.0

    lru_bw, pf_bw = bw("cxlhm-lru"), bw("cxlhm-prefetch")
    ratio = pf_bw / lru_bw if lru_bw > 0 else 0.0
    ttft_l = _mean([t.mean_ttft_s for t in by["cxlhm-lru"]])
    ttft_p = _mean([t.mean_ttft_s for t in by["cxlhm-prefetch"]])
    skipped = sum(t.writes_skipped for t in by["cxlhm-prefetch"])
    s2 = (
        f"Prefetch mode loaded at {pf_bw / 1e9:.2f} GB/s against lru mode's "
        f"{lru_bw / 1e9:.2f} GB/s ({ratio:.2f}x), for a mean modeled TTFT of "
        f"{ttft_p * 1e3:.0f} ms vs {ttft_l * 1e3:.0f} ms, with {skipped} block writes "
        f"skipped in prefetch mode."
    )
    return f"{s1} {s2}"
