"""Prefetch windows (the paper's KVManager, eq. 2).

``w_max(S_block, N_hits) = min(128 MB / S_block, N_hits)`` prefetches per
request (8 for 16 MB blocks, 4 for 32 MB); :func:`fair_shares` divides the
device's staging window among concurrent requests when their windows do not
all fit; :class:`SlidingWindow` keeps a request's window full in block order,
issuing the next prefetch as each consumed block is released.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from chm.errors import InvalidArgument, WouldBlock
from chm.kv.protocol import DeviceLike, HandleLike

__all__ = [
    "WINDOW_BYTES",
    "KVManager",
    "SlidingWindow",
    "fair_shares",
    "w_max",
]

# The paper's 128 MB per request, in binary units so that its stated results
# hold exactly: 8 windows of 16 MiB blocks, 4 of 32 MiB.
WINDOW_BYTES = 128 << 20


def w_max(block_bytes: int, n_hits: int, window_bytes: int = WINDOW_BYTES) -> int:
    """Eq. 2: ``min(window_bytes // block_bytes, n_hits)``, at least 1 (0 with no hits)."""
    for name, v in (("block_bytes", block_bytes), ("n_hits", n_hits)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidArgument(None, f"w_max: {name}={v!r} is not an int")
    if block_bytes <= 0:
        raise InvalidArgument(None, f"w_max: block_bytes={block_bytes} must be > 0")
    if n_hits < 0:
        raise InvalidArgument(None, f"w_max: n_hits={n_hits} must be >= 0")
    if n_hits == 0:
        return 0
    return max(1, min(window_bytes // block_bytes, n_hits))


def fair_shares(demands: Sequence[int], capacity: int) -> list[int]:
    """Max-min fair split of ``capacity`` slots among requests' demands.

    Every request with a demand gets at least one slot (a window of 0 would
    stall it), so the total can exceed a capacity smaller than the number of
    requests; the device then queues the excess. Otherwise requests that ask
    less than an equal share get what they ask and the rest is split evenly,
    the remainder going to the earliest requests.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise InvalidArgument(None, f"fair_shares: capacity={capacity!r} must be an int >= 0")
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in demands):
        raise InvalidArgument(None, f"fair_shares: demands {list(demands)} must be ints >= 0")
    out = [0] * len(demands)
    active = [i for i, d in enumerate(demands) if d > 0]
    left = capacity
    while active and left > 0:
        share = left // len(active)
        if share == 0:  # fewer slots left than requests: one each, earliest first
            for i in active[:left]:
                out[i] += 1
            break
        for i in active:
            give = min(share, demands[i] - out[i])
            out[i] += give
            left -= give
        active = [i for i in active if out[i] < demands[i]]
    return [max(o, 1) if d > 0 else 0 for o, d in zip(out, demands, strict=True)]


class KVManager:
    """Shares a device's staging window among concurrent requests.

    ``admit(request, demand)`` registers a request that wants ``demand``
    prefetches in flight (its ``w_max``); ``window(request)`` is its share
    now (it changes as others come and go); ``leave(request)`` ends it.
    Thread-safe.
    """

    def __init__(self, slots: int) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise InvalidArgument(None, f"KVManager: slots={slots!r} must be an int >= 1")
        self.slots = slots
        self._demand: dict[object, int] = {}
        self._share: dict[object, int] = {}
        self._lock = threading.Lock()

    def _recompute(self) -> None:
        reqs = list(self._demand)
        shares = fair_shares([self._demand[r] for r in reqs], self.slots)
        self._share = dict(zip(reqs, shares, strict=True))

    def admit(self, request: object, demand: int) -> int:
        with self._lock:
            self._demand[request] = max(0, int(demand))
            self._recompute()
            return self._share[request]

    def window(self, request: object) -> int:
        with self._lock:
            return self._share.get(request, 0)

    def leave(self, request: object) -> None:
        with self._lock:
            if self._demand.pop(request, None) is not None:
                self._recompute()

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._demand)


class SlidingWindow:
    """Prefetches of ``ranges`` (``(addr, length)``) in order, ``size`` in flight.

    ``pop()`` gives the oldest issued ``(index, handle)``; ``release(handle)``
    releases it and issues the next. Iterating yields the same pairs and
    releases each one when the loop moves on (drop views of it first).
    ``size`` is an int or a callable (a share that may change, e.g.
    ``lambda: manager.window(req)``). ``retain`` (one flag per range) asks
    the device to keep those objects resident after release
    (:mod:`chm.kv.residency`). ``close()`` releases whatever is still
    issued; the window is a context manager.
    """

    def __init__(
        self,
        dev: DeviceLike,
        ranges: Sequence[tuple[int, int]],
        size: int | Callable[[], int],
        retain: Sequence[bool] | None = None,
    ) -> None:
        self._dev = dev
        self._ranges = ranges
        self._retain = retain
        self._size = size
        self._q: collections.deque[tuple[int, HandleLike]] = collections.deque()
        self._popped: dict[int, HandleLike] = {}  # id(handle) -> popped, not yet released
        self._next = 0
        self.issued = 0
        self.blocked = 0
        self.fill()

    def _limit(self) -> int:
        s = self._size() if callable(self._size) else self._size
        return max(1, int(s))

    def fill(self) -> None:
        """Issues prefetches until the window is full or every range is issued.

        A device whose refill queue is full (WouldBlock) stops the filling
        for now, never the caller: ``blocked`` counts such stops, and the
        next release tries again. Iteration ends early when nothing could be
        issued at all.
        """
        limit = self._limit()
        ranges = self._ranges
        while self._next < len(ranges) and len(self._q) + len(self._popped) < limit:
            addr, length = ranges[self._next]
            try:
                if self._retain is not None and self._retain[self._next]:
                    h = self._dev.prefetch(addr, length, retain=True)
                else:
                    h = self._dev.prefetch(addr, length)
            except WouldBlock:
                self.blocked += 1
                return
            self._q.append((self._next, h))
            self._next += 1
            self.issued += 1

    @property
    def done(self) -> bool:
        """True once every range was issued."""
        return self._next >= len(self._ranges)

    @property
    def in_flight(self) -> int:
        return len(self._q) + len(self._popped)

    def pop(self) -> tuple[int, Any]:
        """The oldest issued prefetch; IndexError when every one was popped."""
        if not self._q:
            raise IndexError("SlidingWindow.pop(): nothing left")
        item = self._q.popleft()
        self._popped[id(item[1])] = item[1]
        return item

    def release(self, handle: HandleLike) -> None:
        """Releases a popped handle and refills the window."""
        self._popped.pop(id(handle), None)
        handle.release()
        self.fill()

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        while self._q:
            i, h = self.pop()
            try:
                yield i, h
            finally:
                self.release(h)

    def close(self) -> None:
        """Releases every issued prefetch, popped ones too; issues no more."""
        self._next = len(self._ranges)
        while self._popped:
            self._popped.popitem()[1].release()
        while self._q:
            _, h = self._q.popleft()
            h.release()

    def __enter__(self) -> SlidingWindow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
