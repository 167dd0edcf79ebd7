"""The built-in multi-turn replay: a local DRAM cache vs CXL-HM lru vs prefetch.

A small synthetic chat workload is replayed in real time through two
embedded devices (lru mode and prefetch mode) over sparse files in a
directory, with the same device DRAM, and through the local DRAM LRU
baseline holding as much KV as that DRAM (in the model's bytes). Device
blocks are the model's blocks scaled down by ``scale`` so the run is small;
load times are scaled back (see :mod:`chm.sim.replay.cxlhm`).

The devices run time-dilated (``time_dilation``, :data:`DEMO_DILATION` by
default): the modeled device is faster than this host's disk, and pacing
can only slow the host down, so undilated the table would measure the disk.
Every time the replay takes is device time (``clock_ns()``), so bandwidths
and TTFTs are the model's; :func:`pacing_sentence` says from the devices'
``pacing_late`` counters whether the host kept up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chm
from chm.sim.replay.baselines import BaselineReplay, SystemSpec
from chm.sim.replay.cxlhm import CxlhmReplay, replay_cxlhm
from chm.sim.replay.prefill import GPUS, MODELS, PrefillModel
from chm.sim.replay.results import RequestResult
from chm.sim.replay.tiers import TIERS
from chm.sim.workloads.records import Request
from chm.sim.workloads.synthetic import ChatWorkload, generate_chat

__all__ = [
    "DEMO_DILATION",
    "LATE_TOLERANCE",
    "DemoConfig",
    "DemoPacing",
    "DemoTurn",
    "demo_turns",
    "pacing_sentence",
    "run_demo",
    "scaled_max_io",
    "summary_sentences",
]

DEMO_SYSTEMS = ("local-dram-lru", "cxlhm-lru", "cxlhm-prefetch")

# The fpga-cxlhm preset moves at most 20 GB/s between the SSD and the host
# (its 25 GB/s link is bounded by the 20 GB/s device DRAM that feeds it; the
# SSD reads 28 GB/s), so a device run undilated asks up to 20 GB/s of the
# backing disk. The 2-core development VM's virtio disk reads 0.75-2.6 GB/s
# O_DIRECT (0.75 GB/s at a load average of 2.5 from other jobs, 2026-12-01).
# Dilated by 64 the device asks at most 20 / 64 = 0.31 GB/s, under the
# slowest rate measured there by 2.4x (32 would ask 0.63 GB/s, within 20% of
# it). On a faster disk a smaller --dilation keeps up; pacing_sentence tells.
DEMO_DILATION = 64

# The host kept up when its completions were late by at most this share of
# the device time of the run in total (then the table is the model's within
# about that share).
LATE_TOLERANCE = 0.05


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
    time_dilation: int = DEMO_DILATION

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


@dataclass(frozen=True)
class DemoPacing:
    """Whether the host kept up with one device: its ``pacing_late`` counters.

    ``late`` completions came ``late_ns`` (device ns, summed) after the
    model's time, in a run of ``device_ns`` on the device clock.
    """

    system: str
    late: int
    late_ns: int
    device_ns: int

    @property
    def late_share(self) -> float:
        """Total lateness as a share of the device time of the run."""
        return self.late_ns / self.device_ns if self.device_ns > 0 else 0.0

    @property
    def kept_up(self) -> bool:
        return self.late_share <= LATE_TOLERANCE

    def row(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(late_share=self.late_share, kept_up=self.kept_up)
        return d


def scaled_max_io(scale: float) -> int:
    """The device's largest I/O for blocks scaled down by ``scale``.

    A fill is split into ``max_io`` pieces, one SSD channel each
    (fw_spec/cost.yaml), so an object's channel parallelism is its size over
    ``max_io``. Scaling the blocks down and not the pieces would give each
    device block ``scale`` times fewer channels than the model's block has at
    full scale (2 MiB blocks in 1 MiB pieces: 2 channels of 32, each at
    1/32 of the SSD's bandwidth), which is not the modeled device. So
    ``max_io`` (the option's default, 1 MiB) is scaled like the blocks, a
    multiple of 4 KiB: a device block has as many pieces as the model's.
    """
    default = int(chm.Config()["max_io"])
    return max(4096, int(default / scale) // 4096 * 4096)


def _device(cfg: DemoConfig, mode: str, target: Path, max_io: int) -> chm.Device:
    kw: dict[str, Any] = dict(
        targets=[target],
        create=True,
        capacity=cfg.capacity_bytes,
        dram=cfg.dram_bytes,
        mode=mode,
        timing=cfg.timing,
        time_dilation=cfg.time_dilation,
        max_io=max_io,
    )
    if mode == "prefetch":
        kw.update(slot_size=cfg.device_block_bytes, wbuf=cfg.wbuf_bytes)
    return chm.Device.open(backend=cfg.backend, **kw)


def run_demo(
    cfg: DemoConfig, directory: Path, progress: Callable[[int], None] | None = None
) -> tuple[dict[str, list[RequestResult]], dict[str, list[int]], str, list[DemoPacing]]:
    """Replays the workload through the three systems.

    Returns per system its request results and per request the writes
    skipped (0 for the baseline, which writes into host DRAM), the device
    backend used, and each device's pacing counters.
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
    pacing = []
    for system, mode in (("cxlhm-lru", "lru"), ("cxlhm-prefetch", "prefetch")):
        with _device(cfg, mode, directory / f"{mode}.img", scaled_max_io(scale)) as dev:
            backend = dev.backend
            rp = CxlhmReplay(
                dev,
                system,
                prefill,
                gpu_cache=False,
                device_block_bytes=cfg.device_block_bytes,
            )
            res = replay_cxlhm(reqs, rp, progress=progress)
            st = dev.stats()
            pacing.append(DemoPacing(system, st.pacing_late, st.pacing_late_ns, st.clock_now_ns))
        out[system] = [x.result for x in res]
        skips[system] = [x.writes_skipped for x in res]
    return out, skips, backend, pacing


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


def _bw(rows: list[DemoTurn]) -> float:
    """Load bandwidth over the run: bytes / load time, over the turns with a load."""
    b = sum(t.load_bytes for t in rows if t.load_bw_Bps > 0)
    s = sum(t.load_bytes / t.load_bw_Bps for t in rows if t.load_bw_Bps > 0)
    return b / s if s > 0 else 0.0


def _moved(first: float, last: float, rel: float = 0.05) -> str:
    """ "fell", "rose" or "stayed" (within ``rel`` of the first value)."""
    if abs(last - first) <= rel * max(abs(first), 1e-12):
        return "stayed"
    return "fell" if last < first else "rose"


def summary_sentences(turns: list[DemoTurn]) -> str:
    """Two sentences on what the table shows, computed from its numbers.

    The first compares the hit rate CXL-HM keeps with the local DRAM
    cache's; the second each mode's load bandwidth from its first turn with
    a load to the last turn, and prefetch's over the run against lru's.
    """
    by: dict[str, list[DemoTurn]] = {}
    for t in turns:
        by.setdefault(t.system, []).append(t)
    for rows in by.values():
        rows.sort(key=lambda t: t.turn)
    last = max(t.turn for t in turns)
    local, lru, pf = by["local-dram-lru"], by["cxlhm-lru"], by["cxlhm-prefetch"]
    lo0, lo1 = local[0], local[-1]
    kept = min(lru[-1].hit_rate, pf[-1].hit_rate)
    if kept > lo1.hit_rate:
        cmp, why = "more", ", because its SSD holds what the DRAM cannot"
    elif max(lru[-1].hit_rate, pf[-1].hit_rate) < lo1.hit_rate:
        cmp, why = "less", ""
    else:
        cmp, why = "about as much", ""
    if _moved(lo0.hit_rate, lo1.hit_rate) == "stayed":
        local_hits = f"stayed at {lo0.hit_rate:.0%} ({lo1.hit_rate:.0%} at the end)"
    else:
        local_hits = (
            f"{_moved(lo0.hit_rate, lo1.hit_rate)} from {lo0.hit_rate:.0%} to {lo1.hit_rate:.0%}"
        )
    s1 = (
        f"By turn {last + 1} the local DRAM cache's hit rate {local_hits}, while CXL-HM "
        f"with the same DRAM kept {cmp} reuse ({lru[-1].hit_rate:.0%} in lru mode, "
        f"{pf[-1].hit_rate:.0%} in prefetch mode){why}."
    )

    def span(rows: list[DemoTurn]) -> tuple[DemoTurn | None, DemoTurn | None]:
        loaded = [t for t in rows if t.load_bw_Bps > 0]
        return (loaded[0], loaded[-1]) if loaded else (None, None)

    def trend(name: str, rows: list[DemoTurn]) -> str:
        a, b = span(rows)
        if a is None or b is None:
            return f"{name} loaded nothing"
        if a is b:
            return f"{name} loaded at {a.load_bw_Bps / 1e9:.1f} GB/s in turn {a.turn + 1} only"
        moved = _moved(a.load_bw_Bps, b.load_bw_Bps)
        if moved == "stayed":
            return (
                f"{name}'s load bandwidth stayed at {a.load_bw_Bps / 1e9:.1f} GB/s from turn "
                f"{a.turn + 1} to turn {b.turn + 1} ({b.load_bw_Bps / 1e9:.1f} GB/s)"
            )
        return (
            f"{name}'s load bandwidth {moved} from {a.load_bw_Bps / 1e9:.1f} GB/s at turn "
            f"{a.turn + 1} to {b.load_bw_Bps / 1e9:.1f} GB/s at turn {b.turn + 1}"
        )

    lru_bw, pf_bw = _bw(lru), _bw(pf)
    ratio = pf_bw / lru_bw if lru_bw > 0 else 0.0
    if ratio > 1.05:
        verdict = "faster than"
    elif ratio < 0.95:
        verdict = "slower than"
    else:
        verdict = "about as fast as"
    ttft_l = _mean([t.mean_ttft_s for t in lru])
    ttft_p = _mean([t.mean_ttft_s for t in pf])
    skipped = sum(t.writes_skipped for t in pf)
    s2 = (
        f"{trend('Lru mode', lru)}, and {trend('prefetch mode', pf)}: over the run prefetch "
        f"mode loaded {verdict} lru mode, {pf_bw / 1e9:.1f} GB/s against {lru_bw / 1e9:.1f} "
        f"GB/s ({ratio:.2f}x), for a mean modeled TTFT of {ttft_p * 1e3:.0f} ms vs "
        f"{ttft_l * 1e3:.0f} ms, with {skipped} block writes skipped in prefetch mode."
    )
    return f"{s1} {s2}"


def pacing_sentence(pacing: list[DemoPacing], dilation: int) -> str:
    """Whether the host kept up with the dilated devices, said plainly."""
    parts = [
        f"{p.system}: {p.late} late, {p.late_ns / 1e6:.2f} ms in all, "
        f"{p.late_share:.1%} of its {p.device_ns / 1e9:.2f} s"
        for p in pacing
    ]
    head = (
        f"Pacing (device time, dilated x{dilation}): completions later than the model "
        f"({'; '.join(parts)})."
    )
    behind = [p.system for p in pacing if not p.kept_up]
    if not behind:
        return (
            f"{head} The host kept up (lateness within {LATE_TOLERANCE:.0%} of the run), "
            "so the table measures the modeled device."
        )
    return (
        f"{head} THE HOST DID NOT KEEP UP in {', '.join(behind)} (lateness above "
        f"{LATE_TOLERANCE:.0%} of the run): those numbers measure this host and its disk, "
        "not the model; rerun with a larger --dilation."
    )
