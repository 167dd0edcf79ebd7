"""How a verdict moves with the modeling choices behind it.

The prefetch/lru load-bandwidth ratio of the CXL-HM replays depends on
choices the paper does not pin down: the lru mode's cache line (a 16 MiB
block is 256 lookups and SSD pieces at 64 KiB, 16 at 1 MiB), the block
scale of a scaled replay (``GhostSetup.scale``: device blocks 1/scale of
the model's, the line unchanged) and the timing preset. A verdict on the
ratio therefore names the choice it used, and :func:`ratio_sweep` replays
the same requests under alternatives, one choice varied at a time
(:func:`one_at_a_time`), so a reader sees where the paper's claim holds and
where it does not. Prefetch mode has no line: its replays are shared by all
lines of one (timing, scale).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from chm.sim.replay.cxlhm import CxlhmRequest
from chm.sim.replay.cxlhm_run import GhostSetup, replay_virtual
from chm.sim.replay.prefill import PrefillModel
from chm.sim.workloads.records import Request
from chm.sizes import format_size

__all__ = ["Choice", "RatioPoint", "describe", "load_bw", "one_at_a_time", "ratio_sweep"]


@dataclass(frozen=True, order=True)
class Choice:
    """One set of the modeling choices a CXL-HM ratio depends on."""

    timing: str
    lru_line_bytes: int
    scale: int

    @classmethod
    def of(cls, setup: GhostSetup) -> Choice:
        return cls(setup.timing, setup.lru_line_bytes, setup.scale)

    def apply(self, setup: GhostSetup) -> GhostSetup:
        return dataclasses.replace(
            setup, timing=self.timing, lru_line_bytes=self.lru_line_bytes, scale=self.scale
        )

    def label(self) -> str:
        return (
            f"lru line {format_size(self.lru_line_bytes, exact=False)}, "
            f"scale {self.scale}, {self.timing}"
        )


@dataclass(frozen=True)
class RatioPoint:
    """Load bandwidths of both modes under one :class:`Choice`."""

    choice: Choice
    lru_bw_Bps: float
    prefetch_bw_Bps: float

    @property
    def ratio(self) -> float:
        """prefetch / lru (0 when lru loaded nothing)."""
        return self.prefetch_bw_Bps / self.lru_bw_Bps if self.lru_bw_Bps > 0 else 0.0


def load_bw(rs: Sequence[CxlhmRequest]) -> float:
    """Device bytes loaded / device load time over a replay (0 without loads)."""
    b = sum(r.device_load_bytes for r in rs)
    s = sum(r.device_load_s for r in rs)
    return b / s if s > 0 else 0.0


def one_at_a_time(
    used: Choice,
    *,
    timings: Iterable[str] = (),
    lru_lines: Iterable[int] = (),
    scales: Iterable[int] = (),
) -> list[Choice]:
    """``used`` first, then each alternative varying one choice, no repeats."""
    out = [used]
    alts = [dataclasses.replace(used, timing=t) for t in timings]
    alts += [dataclasses.replace(used, lru_line_bytes=n) for n in lru_lines]
    alts += [dataclasses.replace(used, scale=s) for s in scales]
    for c in alts:
        if c not in out:
            out.append(c)
    return out


def ratio_sweep(
    requests: Sequence[Request],
    prefill: PrefillModel,
    setup: GhostSetup,
    choices: Sequence[Choice],
    *,
    workers: int = 1,
    hbm_kv_bytes: int = 0,
    known: dict[Choice, RatioPoint] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[RatioPoint]:
    """Both modes' load bandwidth under each choice (``known``: points
    already replayed, reused as they are). A choice whose scale does not
    divide the model's block is a ValueError (as :func:`replay_virtual`)."""
    prefetch: dict[tuple[str, int], float] = {}
    for c, p in (known or {}).items():
        prefetch[(c.timing, c.scale)] = p.prefetch_bw_Bps
    out = []
    for c in choices:
        if known and c in known:
            out.append(known[c])
            continue
        s = c.apply(setup)

        def run(system: str, s: GhostSetup = s) -> float:
            rs = replay_virtual(
                requests,
                system,
                prefill,
                s,
                workers=workers,
                hbm_kv_bytes=hbm_kv_bytes,
                progress=progress,
            )
            return load_bw(rs)

        lru = run("cxlhm-lru")
        key = (c.timing, c.scale)
        if key not in prefetch:
            prefetch[key] = run("cxlhm-prefetch")
        out.append(RatioPoint(c, lru, prefetch[key]))
    return out


def _ratio_text(p: RatioPoint) -> str:
    """The ratio, or that there was none: lru mode loaded nothing (its ratio
    reads 0, which is not a measured 0.00x)."""
    return f"{p.ratio:.2f}x" if p.lru_bw_Bps > 0 else "not measured (no lru loads)"


def describe(points: Sequence[RatioPoint], target: float) -> str:
    """One line: the first point (the choice used) and every alternative
    with what differs from it, and in how many the ratio meets ``target``."""
    if not points:
        return "no modeling choices replayed"
    used = points[0].choice
    parts = [f"{used.label()}: {_ratio_text(points[0])}"]
    for p in points[1:]:
        c, diff = p.choice, []
        if c.lru_line_bytes != used.lru_line_bytes:
            diff.append(f"lru line {format_size(c.lru_line_bytes, exact=False)}")
        if c.scale != used.scale:
            diff.append(f"scale {c.scale}")
        if c.timing != used.timing:
            diff.append(c.timing)
        parts.append(f"{', '.join(diff)}: {_ratio_text(p)}")
    held = sum(p.ratio >= target for p in points)
    return f"{'; '.join(parts)} (>= {target:.2f}x in {held} of {len(points)})"
