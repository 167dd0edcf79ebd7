"""The allocator: the device address space as a log of fixed segments.

Blocks are appended to the open segment; when it is full the next free
segment opens; when none is free a sealed segment is reclaimed whole, its
blocks dropped (KV blocks are immutable, so nothing is copied). The victim is
the least recently used sealed segment (``lru``, by the last get or put of
any of its blocks) or the oldest sealed one (``fifo``). A segment holding a
pinned block is never a victim; when every candidate is pinned, allocation
fails and the put reports the block not stored, so a full device never
blocks a put. Not thread-safe: the store serialises calls.

The free segment to open (the lowest-numbered) and the victim (the lowest
key, then the lowest number, as an argmin over the segments would pick) come
from two lazy heaps, so an allocation or a reclaim costs O(log n), not a
scan of every segment: a device of 2 TB in 16 MiB segments (one block a
segment: exact block LRU) has 131,072 of them. A sealed segment's entry in
the victim heap holds its key when sealed, a lower bound of its key now
(keys only grow); a touch changes nothing there, and the victim search
re-files an entry it finds out of date, so the entry on top, once current,
is the minimum.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from chm.errors import InvalidArgument

__all__ = ["ALIGN", "EVICTIONS", "SegmentLog", "SegmentStats"]

ALIGN = 4096  # every block starts on a 4 KiB boundary (O_DIRECT, staging fills)
EVICTIONS = ("lru", "fifo")

FREE, OPEN, SEALED = 0, 1, 2


def _align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class SegmentStats:
    segments: int
    segment_bytes: int
    free: int
    open: int
    sealed: int
    pinned: int
    allocated_bytes: int  # bytes handed out in open and sealed segments
    live_bytes: int  # bytes of blocks still in the index
    reclaimed_segments: int


class SegmentLog:
    """Segments of ``segment_bytes`` over ``[0, capacity)``."""

    def __init__(self, capacity: int, segment_bytes: int, eviction: str = "lru") -> None:
        if eviction not in EVICTIONS:
            raise InvalidArgument(
                None, f"eviction={eviction!r}: expected one of {', '.join(EVICTIONS)}"
            )
        if segment_bytes <= 0 or segment_bytes % ALIGN:
            raise InvalidArgument(
                None, f"segment_bytes={segment_bytes}: must be a positive multiple of {ALIGN}"
            )
        n = capacity // segment_bytes
        if n < 2:
            raise InvalidArgument(
                None,
                f"segment_bytes={segment_bytes}: the device ({capacity} bytes) must hold at "
                "least 2 segments",
            )
        self.capacity = capacity
        self.segment_bytes = segment_bytes
        self.eviction = eviction
        self.n = n
        self.state = np.zeros(n, dtype=np.uint8)
        self.used = np.zeros(n, dtype=np.int64)  # bump offset within the segment
        self.live = np.zeros(n, dtype=np.int64)  # live block bytes
        self.pins = np.zeros(n, dtype=np.int64)
        self.last_use = np.zeros(n, dtype=np.int64)  # lru clock
        self.sealed_at = np.zeros(n, dtype=np.int64)  # fifo clock
        self._clock = 0
        self._open = -1
        self.reclaimed = 0
        # lazy heaps, checked against the arrays when popped: segment numbers
        # that may be free, and (key << 32 | segment) of sealed segments
        self._free_heap: list[int] = list(range(n))
        self._victims: list[int] = []

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # ---- allocation

    def alloc(self, length: int, footprint: int = 0) -> tuple[int, int] | None:
        """``(segment, addr)`` for a block, or None when a victim is needed
        (call :meth:`victim`, drop its blocks, :meth:`reuse` it, then retry)
        or when ``length`` does not fit a segment. ``footprint`` (default:
        ``length``) is the device bytes the block takes (with its header);
        ``length`` counts as live."""
        need = _align_up(max(length, footprint))
        if need > self.segment_bytes:
            return None
        s = self._open
        if s >= 0 and self.used[s] + need > self.segment_bytes:
            self._seal(s)
            s = -1
        if s < 0:
            s = self._pop_free()
            if s < 0:
                return None
            self._open_segment(s)
        addr = s * self.segment_bytes + int(self.used[s])
        self.used[s] += need
        self.live[s] += length
        self.last_use[s] = self._tick()
        return s, addr

    def unalloc(self, segment: int, addr: int, length: int, footprint: int = 0) -> None:
        """Takes back the last allocation (a write that was skipped)."""
        need = _align_up(max(length, footprint))
        if segment == self._open and segment * self.segment_bytes + self.used[segment] == (
            addr + need
        ):
            self.used[segment] -= need
        self.live[segment] -= length

    def _pop_free(self) -> int:
        """The lowest-numbered free segment, taken off the free heap (-1: none)."""
        h, st = self._free_heap, self.state
        while h:
            s = heapq.heappop(h)
            if st[s] == FREE:
                return s
        return -1

    def _key(self, s: int) -> int:
        return int(self.last_use[s] if self.eviction == "lru" else self.sealed_at[s])

    def _push_victim(self, s: int) -> None:
        h = self._victims
        heapq.heappush(h, (self._key(s) << 32) | s)
        if len(h) > 2 * self.n + 1024:  # mostly entries of earlier lives: rebuild
            self._rebuild_victims()

    def _rebuild_victims(self) -> None:
        sealed = np.flatnonzero(self.state == SEALED)
        key = self.last_use if self.eviction == "lru" else self.sealed_at
        self._victims = [
            (int(k) << 32) | s for k, s in zip(key[sealed].tolist(), sealed.tolist(), strict=True)
        ]
        heapq.heapify(self._victims)

    def _open_segment(self, s: int) -> None:
        self.state[s] = OPEN
        self.used[s] = 0
        self.live[s] = 0
        self._open = s

    def _seal(self, s: int) -> None:
        self.state[s] = SEALED
        self.sealed_at[s] = self._tick()
        if self._open == s:
            self._open = -1
        self._push_victim(s)

    def victim(self) -> int | None:
        """The segment to reclaim now (unpinned, sealed), or None."""
        h, st, pins = self._victims, self.state, self.pins
        mask = (1 << 32) - 1
        held: list[int] = []  # pinned candidates, put back afterwards
        found = None
        while h:
            v = h[0]
            s = v & mask
            if st[s] != SEALED:  # an entry of an earlier life
                heapq.heappop(h)
                continue
            k = self._key(s)
            if k != v >> 32:  # used since: file it under its key now
                heapq.heapreplace(h, (k << 32) | s)
                continue
            if pins[s]:
                held.append(heapq.heappop(h))
                continue
            found = s
            break
        for v in held:
            heapq.heappush(h, v)
        return found

    def reuse(self, s: int) -> None:
        """Marks a reclaimed victim free (its blocks must be dropped first)."""
        if self.pins[s]:
            raise AssertionError(f"segment {s} is pinned: it cannot be reclaimed")
        self.state[s] = FREE
        self.used[s] = 0
        self.live[s] = 0
        self.reclaimed += 1
        heapq.heappush(self._free_heap, s)

    # ---- accounting

    def touch(self, segments: Any) -> None:
        segs = np.asarray(segments, dtype=np.int64)
        if segs.size:
            self.last_use[segs] = self._tick()

    def touch_one(self, s: int) -> None:
        """A use of segment ``s`` now, after every earlier one (its own clock
        tick: touching blocks one by one orders them exactly)."""
        self._clock += 1
        self.last_use[s] = self._clock

    def pin(self, segments: Any, delta: int = 1) -> None:
        segs = np.asarray(segments, dtype=np.int64)
        if segs.size:
            np.add.at(self.pins, segs, delta)
            if (self.pins[segs] < 0).any():
                raise AssertionError("segment pin count below zero")

    def dropped(self, segments: Any, lengths: Any) -> None:
        """Blocks removed from the index: their bytes are no longer live."""
        segs = np.asarray(segments, dtype=np.int64)
        if segs.size:
            np.add.at(self.live, segs, -np.asarray(lengths, dtype=np.int64))

    def restore(self, segments: Any, ends: Any, lengths: Any, ages: Any) -> None:
        """After a restart: segments holding recovered blocks are sealed."""
        segs = np.asarray(segments, dtype=np.int64)
        if segs.size == 0:
            return
        offs = np.asarray(ends, dtype=np.int64) - segs * self.segment_bytes
        np.maximum.at(self.used, segs, offs)
        np.add.at(self.live, segs, np.asarray(lengths, dtype=np.int64))
        ages = np.asarray(ages, dtype=np.int64)
        np.maximum.at(self.last_use, segs, ages)
        np.maximum.at(self.sealed_at, segs, ages)
        self.state[np.unique(segs)] = SEALED
        self._clock = max(self._clock, int(ages.max()))
        self.used[:] = np.minimum(
            np.where(self.used > 0, -(-self.used // ALIGN) * ALIGN, 0), self.segment_bytes
        )
        self._rebuild_victims()

    def stats(self) -> SegmentStats:
        st = self.state
        return SegmentStats(
            segments=self.n,
            segment_bytes=self.segment_bytes,
            free=int(np.count_nonzero(st == FREE)),
            open=int(np.count_nonzero(st == OPEN)),
            sealed=int(np.count_nonzero(st == SEALED)),
            pinned=int(np.count_nonzero(self.pins > 0)),
            allocated_bytes=int(self.used.sum()),
            live_bytes=int(self.live.sum()),
            reclaimed_segments=self.reclaimed,
        )
