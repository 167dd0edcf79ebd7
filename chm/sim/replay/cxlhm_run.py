"""CXL-HM replays in virtual time: ghost devices sized like the paper's, or scaled.

The paper's device is 2 TB of SSD behind 64 GB of DRAM, with 16 MB KV blocks
(Llama-3.1-8B). ``scale`` divides the device's capacity, DRAM, write buffer
and block size by the same factor, so every ratio (DRAM / footprint, blocks
per window, write buffer / block) stays the paper's while the replay's
memory and time shrink; load times are scaled back by
:class:`~chm.sim.replay.cxlhm.CxlhmReplay`. A ghost device holds no data (its
writes carry no payload, its lines no bytes), so ``scale=1`` -- the paper's
sizes -- needs no more host memory than a scaled run.

Everything runs on the simulated clock, the write buffer's flusher included,
so two replays of the same requests give the same hits, skips and times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import chm
from chm.sim.replay.cxlhm import CXLHM_SYSTEMS, CxlhmReplay, CxlhmRequest, replay_cxlhm
from chm.sim.replay.decode import DecodeModel
from chm.sim.replay.params import param
from chm.sim.replay.prefill import PrefillModel
from chm.sim.workloads.records import Request

__all__ = ["GhostSetup", "WbufPoint", "open_ghost", "replay_virtual", "wbuf_sweep"]


@dataclass(frozen=True)
class GhostSetup:
    """A ghost CXL-HM device in virtual time (sizes before scaling)."""

    capacity_bytes: int = param(2 << 40, "bytes", "device capacity (the SSD)")
    dram_bytes: int = param(64 << 30, "bytes", "device DRAM")
    wbuf_bytes: int = param(1 << 30, "bytes", "write buffer share of DRAM (prefetch mode)")
    timing: str = param("fpga-cxlhm", "", "timing preset")
    scale: int = param(1, "", "divides capacity, DRAM, write buffer and block size")
    lru_line_bytes: int = param(64 << 10, "bytes", "lru mode cache line (not scaled)")

    def __post_init__(self) -> None:
        if self.scale < 1:
            raise ValueError(f"GhostSetup: scale must be >= 1, got {self.scale}")
        if self.wbuf_bytes >= self.dram_bytes:
            raise ValueError("GhostSetup: the write buffer must be smaller than the DRAM")
        if self.lru_line_bytes < 4096 or self.lru_line_bytes & (self.lru_line_bytes - 1):
            raise ValueError(
                f"GhostSetup: lru_line_bytes must be a power of two >= 4096, "
                f"got {self.lru_line_bytes}"
            )

    def sized(self, nbytes: int) -> int:
        """``nbytes / scale``, rounded down to 1 MiB (the device's granularity)."""
        mib = 1 << 20
        return max(mib, nbytes // self.scale // mib * mib)


def open_ghost(setup: GhostSetup, mode: str, block_bytes: int, **options: object) -> chm.Device:
    """A ghost device in virtual time for ``mode`` with ``block_bytes`` slots
    (``options``: further device options, e.g. ``lru_line``)."""
    kw: dict[str, object] = dict(
        backend="ghost",
        clock="virtual",
        capacity=setup.sized(setup.capacity_bytes),
        dram=setup.sized(setup.dram_bytes),
        mode=mode,
        timing=setup.timing,
        object_size=block_bytes,
    )
    if mode == "prefetch":
        kw.update(slot_size=block_bytes, wbuf=setup.sized(setup.wbuf_bytes))
    else:
        kw.update(lru_line=setup.lru_line_bytes)
    kw.update(options)
    return chm.Device.open(**kw)  # type: ignore[arg-type]


def replay_virtual(
    requests: Sequence[Request],
    system: str,
    prefill: PrefillModel,
    setup: GhostSetup,
    *,
    workers: int = 1,
    hbm_kv_bytes: int = 0,
    open_loop: bool = False,
    closed_loop: bool = False,
    pinned_prefix: int = 0,
    gpu_cache: bool = True,
    window_bytes: int = 0,
    decode: DecodeModel | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[CxlhmRequest]:
    """Replays ``requests`` through ``system`` (cxlhm-lru / cxlhm-prefetch) on ghost.

    ``hbm_kv_bytes`` is G1's size per worker (0: from the GPU preset);
    ``open_loop``, ``closed_loop`` (concurrent workers in simulated time),
    ``pinned_prefix`` and ``gpu_cache`` as in :class:`CxlhmReplay`;
    ``window_bytes`` the prefetch window in the model's bytes (0: the default);
    ``decode`` the decode instances (None: not modeled).
    """
    if not requests:
        raise ValueError("replay_virtual needs at least one request")
    if system not in CXLHM_SYSTEMS:
        raise ValueError(f"unknown CXL-HM system {system!r} (known: {', '.join(CXLHM_SYSTEMS)})")
    model_block = prefill.model.block_bytes(requests[0].block_tokens)
    if model_block % setup.scale or (model_block // setup.scale) % 4096:
        raise ValueError(
            f"scale {setup.scale}: a {model_block}-byte block does not divide into "
            "4 KiB-aligned device blocks"
        )
    block = model_block // setup.scale
    with open_ghost(setup, CXLHM_SYSTEMS[system], block) as dev:
        rp = CxlhmReplay(
            dev,
            system,
            prefill,
            workers=workers,
            hbm_kv_bytes=hbm_kv_bytes,
            device_block_bytes=block,
            open_loop=open_loop,
            closed_loop=closed_loop,
            pinned_prefix=pinned_prefix,
            gpu_cache=gpu_cache,
            decode=decode,
            **({"window_bytes": window_bytes} if window_bytes else {}),
        )
        return replay_cxlhm(requests, rp, progress=progress)


@dataclass(frozen=True)
class WbufPoint:
    """One write-buffer size of :func:`wbuf_sweep` (size before scaling)."""

    wbuf_bytes: int
    writes_offered: int
    writes_skipped: int
    load_bw_Bps: float
    hit_rate: float

    @property
    def skip_rate(self) -> float:
        return self.writes_skipped / self.writes_offered if self.writes_offered else 0.0


def wbuf_sweep(
    requests: Sequence[Request],
    prefill: PrefillModel,
    setup: GhostSetup,
    wbuf_sizes: Sequence[int],
    *,
    workers: int = 1,
    hbm_kv_bytes: int = 0,
    open_loop: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[WbufPoint]:
    """Prefetch-mode replays, one per write-buffer size: skips, load bandwidth, hits.

    The flusher runs on the simulated clock, so the skip counts are the same
    on every run and every host.
    """
    out = []
    for wb in wbuf_sizes:
        s = dataclasses.replace(setup, wbuf_bytes=wb)
        rs = replay_virtual(
            requests,
            "cxlhm-prefetch",
            prefill,
            s,
            workers=workers,
            hbm_kv_bytes=hbm_kv_bytes,
            open_loop=open_loop,
            progress=progress,
        )
        b = sum(r.device_load_bytes for r in rs)
        t = sum(r.device_load_s for r in rs)
        inp = sum(r.result.input_tokens for r in rs)
        out.append(
            WbufPoint(
                wbuf_bytes=wb,
                writes_offered=sum(r.writes_offered for r in rs),
                writes_skipped=sum(r.writes_skipped for r in rs),
                load_bw_Bps=b / t if t > 0 else 0.0,
                hit_rate=sum(r.result.cached_tokens for r in rs) / inp,
            )
        )
    return out
