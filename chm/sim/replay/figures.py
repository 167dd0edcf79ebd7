"""The paper's figures 8, 9, 10 and 12 as replays, judged against its statements.

Each figure is a function of one parameter set (a frozen dataclass whose
fields print and override by name, :mod:`chm.sim.replay.params`) that replays a
synthetic multi-turn chat through the systems the figure compares and
returns a :class:`FigureData`: every request's result, per-turn summaries,
sweep points, a summary and the :class:`Claim` s -- the paper's statements
as a measured value against a target. ``tools/replay/figures.py`` prints,
writes and plots them. The baselines are :mod:`chm.sim.replay.baselines` (with
its store-failure, second-tier, transfer-buffer and timeout policies);
HyMCache is ``cxlhm-prefetch`` on a ghost device in virtual time
(:mod:`chm.sim.replay.cxlhm_run`), open loop, its prefill workers concurrent
on the device clock. TTFTs compared across systems are compute + load (the
baselines have no queues); the CXL-HM rows also carry their queued TTFT.

- **Fig. 8** (:func:`fig8_pd`): PD-disaggregated 4P-1D-1S, Qwen2.5-32B (32
  MiB blocks): four prefill workers share the storage tier; HyMCache's
  rows also model the decode instance (:mod:`chm.sim.replay.decode`): each
  request's KV crosses its prefill worker's 100 Gbps PD link and the decode
  node's shared 200 Gbps NIC, then queues for one decode step (the paper's
  max decode tokens = 1), whose end is its queued first token. GPU prefix
  caching, LMCache (64 GB per worker), Mooncake's 1 TB distributed DRAM
  pool and HyMCache (2 TB device, 64 GB DRAM).
  Paper: HyMCache ~10 points higher hit rate than Mooncake at turn 7,
  Mooncake ~30 % lower TTFT, 16x less DRAM.
- **Fig. 9** (:func:`fig9_nvmeof`): NVMe-oF as a raw block device (~23
  GB/s) and with XFS mounted (~6.5 GB/s), each behind the connector's load
  timeout that falls back to recomputation. Paper: the file-system baseline
  performs close to recomputation.
- **Fig. 10** (:func:`fig10_transfer_buffer`): the host transfer buffer
  swept for Mooncake (its loads and stores cross the buffer; traffic beyond
  a worker's share waits for it to drain) and HyMCache (the buffer is its
  prefetch window's landing zone; its stores skip rather than wait). Paper:
  Mooncake degrades at 10 GB, HyMCache flat above 10 GB.
- **Fig. 12** (:func:`fig12_redis`): Redis-backed LMCache: Redis alone (64
  GB, store failures when full, which break prefix chains), LMCache 64 GB
  per worker in front of Redis 64 GB, and HyMCache. Paper: similar latency
  distribution at turn 6 for HyMCache and LMCache + Redis.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chm.sim.replay.baselines import BaselineReplay, SystemSpec, simulate
from chm.sim.replay.configure import configure
from chm.sim.replay.cxlhm import CxlhmRequest
from chm.sim.replay.cxlhm_run import GhostSetup, replay_virtual
from chm.sim.replay.decode import DecodeModel
from chm.sim.replay.params import param
from chm.sim.replay.prefill import PrefillModel
from chm.sim.replay.results import RequestResult, TurnSummary, per_turn
from chm.sim.replay.tiers import TIERS
from chm.sim.workloads import ChatWorkload, generate_chat
from chm.sim.workloads.records import Request

__all__ = [
    "Claim",
    "FigureData",
    "NvmeofParams",
    "PdParams",
    "RedisParams",
    "TransferBufferParams",
    "fig8_pd",
    "fig9_nvmeof",
    "fig10_transfer_buffer",
    "fig12_redis",
    "turn_stats",
]

Progress = Callable[[int], None] | None


@dataclass(frozen=True)
class Claim:
    """One statement of the paper as a measured value against a target."""

    name: str
    value: float
    target: float
    higher: bool  # met when value >= target (else <=)
    paper: str  # the statement, in words

    @property
    def met(self) -> bool:
        return self.value >= self.target if self.higher else self.value <= self.target


@dataclass
class FigureData:
    """What one figure's replays produced."""

    figure: str
    results: list[RequestResult]
    cxlhm: dict[str, list[CxlhmRequest]] = field(default_factory=dict)
    sweeps: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)

    def turns(self) -> list[TurnSummary]:
        return per_turn(self.results)

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per (system, request); CXL-HM rows add device columns."""
        cx = {id(r.result): r for rs in self.cxlhm.values() for r in rs}
        out = [cx[id(r)].row() if id(r) in cx else r.row() for r in self.results]
        cols: dict[str, None] = {}
        for row in out:
            cols.update(dict.fromkeys(row))
        return [{c: row.get(c, "") for c in cols} for row in out]


def turn_stats(results: Sequence[RequestResult], system: str, turn: int) -> dict[str, float]:
    """Hit rate and TTFT (mean, p50, p90) of one system's requests of one turn
    (0-based); a ValueError when there are none."""
    rs = [r for r in results if r.system == system and r.turn == turn]
    if not rs:
        raise ValueError(f"no request of {system} in turn {turn + 1}")
    ttft = sorted(r.ttft_s for r in rs)
    q = statistics.quantiles(ttft, n=10, method="inclusive") if len(ttft) > 1 else [ttft[0]] * 9
    return {
        "requests": len(rs),
        "hit_rate": sum(r.cached_tokens for r in rs) / sum(r.input_tokens for r in rs),
        "mean_ttft_s": sum(ttft) / len(ttft),
        "p50_ttft_s": statistics.median(ttft),
        "p90_ttft_s": q[8],
    }


# ---- shared pieces


def _chat(p: Any) -> list[Request]:
    return generate_chat(
        ChatWorkload(
            users=p.users,
            turns=p.turns,
            system_prompt_tokens=p.system_prompt_tokens,
            user_tokens=(p.user_tokens_min, p.user_tokens_max),
            output_tokens=(200, 1000),
            think_time_s=p.think_time_s,
            session_rate_per_s=p.session_rate_per_s,
            seed=p.seed,
        )
    )


def _ghost(p: Any) -> GhostSetup:
    return GhostSetup(
        capacity_bytes=p.device_bytes,
        dram_bytes=p.device_dram_bytes,
        wbuf_bytes=p.wbuf_bytes,
        timing=p.timing,
        scale=p.scale,
    )


def _hymcache(
    requests: Sequence[Request],
    pm: PrefillModel,
    p: Any,
    workers: int,
    progress: Progress,
    window_bytes: int = 0,
    name: str = "hymcache",
    decode: DecodeModel | None = None,
) -> list[CxlhmRequest]:
    rs = replay_virtual(
        requests,
        "cxlhm-prefetch",
        pm,
        _ghost(p),
        workers=workers,
        open_loop=True,
        window_bytes=window_bytes,
        decode=decode,
        progress=progress,
    )
    return [
        dataclasses.replace(r, result=dataclasses.replace(r.result, system=name, tier_name=name))
        for r in rs
    ]


def _footprint(requests: Sequence[Request], pm: PrefillModel) -> int:
    """Bytes of the distinct blocks of the workload (its reusable KV footprint)."""
    keys = {k for r in requests for k in r.block_keys}
    return len(keys) * pm.model.block_bytes(requests[0].block_tokens)


def _mean_ttft(results: Sequence[RequestResult], system: str) -> float:
    rs = [r.ttft_s for r in results if r.system == system]
    return sum(rs) / len(rs)


# ---- Fig. 8


@dataclass(frozen=True)
class PdParams:
    """Fig. 8 (and Fig. 10's workload): PD-disaggregated serving of Qwen2.5-32B."""

    model: str = param("qwen2.5-32b", "", "model preset (32 MiB per 128-token block)")
    gpu: str = param("a100-80g", "", "GPU preset of the prefill instances")
    users: int = param(56, "", "conversations (56 x 8 turns: a ~1.5 TB reusable footprint)")
    turns: int = param(8, "", "turns per conversation")
    system_prompt_tokens: int = param(2048, "tokens", "shared system prompt")
    user_tokens_min: int = param(8000, "tokens", "new tokens per turn, least")
    user_tokens_max: int = param(16000, "tokens", "new tokens per turn, most")
    seed: int = param(0, "", "workload seed")
    session_rate_per_s: float = param(
        100.0, "1/s", "conversations start at this Poisson rate (100: all at once, interleaved)"
    )
    think_time_s: float = param(5.0, "s", "pause between a turn's answer and the next turn")
    prefill_workers: int = param(4, "", "prefill instances (4P)")
    decode_workers: int = param(1, "", "Fig. 8 HyMCache: decode instances (1D; 0: not modeled)")
    decode_tokens: int = param(1, "tokens", "Fig. 8: decode steps a request (paper: 1)")
    decode_step_s: float = param(-1.0, "s", "Fig. 8: a decode step (<0: prefill model's 1 token)")
    pd_link_Bps: float = param(12.5e9, "B/s", "Fig. 8: each prefill worker's PD link (100 Gbps)")
    decode_nic_Bps: float = param(25e9, "B/s", "Fig. 8: the decode node's NIC, shared (200 Gbps)")
    local_dram_bytes: int = param(64 << 30, "bytes", "LMCache host DRAM per prefill worker")
    pool_bytes: int = param(1 << 40, "bytes", "Mooncake distributed DRAM pool (1S)")
    device_bytes: int = param(2 << 40, "bytes", "CXL-HM capacity (1S)")
    device_dram_bytes: int = param(64 << 30, "bytes", "CXL-HM DRAM")
    wbuf_bytes: int = param(1 << 30, "bytes", "CXL-HM write buffer")
    timing: str = param("fpga-cxlhm", "", "CXL-HM timing preset")
    scale: int = param(1, "", "divides the CXL-HM sizes and its device blocks")
    late_turn: int = param(7, "", "the turn the paper compares hit rates at (1-based)")

    def __post_init__(self) -> None:
        if self.users < 1 or self.turns < 1 or self.prefill_workers < 1:
            raise ValueError("PdParams: users, turns and prefill_workers must be >= 1")
        if not 1 <= self.late_turn <= self.turns:
            raise ValueError(f"PdParams: late_turn must be in 1..{self.turns}")
        if not 0 < self.user_tokens_min <= self.user_tokens_max:
            raise ValueError("PdParams: need 0 < user_tokens_min <= user_tokens_max")
        self.decode_model()  # its own checks

    def decode_model(self) -> DecodeModel:
        """The decode instances HyMCache's Fig. 8 replay models."""
        return DecodeModel(
            workers=self.decode_workers,
            tokens=self.decode_tokens,
            step_s=self.decode_step_s,
            pd_link_Bps=self.pd_link_Bps,
            decode_nic_Bps=self.decode_nic_Bps,
        )


def _pd_systems(p: PdParams, overrides: Sequence[str]) -> tuple[PrefillModel, list[SystemSpec]]:
    setup = configure(
        p.model,
        p.gpu,
        ["gpu-prefix", "local-dram-lru", "remote-dram-pool"],
        [
            f"local-dram-lru.tier_capacity_bytes={p.local_dram_bytes}",
            f"remote-dram-pool.tier_capacity_bytes={p.pool_bytes}",
            *overrides,
        ],
    )
    return setup.prefill, list(setup.systems.values())


def _hit_gain(p: PdParams, overrides: Sequence[str]) -> float:
    """Turn ``late_turn`` hit rate of HyMCache minus Mooncake's, in points."""
    pm, systems = _pd_systems(p, overrides)
    reqs = _chat(p)
    pool = next(s for s in systems if s.name == "remote-dram-pool")
    res = simulate(reqs, pool, pm, workers=p.prefill_workers)
    res += [r.result for r in _hymcache(reqs, pm, p, p.prefill_workers, None)]
    late = p.late_turn - 1
    return 100 * (
        turn_stats(res, "hymcache", late)["hit_rate"]
        - turn_stats(res, "remote-dram-pool", late)["hit_rate"]
    )


def fig8_pd(
    p: PdParams,
    overrides: Sequence[str] = (),
    progress: Progress = None,
    session_rates: Sequence[float] = (),
) -> FigureData:
    """Fig. 8: per-turn hit rate and TTFT, four prefill workers, one storage node.

    ``overrides``: ``SCOPE.NAME=VALUE`` for the baselines (:func:`configure`).
    ``session_rates``: the hit-rate gain is also replayed with conversations
    starting at these rates (how interleaved they are decides how much of
    the footprint is live at once: the gain's modeling choice).
    """
    pm, systems = _pd_systems(p, overrides)
    reqs = _chat(p)
    results: list[RequestResult] = []
    for s in systems:
        results += simulate(reqs, s, pm, workers=p.prefill_workers, progress=progress)
    hy = _hymcache(reqs, pm, p, p.prefill_workers, progress, decode=p.decode_model())
    results += [r.result for r in hy]
    late = p.late_turn - 1
    moon = turn_stats(results, "remote-dram-pool", late)
    hym = turn_stats(results, "hymcache", late)
    ttft_ratio = _mean_ttft(results, "hymcache") / _mean_ttft(results, "remote-dram-pool")
    dram_ratio = p.pool_bytes / p.device_dram_bytes
    foot = _footprint(reqs, pm)
    gain = 100 * (hym["hit_rate"] - moon["hit_rate"])
    by_rate = [(p.session_rate_per_s, gain)]
    for rate in session_rates:
        if rate != p.session_rate_per_s:
            q = dataclasses.replace(p, session_rate_per_s=rate)
            by_rate.append((rate, _hit_gain(q, overrides)))
    summary = {
        "requests": len(reqs),
        "footprint_bytes": foot,
        "pool_covers": min(1.0, p.pool_bytes / foot),
        "late_turn": p.late_turn,
        f"turn{p.late_turn}": {
            s: turn_stats(results, s, late) for s in dict.fromkeys(r.system for r in results)
        },
        "ttft_hymcache_over_mooncake": ttft_ratio,
        "dram_mooncake_over_hymcache": dram_ratio,
        "hymcache_queued_ttft_mean_s": sum(r.ttft_s for r in hy) / len(hy),
        "hymcache_pd_transfer_mean_s": sum(r.pd_transfer_s for r in hy) / len(hy),
        "hymcache_decode_queue_mean_s": sum(r.decode_queue_s for r in hy) / len(hy),
        "hymcache_decode_step_mean_s": sum(r.decode_step_s for r in hy) / len(hy),
        "hymcache_writes_skipped": sum(r.writes_skipped for r in hy),
        "hymcache_writes_offered": sum(r.writes_offered for r in hy),
        "hit_gain_points_by_session_rate": [{"rate_per_s": r, "points": g} for r, g in by_rate],
    }
    rates = "; ".join(f"{r:g}/s: {g:+.1f}" for r, g in by_rate)
    claims = [
        Claim(
            f"turn {p.late_turn} hit rate, HyMCache - Mooncake (points) [{p.users} conversations "
            f"starting at {p.session_rate_per_s:g}/s, footprint {foot / 1e12:.2f} TB, pool "
            f"{p.pool_bytes / 1e12:.2f} TB; by start rate {rates}]",
            gain,
            5.0,
            True,
            "HyMCache's hit rate ~10 % higher than Mooncake's 1 TB pool",
        ),
        Claim(
            "mean TTFT, HyMCache / Mooncake (Mooncake faster)",
            ttft_ratio,
            1.0,
            True,
            "Mooncake's TTFT ~30 % lower than HyMCache's",
        ),
        Claim(
            "mean TTFT, HyMCache / Mooncake (HyMCache within 1/0.7)",
            ttft_ratio,
            1 / 0.7,
            False,
            "Mooncake's TTFT ~30 % lower than HyMCache's, not more",
        ),
        Claim(
            "DRAM, Mooncake / HyMCache",
            dram_ratio,
            16.0,
            True,
            "16x less DRAM",
        ),
    ]
    sweeps = {"hit_gain_points": [(r, g) for r, g in by_rate]}
    return FigureData("fig8", results, {"hymcache": hy}, sweeps, summary, claims)


# ---- Fig. 9


@dataclass(frozen=True)
class _ChatNodeParams:
    """What Figs. 9 and 12 share: the multi-turn chat workload on one serving
    node, and the CXL-HM device it is measured on."""

    model: str = param("llama-3.1-8b", "", "model preset (16 MiB per 128-token block)")
    gpu: str = param("a100-80g", "", "GPU preset")
    users: int = param(128, "", "conversations (128 x 8 turns: ~1.1 TB, past G1's 4 x 56 GB)")
    turns: int = param(8, "", "turns per conversation")
    system_prompt_tokens: int = param(2048, "tokens", "shared system prompt")
    user_tokens_min: int = param(4000, "tokens", "new tokens per turn, least")
    user_tokens_max: int = param(12000, "tokens", "new tokens per turn, most")
    seed: int = param(0, "", "workload seed")
    session_rate_per_s: float = param(
        100.0, "1/s", "conversations start at this Poisson rate (100: all at once, interleaved)"
    )
    think_time_s: float = param(5.0, "s", "pause between a turn's answer and the next turn")
    workers: int = param(4, "", "serving workers of the node")
    device_bytes: int = param(2 << 40, "bytes", "CXL-HM capacity")
    device_dram_bytes: int = param(64 << 30, "bytes", "CXL-HM DRAM")
    wbuf_bytes: int = param(1 << 30, "bytes", "CXL-HM write buffer")
    timing: str = param("fpga-cxlhm", "", "CXL-HM timing preset")
    scale: int = param(1, "", "divides the CXL-HM sizes and its device blocks")

    def __post_init__(self) -> None:
        if self.users < 1 or self.turns < 1 or self.workers < 1:
            raise ValueError(f"{type(self).__name__}: users, turns and workers must be >= 1")


@dataclass(frozen=True)
class NvmeofParams(_ChatNodeParams):
    """Fig. 9: NVMe-oF raw block device vs XFS, with the timeout fallback."""

    ssd_bytes: int = param(2 << 40, "bytes", "NVMe-oF capacity (the CXL-HM device's)")
    load_timeout_s: float = param(0.5, "s", "the connector's load timeout (assumed)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.load_timeout_s < 0:
            raise ValueError("NvmeofParams: load_timeout_s must be >= 0")


def _nvmeof_systems(p: NvmeofParams, timeout_s: float) -> list[SystemSpec]:
    base = SystemSpec(
        "nvmeof-xfs",
        tier_capacity_bytes=p.ssd_bytes,
        tier_shared=True,
        tier=TIERS["fs-ssd"],
        load_timeout_s=timeout_s,
    )
    return [
        SystemSpec("recompute", gpu_cache=False),
        base,
        dataclasses.replace(base, name="nvmeof-raw", tier=TIERS["nvmeof-raw"]),
    ]


def fig9_nvmeof(
    p: NvmeofParams, timeouts: Sequence[float] = (), progress: Progress = None
) -> FigureData:
    """Fig. 9: recompute, NVMe-oF with XFS and raw, HyMCache; ``timeouts``
    (besides ``p.load_timeout_s``) replay both NVMe-oF systems again with
    those timeouts, the sweep of the verdict's modeling choice."""
    setup = configure(p.model, p.gpu, ["recompute"])
    pm = setup.prefill
    reqs = _chat(p)
    results: list[RequestResult] = []
    timeouts_n: dict[str, int] = {}
    for s in _nvmeof_systems(p, p.load_timeout_s):
        rp = BaselineReplay(s, pm, workers=p.workers)
        for r in reqs:
            rp.step(r)
            if progress is not None:
                progress(1)
        results += rp.results
        timeouts_n[s.name] = rp.timeouts
    hy = _hymcache(reqs, pm, p, p.workers, progress)
    results += [r.result for r in hy]
    rec = _mean_ttft(results, "recompute")
    sweeps: dict[str, list[tuple[float, float]]] = {"nvmeof-xfs": [], "nvmeof-raw": []}
    for t in sorted({p.load_timeout_s, *timeouts}):
        for s in _nvmeof_systems(p, t)[1:]:
            rs = simulate(reqs, s, pm, workers=p.workers)
            sweeps[s.name].append((t, sum(r.ttft_s for r in rs) / len(rs) / rec))
    xfs = _mean_ttft(results, "nvmeof-xfs") / rec
    summary = {
        "requests": len(reqs),
        "load_timeout_s": p.load_timeout_s,
        "mean_ttft_s": {
            s: _mean_ttft(results, s) for s in dict.fromkeys(r.system for r in results)
        },
        "timeouts": timeouts_n,
        "ttft_over_recompute_by_timeout": {
            k: [{"timeout_s": t, "ratio": v} for t, v in pts] for k, pts in sweeps.items()
        },
        "tier_bandwidth_Bps": {
            "nvmeof-xfs": TIERS["fs-ssd"].bandwidth_Bps,
            "nvmeof-raw": TIERS["nvmeof-raw"].bandwidth_Bps,
        },
    }
    sweep_txt = ", ".join(f"{t:g} s: {v:.2f}" for t, v in sweeps["nvmeof-xfs"])
    claims = [
        Claim(
            f"NVMe-oF XFS mean TTFT / recompute [timeout {p.load_timeout_s:g} s; "
            f"by timeout {sweep_txt}]",
            xfs,
            0.8,
            True,
            "NVMe-oF with XFS performs close to recomputation (timeouts fall back to it)",
        ),
        Claim(
            "HyMCache mean TTFT / NVMe-oF XFS",
            _mean_ttft(results, "hymcache") / _mean_ttft(results, "nvmeof-xfs"),
            1.0,
            False,
            "HyMCache keeps the file system off the read path",
        ),
    ]
    return FigureData("fig9", results, {"hymcache": hy}, sweeps, summary, claims)


# ---- Fig. 10


@dataclass(frozen=True)
class TransferBufferParams(PdParams):
    """Fig. 10: PD serving (as Fig. 8) with the host transfer buffer swept."""

    transfer_drain_Bps: float = param(
        25e9, "B/s", "Mooncake: a full transfer buffer drains at the link rate (assumed)"
    )
    knee_bytes: int = param(10 << 30, "bytes", "the buffer the paper's statement is about")


def fig10_transfer_buffer(
    p: TransferBufferParams,
    buffers: Sequence[int],
    progress: Progress = None,
    drains: Sequence[float] = (),
) -> FigureData:
    """Fig. 10: mean TTFT per host transfer-buffer size, Mooncake and HyMCache.

    ``buffers`` must include ``p.knee_bytes`` and a larger size. ``drains``:
    Mooncake's knee ratio is also replayed with these drain rates (B/s), the
    modeling choice its verdict rests on."""
    bufs = sorted(set(buffers))
    if p.knee_bytes not in bufs or bufs[-1] <= p.knee_bytes:
        raise ValueError(
            f"the buffer sweep needs {p.knee_bytes} bytes (knee_bytes) and a larger size"
        )
    pm, systems = _pd_systems(p, ())
    pool = next(s for s in systems if s.name == "remote-dram-pool")
    reqs = _chat(p)
    results: list[RequestResult] = []
    hy_all: dict[str, list[CxlhmRequest]] = {}
    sweeps: dict[str, list[tuple[float, float]]] = {"mooncake": [], "hymcache": []}
    for b in bufs:
        s = dataclasses.replace(
            pool,
            name=f"mooncake@{b >> 30}G",
            transfer_buffer_bytes=b,
            transfer_drain_Bps=p.transfer_drain_Bps,
        )
        rs = simulate(reqs, s, pm, workers=p.prefill_workers, progress=progress)
        results += rs
        sweeps["mooncake"].append((b, sum(r.ttft_s for r in rs) / len(rs)))
        name = f"hymcache@{b >> 30}G"
        hy = _hymcache(reqs, pm, p, p.prefill_workers, progress, window_bytes=b, name=name)
        hy_all[name] = hy
        results += [r.result for r in hy]
        sweeps["hymcache"].append((b, sum(r.result.ttft_s for r in hy) / len(hy)))

    def at(label: str, b: int) -> float:
        return dict(sweeps[label])[b]

    big = bufs[-1]
    moon = at("mooncake", p.knee_bytes) / at("mooncake", big)

    def knee(drain: float) -> float:
        t = {}
        for b in (p.knee_bytes, big):
            s = dataclasses.replace(
                pool, transfer_buffer_bytes=b, transfer_drain_Bps=drain, name="mooncake"
            )
            rs = simulate(reqs, s, pm, workers=p.prefill_workers)
            t[b] = sum(r.ttft_s for r in rs) / len(rs)
        return t[p.knee_bytes] / t[big]

    by_drain = [(p.transfer_drain_Bps, moon)]
    by_drain += [(d, knee(d)) for d in drains if d != p.transfer_drain_Bps]
    hym = max(at("hymcache", b) for b in bufs if b >= p.knee_bytes) / at("hymcache", big)
    summary = {
        "requests": len(reqs),
        "buffers_bytes": bufs,
        "mean_ttft_s": {
            k: [{"buffer_bytes": b, "ttft_s": v} for b, v in pts] for k, pts in sweeps.items()
        },
        "mooncake_knee_over_largest": moon,
        "hymcache_above_knee_over_largest": hym,
        "mooncake_knee_ratio_by_drain": [{"drain_Bps": d, "ratio": r} for d, r in by_drain],
    }
    drain_txt = "; ".join(f"{d / 1e9:g} GB/s: {r:.2f}" for d, r in by_drain)
    claims = [
        Claim(
            f"Mooncake mean TTFT at {p.knee_bytes >> 30} GiB / at {big >> 30} GiB "
            f"[drain {p.transfer_drain_Bps / 1e9:g} GB/s; by drain {drain_txt}]",
            moon,
            1.1,
            True,
            "Mooncake suffers transfer-buffer pressure at 10 GB",
        ),
        Claim(
            f"HyMCache mean TTFT, worst at >= {p.knee_bytes >> 30} GiB / at {big >> 30} GiB",
            hym,
            1.05,
            False,
            "HyMCache flat above 10 GB: it skips writes instead of waiting",
        ),
    ]
    return FigureData("fig10", results, hy_all, sweeps, summary, claims)


# ---- Fig. 12


@dataclass(frozen=True)
class RedisParams(_ChatNodeParams):
    """Fig. 12: Redis-backed LMCache against HyMCache, single node."""

    redis_bytes: int = param(64 << 30, "bytes", "Redis maxmemory (noeviction: stores fail)")
    local_dram_bytes: int = param(64 << 30, "bytes", "LMCache local DRAM per worker")
    late_turn: int = param(6, "", "the turn the paper compares distributions at (1-based)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.late_turn <= self.turns:
            raise ValueError(f"RedisParams: late_turn must be in 1..{self.turns}")


def fig12_redis(p: RedisParams, progress: Progress = None) -> FigureData:
    """Fig. 12: Redis alone, LMCache + Redis, HyMCache: per-turn TTFT distribution."""
    setup = configure(p.model, p.gpu, ["gpu-prefix"])
    pm = setup.prefill
    redis_only = SystemSpec(
        "redis-only",
        tier_capacity_bytes=p.redis_bytes,
        tier_shared=True,
        tier=TIERS["redis"],
        store_fails_when_full=True,
    )
    lmc_redis = SystemSpec(
        "lmcache+redis",
        tier_capacity_bytes=p.local_dram_bytes,
        tier=TIERS["local-dram"],
        l2_capacity_bytes=p.redis_bytes,
        l2_store_fails_when_full=True,
        l2_tier=TIERS["redis"],
    )
    reqs = _chat(p)
    results: list[RequestResult] = []
    failures: dict[str, int] = {}
    for s in (redis_only, lmc_redis):
        rp = BaselineReplay(s, pm, workers=p.workers)
        for r in reqs:
            rp.step(r)
            if progress is not None:
                progress(1)
        results += rp.results
        failures[s.name] = rp.store_failures
    hy = _hymcache(reqs, pm, p, p.workers, progress)
    results += [r.result for r in hy]
    late = p.late_turn - 1
    st = {s: turn_stats(results, s, late) for s in ("redis-only", "lmcache+redis", "hymcache")}
    summary = {
        "requests": len(reqs),
        "footprint_bytes": _footprint(reqs, pm),
        "store_failures": failures,
        f"turn{p.late_turn}": st,
    }
    claims = [
        Claim(
            "Redis-only store failures",
            failures["redis-only"],
            1,
            True,
            "Redis-only 64 GB: frequent store failures",
        ),
        Claim(
            f"turn {p.late_turn} hit rate, LMCache+Redis - Redis-only (points)",
            100 * (st["lmcache+redis"]["hit_rate"] - st["redis-only"]["hit_rate"]),
            0.0,
            True,
            "store failures break prefix chains; LMCache + Redis is more stable",
        ),
        Claim(
            f"turn {p.late_turn} p50 TTFT, HyMCache / LMCache+Redis [Redis loads at "
            f"{TIERS['redis'].bandwidth_Bps / 1e9:g} GB/s, assumed]",
            st["hymcache"]["p50_ttft_s"] / st["lmcache+redis"]["p50_ttft_s"],
            1.2,
            False,
            "HyMCache keeps a similar latency distribution at turn 6",
        ),
    ]
    return FigureData("fig12", results, {"hymcache": hy}, {}, summary, claims)
