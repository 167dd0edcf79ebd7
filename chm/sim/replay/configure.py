"""One replay's setup from names and ``SCOPE.NAME=VALUE`` overrides.

Scopes: ``model``, ``gpu``, each system name (its :class:`SystemSpec`
fields), ``<system>.tier`` and ``<system>.l2_tier`` (its
:class:`TierParams`). For example
``gpu.mfu=0.4``, ``local-dram-lru.tier_capacity_bytes=128G``,
``fs-ssd.tier.bandwidth_Bps=3e9``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from chm.sim.replay.baselines import SystemSpec, baseline_systems
from chm.sim.replay.params import apply_overrides, split_scoped
from chm.sim.replay.prefill import GPUS, MODELS, PrefillModel

__all__ = ["ReplaySetup", "configure"]


@dataclass(frozen=True)
class ReplaySetup:
    """The prefill model and the systems (in the order asked for) of one replay."""

    prefill: PrefillModel
    systems: dict[str, SystemSpec]


def configure(
    model: str = "llama-3.1-8b",
    gpu: str = "a100-80g",
    systems: Iterable[str] | None = None,
    overrides: Iterable[str] = (),
) -> ReplaySetup:
    """Presets by name, the baselines asked for (all by default), overrides applied.

    An unknown preset, system or scope is a ValueError listing the known ones.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r} (known: {', '.join(MODELS)})")
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r} (known: {', '.join(GPUS)})")
    every = baseline_systems()
    names = list(every) if systems is None else list(systems)
    for n in names:
        if n not in every:
            raise ValueError(f"unknown system {n!r} (known: {', '.join(every)})")
    if not names:
        raise ValueError("no systems to replay")
    scopes = [
        "model",
        "gpu",
        *names,
        *(f"{n}.tier" for n in names),
        *(f"{n}.l2_tier" for n in names),
    ]
    by_scope = split_scoped(overrides, scopes)
    m = apply_overrides(MODELS[model], by_scope.get("model", {}))
    g = apply_overrides(GPUS[gpu], by_scope.get("gpu", {}))
    chosen: dict[str, SystemSpec] = {}
    for n in names:
        spec = apply_overrides(every[n], by_scope.get(n, {}))
        tier = apply_overrides(spec.tier, by_scope.get(f"{n}.tier", {}))
        l2 = apply_overrides(spec.l2_tier, by_scope.get(f"{n}.l2_tier", {}))
        chosen[n] = dataclasses.replace(spec, tier=tier, l2_tier=l2)
    return ReplaySetup(PrefillModel(m, g), chosen)
