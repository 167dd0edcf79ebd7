"""The baseline KV caches a multi-turn replay compares against.

Each system is a GPU prefix cache per worker (G1, optional) in front of at
most one KV tier, which is either per worker or shared by all workers:

=================  ===========  =====================  ====================
system             G1 (HBM)     tier                   tier scope
=================  ===========  =====================  ====================
recompute          no           none                   -
gpu-prefix         yes          none                   -
local-dram-lru     yes          host DRAM (LMCache)    per worker
remote-dram-pool   yes          remote DRAM (Mooncake) shared
fs-ssd             yes          files on NVMe-oF SSD   shared
=================  ===========  =====================  ====================

Per request (:func:`simulate`): the prompt's full blocks are looked up with
prefix semantics, first in the worker's G1 (the longest held prefix), then
the tier from there on (the longest held run); the rest is computed. Then
every block of the request is accessed in order in G1 and in the tier: the
request holds all of them in HBM, and the connector stores what the tier
lacks (an inclusive hierarchy). Every cache is an LRU over blocks
(:class:`~chm.sim.replay.lru.LruBlocks`) with a capacity of
``capacity_bytes // block_bytes`` blocks. A request runs on worker
``session % workers`` (a session stays on its worker), or ``index % workers``
when the workload has no sessions.

TTFT = prefill compute of the uncached tokens (:mod:`chm.sim.replay.prefill`)
+ the load time of the tier's bytes (:mod:`chm.sim.replay.tiers`); G1 hits cost
nothing to load.

Policies a :class:`SystemSpec` can add (all off by default):

- ``store_fails_when_full``: the tier refuses new blocks when full instead
  of evicting (Redis under ``maxmemory-policy noeviction``, its default): a
  refused block is a hole that ends every later prefix there.
- ``l2_capacity_bytes``: a second, shared tier behind the first (LMCache
  local DRAM in front of Redis); the prefix continues in it where the first
  tier's ends, and its bytes load at its own ``l2_tier`` cost.
- ``transfer_buffer_bytes``: the tier's traffic of a request (its loads and
  the stores of the blocks the tier lacks) crosses a host buffer of which
  each worker has ``1/workers``; what exceeds the share waits for it to
  drain at ``transfer_drain_Bps`` (Mooncake's transfer buffer).
- ``load_timeout_s``: a load (with its buffer wait) longer than the timeout
  is abandoned at the timeout and the request recomputes everything after
  G1 (the connector's fallback).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from chm.sim.replay.lru import LruBlocks
from chm.sim.replay.params import param
from chm.sim.replay.prefill import PrefillModel
from chm.sim.replay.results import RequestResult
from chm.sim.replay.tiers import TIERS, TierParams
from chm.sim.workloads.records import Request
from chm.sim.workloads.synthetic import schedule_closed_loop

__all__ = [
    "SYSTEMS",
    "BaselineReplay",
    "SystemSpec",
    "baseline_systems",
    "capacity_sweep",
    "simulate",
    "simulate_closed_loop",
]

SYSTEMS = ("recompute", "gpu-prefix", "local-dram-lru", "remote-dram-pool", "fs-ssd")


@dataclass(frozen=True)
class SystemSpec:
    """One cache system: G1 on or off, and its tier (capacity 0: no tier)."""

    name: str = param("local-dram-lru", "", "system name")
    gpu_cache: bool = param(True, "", "GPU prefix cache (G1) per worker")
    hbm_kv_bytes: int = param(0, "bytes", "G1 capacity per worker (0: from the GPU preset)")
    tier_capacity_bytes: int = param(0, "bytes", "tier capacity (per worker or shared)")
    tier_shared: bool = param(False, "", "one tier for all workers (else one per worker)")
    tier: TierParams = field(default_factory=TierParams)
    store_fails_when_full: bool = param(
        False, "", "a full tier refuses new blocks instead of evicting (Redis noeviction)"
    )
    load_timeout_s: float = param(
        0.0, "s", "a tier load longer than this falls back to recomputation (0: never)"
    )
    transfer_buffer_bytes: int = param(
        0, "bytes", "host transfer buffer all tier traffic goes through (0: unbounded)"
    )
    transfer_drain_Bps: float = param(
        25e9, "B/s", "rate a full transfer buffer drains at (traffic beyond it waits)"
    )
    l2_capacity_bytes: int = param(0, "bytes", "second tier behind the first (0: none), shared")
    l2_store_fails_when_full: bool = param(False, "", "the second tier refuses blocks when full")
    l2_tier: TierParams = field(default_factory=lambda: TIERS["redis"])

    def __post_init__(self) -> None:
        if self.hbm_kv_bytes < 0 or self.tier_capacity_bytes < 0 or self.l2_capacity_bytes < 0:
            raise ValueError(f"SystemSpec {self.name!r}: capacities must be >= 0 bytes")
        if self.load_timeout_s < 0 or self.transfer_buffer_bytes < 0:
            raise ValueError(
                f"SystemSpec {self.name!r}: load_timeout_s and transfer_buffer_bytes must be >= 0"
            )
        if self.transfer_drain_Bps <= 0:
            raise ValueError(f"SystemSpec {self.name!r}: transfer_drain_Bps must be > 0")


def baseline_systems(
    *,
    local_dram_bytes: int = 64 << 30,
    remote_pool_bytes: int = 1 << 40,
    fs_ssd_bytes: int = 2 << 40,
    hbm_kv_bytes: int = 0,
) -> dict[str, SystemSpec]:
    """The five baselines with the paper's budgets (Sec. 5 baselines table).

    LMCache has 64 GB of host DRAM per worker; Mooncake a 1 TB shared DRAM
    pool; the NVMe-oF file system the same 2 TB as the CXL-HM device.
    ``hbm_kv_bytes`` 0 takes G1's size from the model and GPU at simulation.
    """
    return {
        "recompute": SystemSpec("recompute", gpu_cache=False, tier=TIERS["local-dram"]),
        "gpu-prefix": SystemSpec("gpu-prefix", hbm_kv_bytes=hbm_kv_bytes, tier=TIERS["local-dram"]),
        "local-dram-lru": SystemSpec(
            "local-dram-lru",
            hbm_kv_bytes=hbm_kv_bytes,
            tier_capacity_bytes=local_dram_bytes,
            tier=TIERS["local-dram"],
        ),
        "remote-dram-pool": SystemSpec(
            "remote-dram-pool",
            hbm_kv_bytes=hbm_kv_bytes,
            tier_capacity_bytes=remote_pool_bytes,
            tier_shared=True,
            tier=TIERS["remote-dram"],
        ),
        "fs-ssd": SystemSpec(
            "fs-ssd",
            hbm_kv_bytes=hbm_kv_bytes,
            tier_capacity_bytes=fs_ssd_bytes,
            tier_shared=True,
            tier=TIERS["fs-ssd"],
        ),
    }


def _worker_of(r: Request, workers: int) -> int:
    return (r.session if r.session is not None else r.index) % workers


class BaselineReplay:
    """One system's caches, fed one request at a time (:meth:`step`).

    :func:`simulate` runs a whole workload; a closed-loop replay calls
    :meth:`step` from :func:`~chm.sim.workloads.schedule_closed_loop`'s service
    time, so the system's own TTFT decides when the next turn arrives.
    """

    def __init__(self, system: SystemSpec, prefill: PrefillModel, *, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.system = system
        self.prefill = prefill
        self.workers = workers
        self.results: list[RequestResult] = []
        self._hbm = system.hbm_kv_bytes or prefill.hbm_kv_bytes()
        self._g1: list[LruBlocks] = []
        self._tiers: list[LruBlocks] = []
        self._l2: LruBlocks | None = None
        self._block_bytes = 0
        self.timeouts = 0  # tier loads that fell back to recomputation
        self.buffer_wait_s = 0.0  # summed transfer-buffer waits

    @property
    def store_failures(self) -> int:
        """Blocks the tiers refused because they were full."""
        return sum(t.store_failures for t in self._tiers) + (
            self._l2.store_failures if self._l2 is not None else 0
        )

    def _caches_for(self, r: Request) -> int:
        """Sizes the caches at the first request; returns the block bytes."""
        bb = self.prefill.model.block_bytes(r.block_tokens)
        if not self._block_bytes:
            self._block_bytes = bb
            s = self.system
            if s.gpu_cache:
                self._g1 = [LruBlocks(self._hbm // bb) for _ in range(self.workers)]
            if s.tier_capacity_bytes:
                n = 1 if s.tier_shared else self.workers
                ev = not s.store_fails_when_full
                self._tiers = [LruBlocks(s.tier_capacity_bytes // bb, evict=ev) for _ in range(n)]
            if s.l2_capacity_bytes:
                l2_evict = not s.l2_store_fails_when_full
                self._l2 = LruBlocks(s.l2_capacity_bytes // bb, evict=l2_evict)
        elif bb != self._block_bytes:
            raise ValueError(
                f"request {r.index} has {r.block_tokens}-token blocks; earlier requests "
                "had another block size (one replay, one block size)"
            )
        return bb

    def step(self, r: Request) -> RequestResult:
        """Looks the request up, updates the caches, and records the result."""
        bb = self._caches_for(r)
        system = self.system
        w = _worker_of(r, self.workers)
        keys = r.block_keys
        gpu = self._g1[w] if self._g1 else None
        tier = None
        if self._tiers:
            tier = self._tiers[0] if system.tier_shared else self._tiers[w]
        l2 = self._l2
        p1 = gpu.prefix_len(keys) if gpu is not None else 0
        p2 = tier.prefix_len(keys, p1) if tier is not None else 0
        p3 = l2.prefix_len(keys, p1 + p2) if l2 is not None else 0
        load_s = system.tier.load_s(p2 * bb) + system.l2_tier.load_s(p3 * bb)
        if system.transfer_buffer_bytes:
            # loads and the stores of the blocks the tier lacks cross the
            # host buffer; each worker has its share, the rest waits for it
            # to drain
            held = tier if tier is not None else l2
            stores = sum(k not in held for k in keys) if held is not None else 0
            traffic = (p2 + p3 + stores) * bb
            share = system.transfer_buffer_bytes // self.workers
            wait = max(0, traffic - share) / system.transfer_drain_Bps
            self.buffer_wait_s += wait
            load_s += wait
        if system.load_timeout_s and load_s > system.load_timeout_s:
            # the connector gives up at the deadline and recomputes
            self.timeouts += 1
            p2 = p3 = 0
            load_s = system.load_timeout_s
        if gpu is not None:
            gpu.access(keys)
        if tier is not None:
            tier.access(keys)
        if l2 is not None:
            l2.access(keys)
        p2 += p3
        cached = (p1 + p2) * r.block_tokens
        tier_bytes = p2 * bb
        result = RequestResult(
            system=system.name,
            index=r.index,
            session=r.session,
            turn=r.turn,
            worker=w,
            arrival_s=r.arrival_s,
            input_tokens=r.input_tokens,
            blocks=len(keys),
            gpu_hit_blocks=p1,
            tier_hit_blocks=p2,
            block_tokens=r.block_tokens,
            gpu_bytes=p1 * bb,
            tier_name=system.tier.name if tier is not None else "",
            tier_bytes=tier_bytes,
            compute_s=self.prefill.compute_s(r.input_tokens - cached, cached),
            load_s=load_s,
        )
        self.results.append(result)
        return result


def simulate(
    requests: Iterable[Request],
    system: SystemSpec,
    prefill: PrefillModel,
    *,
    workers: int = 1,
    progress: Callable[[int], None] | None = None,
) -> list[RequestResult]:
    """Replays ``requests`` in order through ``system``; one result per request.

    ``progress`` (if given) is called with 1 after each request.
    """
    replay = BaselineReplay(system, prefill, workers=workers)
    for r in requests:
        replay.step(r)
        if progress is not None:
            progress(1)
    return replay.results


def simulate_closed_loop(
    requests: Iterable[Request],
    system: SystemSpec,
    prefill: PrefillModel,
    *,
    concurrency: int,
    workers: int = 1,
    progress: Callable[[int], None] | None = None,
) -> list[RequestResult]:
    """Replays sessions as a closed loop whose service time is the modeled TTFT.

    A turn arrives its think time after the previous turn's first token
    (decode time is not modeled); see
    :func:`~chm.sim.workloads.schedule_closed_loop`. Results are in arrival order.
    """
    replay = BaselineReplay(system, prefill, workers=workers)

    def service(r: Request) -> float:
        ttft = replay.step(r).ttft_s
        if progress is not None:
            progress(1)
        return ttft

    schedule_closed_loop(requests, concurrency, service)
    return replay.results


def capacity_sweep(
    requests: Sequence[Request],
    capacities_bytes: Iterable[int],
    prefill: PrefillModel,
    *,
    tier: TierParams | None = None,
    workers: int = 1,
) -> list[tuple[int, float]]:
    """(capacity, prefix hit rate) of one shared LRU tier, no G1, per capacity.

    The hit rate is cached tokens / prompt tokens over the whole workload.
    """
    total = sum(r.input_tokens for r in requests)
    if not total:
        raise ValueError("capacity_sweep needs at least one request")
    out = []
    for cap in capacities_bytes:
        system = SystemSpec(
            "lru-tier",
            gpu_cache=False,
            tier_capacity_bytes=cap,
            tier_shared=True,
            tier=tier or TierParams(),
        )
        res = simulate(requests, system, prefill, workers=workers)
        out.append((cap, sum(r.cached_tokens for r in res) / total))
    return out
