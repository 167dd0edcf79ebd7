"""An obviously-correct Python model of a chm device, for model-based tests.

Nothing here talks to the device. :class:`Geometry` describes a small test
device and knows how device addresses map onto backing targets;
:class:`StagingModel` is the staging window as the contract (include/chm.h)
states it: ``slots_total`` slots, a bounded FIFO refill queue, requests that
are QUEUED or own a slot, READY until waited on, then HELD until released.
The device's contents are a plain ``bytearray`` (see :func:`initial_image`).

The expectations that differ between device modes live in one
:class:`ModeModel` subclass per mode (:data:`MODE_MODELS`).

The model describes a *settled* device: every fill that was started has
completed. The state machine in :mod:`chm.testing.stateful` waits for that
after every step (``slots_filling == 0``), which makes every outcome
deterministic except where a rule races on purpose; those rules widen the
expected counters to a range (:class:`Counters`).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chm.errors import NotSupported

__all__ = [
    "FILL_ALIGN",
    "IO_ALIGN",
    "MODE_MODELS",
    "Counters",
    "DirectMode",
    "Geometry",
    "LruMode",
    "ModeModel",
    "ModelRequest",
    "PrefetchMode",
    "SessionModel",
    "StagingModel",
    "fill_range",
    "lines_touched",
    "widened",
    "initial_image",
    "NOT_IN_POOL",
    "read_backing",
    "write_backing",
]

IO_ALIGN = 512  # CHM_IO_ALIGN: writes are aligned to it
FILL_ALIGN = 4096  # CHM_FILL_ALIGN: staged fills are widened to it
NOT_IN_POOL = 2**64 - 1  # chm_view.pool_offset of a view outside the DRAM pool (lru mode)

KiB = 1024
MiB = 1024 * KiB


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def fill_range(addr: int, length: int, capacity: int) -> tuple[int, int]:
    """The device range a staged object's slot holds: ``[start, end)``.

    Fills are widened to whole 4 KiB sectors (the last one cut at the
    capacity), so a read anywhere inside this range is served from DRAM.
    """
    start = addr // FILL_ALIGN * FILL_ALIGN
    end = min(_align_up(addr + length, FILL_ALIGN), capacity)
    return start, end


def slot_stride(slot_size: int) -> int:
    """Bytes of the staging window one slot takes (include/chm.h, staging.c)."""
    return _align_up(slot_size, FILL_ALIGN) + FILL_ALIGN


@dataclass(frozen=True)
class Geometry:
    """A small device: big enough to stripe and overlap, small enough to be fast.

    ``hot`` is the leading part of the address space where most generated
    objects land, so that they overlap often; a few land at the very end of
    the capacity (fills cut by it) and anywhere in between.
    """

    capacity: int = 2 * MiB
    slot_size: int = 64 * KiB
    slots: int = 3
    refill_queue: int = 2
    wbuf: int = 48 * KiB
    lru_dram: int = 256 * KiB
    lru_line: int = 16 * KiB
    targets: int = 1
    stripe_unit: int = 64 * KiB
    hot: int = 256 * KiB
    max_write: int = 64 * KiB
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def stride(self) -> int:
        return slot_stride(self.slot_size)

    @property
    def dram(self) -> int:
        """DRAM of prefetch mode: exactly the slots plus the write buffer."""
        return self.slots * self.stride + self.wbuf

    @property
    def window_bytes(self) -> int:
        return self.slots * self.stride

    def device_options(self, mode: str) -> dict[str, Any]:
        """Keyword options for ``chm.Device.open`` in ``mode``."""
        opts: dict[str, Any] = {
            "capacity": self.capacity,
            "stripe_unit": self.stripe_unit,
            "slot_size": self.slot_size,
            "slots": self.slots,
            "refill_queue": self.refill_queue,
        }
        if mode == "prefetch":
            opts.update(dram=self.dram, wbuf=self.wbuf)
        elif mode == "lru":
            opts.update(dram=self.lru_dram, lru_line=self.lru_line)
        opts.update(dict(self.options))
        return opts

    # ---- striping: device address -> (target, offset)

    def locate(self, addr: int) -> tuple[int, int]:
        """The target index and byte offset holding device address ``addr``."""
        if self.targets == 1:
            return 0, addr
        stripe, within = divmod(addr, self.stripe_unit)
        return stripe % self.targets, (stripe // self.targets) * self.stripe_unit + within

    def stripes(self) -> Iterator[tuple[int, int, int]]:
        """``(device_addr, target, target_offset)`` of every stripe unit."""
        unit = self.capacity if self.targets == 1 else self.stripe_unit
        for addr in range(0, self.capacity, unit):
            t, off = self.locate(addr)
            yield addr, t, off


def initial_image(capacity: int, seed: int) -> bytearray:
    """Contents for a fresh device: every 8-byte word is distinct.

    Word ``i`` is ``i * K ^ f(seed)`` with an odd ``K`` (a bijection), so data
    read from the wrong place, or staged at the wrong offset, never matches.
    """
    words = np.arange(capacity // 8, dtype=np.uint64)
    words *= np.uint64(0x9E3779B97F4A7C15)
    words ^= np.uint64((seed * 0xD1B54A32D192ED03 + 0x632BE59BD9B4E019) % 2**64)
    return bytearray(words.tobytes())


def write_backing(geom: Geometry, paths: list[str], image: bytes | bytearray) -> None:
    """Lays ``image`` (the whole address space) out on the target files."""
    mv = memoryview(image)
    fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644) for p in paths]
    try:
        unit = geom.capacity if geom.targets == 1 else geom.stripe_unit
        for addr, t, off in geom.stripes():
            os.pwrite(fds[t], mv[addr : addr + unit], off)
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)


def read_backing(geom: Geometry, paths: list[str]) -> bytearray:
    """Reassembles the address space from the target files (separate fds)."""
    out = bytearray(geom.capacity)
    unit = geom.capacity if geom.targets == 1 else geom.stripe_unit
    fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in paths]
    try:
        for addr, t, off in geom.stripes():
            chunk = os.pread(fds[t], unit, off)
            out[addr : addr + len(chunk)] = chunk
    finally:
        for fd in fds:
            os.close(fd)
    return out


# ---------------------------------------------------------------- staging


@dataclass(eq=False)
class ModelRequest:
    """One issued prefetch as the model sees it."""

    addr: int
    length: int
    fill: tuple[int, int]
    handle: Any = None  # chm.Handle
    state: str = "queued"  # queued | ready | held | released
    snapshot: bytearray | None = None  # expected view bytes once held
    view: memoryview | None = None
    pool_offset: int = -1
    lru_image: bytes | None = None  # lru mode: the bytes the hint fill copied
    # prefetch mode, HELD: a write was admitted over the fill range since wait,
    # so reads go around the slot (W11); None when a race leaves it unknown
    stale: bool | None = False
    session: SessionModel | None = None  # None: the device's own session

    @property
    def end(self) -> int:
        return self.addr + self.length

    @property
    def staged(self) -> bool:
        """Owns a slot whose fill completed (READY or HELD)."""
        return self.state in ("ready", "held")

    def __repr__(self) -> str:
        tok = getattr(self.handle, "token", 0)
        return f"<req {tok:#x} [{self.addr:#x}+{self.length}) {self.state}>"


@dataclass(eq=False)
class SessionModel:
    """One open session besides the device's own: its quota and the requests
    it holds (it shares the staging window and the queue with the rest)."""

    session: Any  # chm.Session (or a front end's equivalent)
    quota: int
    reqs: list[ModelRequest] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<session {getattr(self.session, 'token', 0):#x} quota={self.quota} {self.reqs}>"


@dataclass
class StagingModel:
    """Slots and the FIFO refill queue, exactly as the contract states them."""

    slots_total: int
    queue_cap: int
    slotted: list[ModelRequest] = field(default_factory=list)
    queue: deque[ModelRequest] = field(default_factory=deque)

    @property
    def free(self) -> int:
        return self.slots_total - len(self.slotted)

    @property
    def held(self) -> list[ModelRequest]:
        return [r for r in self.slotted if r.state == "held"]

    @property
    def ready(self) -> list[ModelRequest]:
        return [r for r in self.slotted if r.state == "ready"]

    def predict_issue(self, noqueue: bool = False) -> str:
        """``slot``, ``queue`` or ``reject`` (EAGAIN) for a new prefetch."""
        if self.free > 0:
            return "slot"
        if noqueue or len(self.queue) >= self.queue_cap:
            return "reject"
        return "queue"

    def issue(self, req: ModelRequest, outcome: str) -> None:
        if outcome == "slot":
            req.state = "ready"
            self.slotted.append(req)
        elif outcome == "queue":
            req.state = "queued"
            self.queue.append(req)

    def release(self, req: ModelRequest) -> list[ModelRequest]:
        """Drops req; returns the queued requests that got a slot (FIFO)."""
        if req.state == "queued":
            self.queue.remove(req)
        else:
            self.slotted.remove(req)
        req.state = "released"
        promoted: list[ModelRequest] = []
        while self.free > 0 and self.queue:
            nxt = self.queue.popleft()
            nxt.state = "ready"
            self.slotted.append(nxt)
            promoted.append(nxt)
        return promoted

    def covering(self, addr: int, length: int) -> ModelRequest | None:
        """A staged request whose (widened) fill covers the whole range and
        that reads may use (not stale, W11)."""
        for r in self.slotted:
            if r.staged and r.stale is False and r.fill[0] <= addr and addr + length <= r.fill[1]:
                return r
        return None

    def read_outcome(self, addr: int, length: int) -> str:
        """``hit``, ``miss`` or ``either`` (a covering slot whose staleness a
        race left unknown) for a chm_read of the range in prefetch mode."""
        if self.covering(addr, length) is not None:
            return "hit"
        for r in self.slotted:
            if r.staged and r.stale is None and r.fill[0] <= addr and addr + length <= r.fill[1]:
                return "either"
        return "miss"

    def mark_stale(self, addr: int, length: int, *, maybe: bool = False) -> None:
        """A write admitted over [addr, addr+length): held slots whose fill
        range overlaps it become stale (W11); ``maybe`` when it is unknown
        whether the write landed before or after their wait."""
        for r in self.held:
            if r.fill[0] < addr + length and addr < r.fill[1] and r.stale is False:
                r.stale = None if maybe else True


# ---------------------------------------------------------------- counters


class Counters:
    """Expected device counters: exact values, or ``[lo, hi]`` where a rule
    raced on purpose and either outcome is legal."""

    def __init__(self) -> None:
        self._lo: dict[str, int] = {}
        self._hi: dict[str, int] = {}

    def add(self, name: str, n: int = 1, *, maybe: int = 0) -> None:
        """Adds ``n`` for sure and up to ``maybe`` more."""
        self._lo[name] = self._lo.get(name, 0) + n
        self._hi[name] = self._hi.get(name, 0) + n + maybe

    def exact(self, name: str) -> int:
        lo, hi = self._lo.get(name, 0), self._hi.get(name, 0)
        if lo != hi:
            raise AssertionError(f"model counter {name} is a range [{lo}, {hi}]")
        return lo

    def range(self, name: str) -> tuple[int, int]:
        return self._lo.get(name, 0), self._hi.get(name, 0)

    def check(self, name: str, actual: int) -> None:
        lo, hi = self.range(name)
        if not lo <= actual <= hi:
            want = str(lo) if lo == hi else f"[{lo}, {hi}]"
            raise AssertionError(f"stats.{name} = {actual}, model expects {want}")

    def names(self) -> list[str]:
        return sorted(self._lo)


# ---------------------------------------------------------------- modes


def lines_touched(addr: int, length: int, line: int) -> int:
    """LRU lines a range touches."""
    return (addr + length - 1) // line - addr // line + 1


def widened(addr: int, length: int, capacity: int) -> int:
    """Bytes a miss reads from the SSD: the range widened to 4 KiB sectors."""
    a, b = fill_range(addr, length, capacity)
    return b - a


class ModeModel:
    """What one device mode promises, as a model-based test checks it.

    One subclass per mode (:class:`PrefetchMode`, :class:`LruMode`,
    :class:`DirectMode`) holds every expectation that differs between modes,
    so the state machine applies each step to the device and to ``self``
    without asking which mode it runs. The capability flags say which rules
    apply at all: ``stages`` (prefetch calls take slots: prefetch and lru
    modes), ``write_buffer`` (writes may be skipped and reads race fills:
    prefetch mode), ``view_from_wait`` (a view holds every write admitted
    before its wait and a later write makes reads go around it, W11:
    prefetch mode; an lru view is the host copy its fill made).
    ``prefetch_error`` is the exception a prefetch raises when the mode
    cannot stage (direct mode).
    """

    name = ""
    stages = True
    write_buffer = False
    view_from_wait = False  # a view holds the writes admitted up to its wait
    prefetch_error: type[Exception] | None = None

    def __init__(self, geom: Geometry, counters: Counters) -> None:
        self.g = geom
        self.c = counters
        slots, queue = (geom.slots, geom.refill_queue) if self.stages else (0, 0)
        self.staging = StagingModel(slots, queue)
        self.wbuf_bytes = 0

    def device_options(self) -> dict[str, Any]:
        return self.g.device_options(self.name)

    def check_open(self, st: Any) -> None:
        """The counters of a freshly opened device."""
        assert st.slots_total == self.staging.slots_total, st.slots_total
        assert st.queue_cap == self.staging.queue_cap, st.queue_cap
        self.wbuf_bytes = st.wbuf_bytes

    def fill_started(self, req: ModelRequest, image: bytearray) -> None:
        """Mode-specific counters of a fill that starts for req."""

    def expect_read(self, addr: int, length: int) -> str:
        """Counters of one chm_read; returns what it is (for ``event``)."""
        self.c.add("read_misses")
        self.c.add("bytes_read_ssd", widened(addr, length, self.g.capacity))
        return "miss"

    def write_refused(self, length: int) -> bool:
        """Whether a write of length bytes is refused outright (InvalidArgument):
        never in this mode."""
        return False

    def count_write(self, addr: int, length: int, admitted: bool) -> None:
        """Counters of one write (W2: only prefetch mode may skip)."""
        assert admitted, f"{self.name} mode skipped a write (only prefetch mode may)"

    def wrote(self, addr: int, length: int, *, maybe: bool = False) -> None:
        """An admitted write over [addr, addr+length) (W11 in prefetch mode)."""

    def expected_view(self, req: ModelRequest, image: bytearray) -> bytes:
        """The bytes req's view must show when first waited on."""
        return bytes(image[req.addr : req.end])

    def check_flushed(self, st: Any) -> None:
        """W3: what a returned flush leaves behind."""

    def bad_call(self, kind: str) -> tuple[str, tuple[Any, ...]]:
        """``(Device method, args)`` of a call that must raise InvalidArgument."""
        g = self.g
        calls: dict[str, tuple[str, tuple[Any, ...]]] = {
            "len0": ("prefetch", (0, 0)),
            "too_long": ("prefetch", (0, g.slot_size + 1)),
            "beyond": ("prefetch", (g.capacity - 100, 101)),
            "unaligned_write": ("write", (IO_ALIGN // 2, b"\0" * IO_ALIGN)),
            "unaligned_len": ("write", (0, b"\0" * (IO_ALIGN + 1))),
            "read_beyond": ("read", (g.capacity - 10, 11)),
            "read_len0": ("read", (0, 0)),
        }
        return calls[kind]

    def check_counters(self, s: Any) -> None:
        """The counters that only some modes keep exact."""
        self.c.check("bytes_read_ssd", s.bytes_read_ssd)

    def check_state(self, s: Any) -> None:
        """Mode invariants over one stats snapshot (W6 / L1, L6)."""

    def view_in_pool(self, req: ModelRequest) -> bool:
        """S1: whether req's held view is DRAM-pool memory (lru: a host copy)."""
        return True


class PrefetchMode(ModeModel):
    """HyMCache: the staging window plus an isolated write buffer."""

    name = "prefetch"
    write_buffer = True
    view_from_wait = True

    def check_open(self, st: Any) -> None:
        super().check_open(st)
        assert st.window_bytes == self.g.window_bytes, (st.window_bytes, self.g.window_bytes)
        assert st.wbuf_bytes == self.g.wbuf, (st.wbuf_bytes, self.g.wbuf)

    def fill_started(self, req: ModelRequest, image: bytearray) -> None:
        self.c.add("bytes_read_ssd", req.fill[1] - req.fill[0])

    def expect_read(self, addr: int, length: int) -> str:
        outcome = self.staging.read_outcome(addr, length)
        if outcome == "hit":
            self.c.add("read_hits")
            self.c.add("bytes_from_dram", length)
        elif outcome == "either":  # a covering slot whose staleness a race left unknown
            self.c.add("read_hits+read_misses")
            self.c.add("bytes_from_dram", 0, maybe=length)
            self.c.add("bytes_read_ssd", 0, maybe=widened(addr, length, self.g.capacity))
        else:
            super().expect_read(addr, length)
        return outcome

    def write_refused(self, length: int) -> bool:
        """Larger than the whole write buffer: never admissible, a
        configuration error (InvalidArgument), not a skip (W2)."""
        return length > self.wbuf_bytes

    def count_write(self, addr: int, length: int, admitted: bool) -> None:
        if length > self.wbuf_bytes:
            assert not admitted, (
                f"W2: a write of {length} bytes was admitted into a {self.wbuf_bytes}-byte "
                "write buffer"
            )
        self.c.add("wr_admitted" if admitted else "wr_skipped")
        self.c.add("wr_admitted_bytes" if admitted else "wr_skipped_bytes", length)

    def wrote(self, addr: int, length: int, *, maybe: bool = False) -> None:
        # READY copies are patched (W10); held views are snapshots that reads
        # now go around (W11)
        self.staging.mark_stale(addr, length, maybe=maybe)

    def check_flushed(self, st: Any) -> None:
        assert st.wr_flushed_bytes == st.wr_admitted_bytes, (
            f"W3: flush returned with {st.wr_admitted_bytes - st.wr_flushed_bytes} admitted "
            "bytes not flushed"
        )

    def check_state(self, s: Any) -> None:
        assert s.wbuf_bytes == self.wbuf_bytes
        assert 0 <= s.wbuf_used_bytes <= s.wbuf_bytes, (s.wbuf_used_bytes, s.wbuf_bytes)
        assert s.wr_flushed_bytes <= s.bytes_written_ssd <= s.wr_admitted_bytes, (
            s.wr_flushed_bytes,
            s.bytes_written_ssd,
            s.wr_admitted_bytes,
        )


class LruMode(ModeModel):
    """The transparent LRU cache baseline: prefetches are hints filled through it."""

    name = "lru"

    def check_open(self, st: Any) -> None:
        super().check_open(st)
        total = self.g.lru_dram // self.g.lru_line
        assert st.lru_lines_total == total, st.lru_lines_total
        self.lru_total = total

    def fill_started(self, req: ModelRequest, image: bytearray) -> None:
        # the hint is filled by one read through the cache
        self._lookup(req.addr, req.length)
        req.lru_image = bytes(image[req.addr : req.end])

    def _lookup(self, addr: int, length: int) -> None:
        self.c.add("read_hits+read_misses")
        self.c.add("bytes_from_dram", length)
        self.c.add("lru_lookups", lines_touched(addr, length, self.g.lru_line))

    def expect_read(self, addr: int, length: int) -> str:
        self._lookup(addr, length)
        return "lru lookup"

    def count_write(self, addr: int, length: int, admitted: bool) -> None:
        super().count_write(addr, length, admitted)
        self.c.add("lru_lookups", lines_touched(addr, length, self.g.lru_line))

    def expected_view(self, req: ModelRequest, image: bytearray) -> bytes:
        assert req.lru_image is not None
        return req.lru_image

    def check_flushed(self, st: Any) -> None:
        assert st.lru_lines_dirty == 0, f"W3: {st.lru_lines_dirty} dirty lines after flush"

    def check_counters(self, s: Any) -> None:
        self.c.check("lru_lookups", s.lru_hits + s.lru_misses)

    def check_state(self, s: Any) -> None:
        """L1: capacity is never exceeded; L6: line accounting sums."""
        assert s.lru_lines_total == self.lru_total, "L1: the cache changed size"
        assert s.lru_lines_dirty <= s.lru_lines_valid <= s.lru_lines_total, (
            s.lru_lines_dirty,
            s.lru_lines_valid,
            s.lru_lines_total,
        )
        assert s.lru_refills <= s.lru_misses

    def view_in_pool(self, req: ModelRequest) -> bool:
        assert req.pool_offset == NOT_IN_POOL, (
            f"S1: lru view of {req} claims pool offset {req.pool_offset:#x}"
        )
        return False


class DirectMode(ModeModel):
    """No DRAM: every access goes to the SSD; prefetch is not supported."""

    name = "direct"
    stages = False

    prefetch_error = NotSupported

    def count_write(self, addr: int, length: int, admitted: bool) -> None:
        super().count_write(addr, length, admitted)
        self.c.add("bytes_written_ssd", length)

    def bad_call(self, kind: str) -> tuple[str, tuple[Any, ...]]:
        # prefetch is refused before its arguments here: probe them on the data path
        direct = {
            "len0": ("read", (0, 0)),
            "too_long": ("write", (0, b"\0" * 100)),
            "beyond": ("write", (self.g.capacity, b"\0" * IO_ALIGN)),
        }
        return direct.get(kind) or super().bad_call(kind)

    def check_counters(self, s: Any) -> None:
        super().check_counters(s)
        self.c.check("bytes_written_ssd", s.bytes_written_ssd)


MODE_MODELS: dict[str, type[ModeModel]] = {m.name: m for m in (PrefetchMode, LruMode, DirectMode)}
