"""``--quick`` replays: the sizes of a smoke run and how its figures are judged.

A smoke run replays a small workload on a scaled ghost device in a few
seconds. It is too small for the paper's statements (a 3-user workload has
no late-turn reuse worth the name), so each figure is judged on having been
measured -- a finite value, the replay ran end to end -- and its full-run
target is shown beside it. Figures that hold in any run (a sweep that
repeats exactly, every system replayed) keep their targets.

The tools (``tools/replay/figures.py``, ``tools/replay/paper_scale.py``)
take their ``--quick`` sizes from here: :data:`QUICK_OVERRIDES` as
parameter overrides of a figure's parameters (:mod:`chm.sim.replay.params`),
:data:`QUICK_FIGURE_OVERRIDES` per figure, and :func:`quick_chat` for a
:class:`~chm.sim.workloads.ChatWorkload`.
"""

from __future__ import annotations

import dataclasses
import math

from chm.sim.workloads import ChatWorkload

__all__ = [
    "QUICK_FIGURE_OVERRIDES",
    "QUICK_HBM_KV_BYTES",
    "QUICK_OVERRIDES",
    "QUICK_SCALE",
    "QUICK_TRANSFER_BUFFERS",
    "quick_chat",
    "smoke_claim",
]

QUICK_SCALE = 64
"""Device sizes and blocks divided by this (a 16 MiB block becomes 256 KiB)."""

QUICK_OVERRIDES: dict[str, str] = {
    "users": "3",
    "turns": "3",
    "user_tokens_min": "1000",
    "user_tokens_max": "2000",
    "scale": str(QUICK_SCALE),
}
"""Parameter overrides every figure's smoke run applies (before ``--set``)."""

QUICK_FIGURE_OVERRIDES: dict[str, dict[str, str]] = {
    "fig8": {"late_turn": "3"},
    "fig9": {"load_timeout_s": "0.02"},
    "fig10": {"late_turn": "3", "knee_bytes": "1G"},
    "fig12": {"late_turn": "3", "redis_bytes": "256M", "local_dram_bytes": "128M"},
}
"""Per figure, on top of :data:`QUICK_OVERRIDES`: the late turn within 3 turns
and the capacities a 3-user workload fills."""

QUICK_TRANSFER_BUFFERS: list[int] = [512 << 20, 1 << 30, 4 << 30]
"""Fig. 10's host transfer buffers in a smoke run (around its 1 GiB knee)."""

QUICK_HBM_KV_BYTES = 64 << 20
"""G1 (HBM) KV bytes per worker in a smoke run of the paper-scale workload:
smaller than one turn's context, so every system reaches its lower tiers
(with a GPU preset's tens of GB, 9 requests never leave G1 and the device
sees no load to measure)."""


def quick_chat(wl: ChatWorkload) -> ChatWorkload:
    """``wl`` cut to a smoke run's size: at most 3 users x 3 turns of 1,000-2,000
    new tokens each (the system prompt, outputs and seed unchanged)."""
    lo, hi = wl.user_tokens
    users, turns = int(QUICK_OVERRIDES["users"]), int(QUICK_OVERRIDES["turns"])
    qlo, qhi = int(QUICK_OVERRIDES["user_tokens_min"]), int(QUICK_OVERRIDES["user_tokens_max"])
    return dataclasses.replace(
        wl,
        users=min(wl.users, users),
        turns=min(wl.turns, turns),
        user_tokens=(min(lo, qlo), min(hi, qhi)),
    )


def smoke_claim(name: str, value: float, target: float, *, higher: bool = True) -> tuple[str, bool]:
    """A figure judged as a smoke target: (its verdict label, met).

    Met when the figure was measured (finite); the label carries this run's
    value and the full run's target.
    """
    op = ">=" if higher else "<="
    label = (
        f"{name} measured (--quick smoke target; this run {value:.3g}, "
        f"a full run's target {op} {target:.3g})"
    )
    return label, math.isfinite(value)
