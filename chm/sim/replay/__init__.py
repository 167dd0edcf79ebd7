"""Replay models: baseline KV caches, modeled prefill and load time, costs.

Pure Python policy over :mod:`chm.sim.workloads` requests: :mod:`~chm.sim.replay.baselines`
replays a workload through recomputation, a GPU prefix cache, local and remote
DRAM tiers and a file system on SSD; :mod:`~chm.sim.replay.prefill` and
:mod:`~chm.sim.replay.tiers` give the modeled TTFT; :mod:`~chm.sim.replay.cost` the
paper's Table 1. Every parameter prints and overrides by name
(:mod:`~chm.sim.replay.params`).

The CXL-HM systems run on a device (import them explicitly, they need the C
core): :mod:`~chm.sim.replay.cxlhm` (lru mode and prefetch mode, the tier a
:class:`chm.kv.Store` on the device: its prefix lookup, load path, puts and
eviction), :mod:`~chm.sim.replay.cxlhm_run` (ghost devices in
virtual time, write-buffer sweeps) and :mod:`~chm.sim.replay.demo` (the
real-time ``chm-emu demo``).
"""

from __future__ import annotations

from chm.sim.replay.baselines import (
    SYSTEMS,
    BaselineReplay,
    SystemSpec,
    baseline_systems,
    capacity_sweep,
    simulate,
    simulate_closed_loop,
)
from chm.sim.replay.configure import ReplaySetup, configure
from chm.sim.replay.lru import LruBlocks
from chm.sim.replay.params import apply_overrides, param_rows, parse_overrides, split_scoped
from chm.sim.replay.prefill import GPUS, MODELS, GpuPreset, ModelPreset, PrefillModel
from chm.sim.replay.results import RequestResult, TurnSummary, per_turn, write_csv, write_json
from chm.sim.replay.tiers import TIERS, TierParams

__all__ = [
    "BaselineReplay",
    "GPUS",
    "MODELS",
    "SYSTEMS",
    "TIERS",
    "GpuPreset",
    "LruBlocks",
    "ModelPreset",
    "PrefillModel",
    "ReplaySetup",
    "RequestResult",
    "SystemSpec",
    "TierParams",
    "TurnSummary",
    "apply_overrides",
    "baseline_systems",
    "capacity_sweep",
    "configure",
    "param_rows",
    "parse_overrides",
    "per_turn",
    "simulate",
    "simulate_closed_loop",
    "split_scoped",
    "write_csv",
    "write_json",
]
