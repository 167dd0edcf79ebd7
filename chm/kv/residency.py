"""Which KV blocks stay resident in device DRAM: the admission policy.

The device (prefetch mode with ``resident=<bytes>``) keeps an object after
release when its prefetch carried ``retain=True`` and serves a later prefetch
of it from DRAM; it replaces the least recently hit entry without views when
its region is full. Which prefetches carry the flag is decided here, once per
load, from the ordered block addresses of the request
(:meth:`Admission.decide`).

Three admissions are offered, all with a bounded memory of what was seen:

- :class:`SecondHit` (``"frequency"``): retain a block on its second read
  within the last ``history`` distinct blocks seen (Dynamo's
  frequency >= 2 disk filter, with a horizon). A block read once (a
  one-hit wonder) never enters the region.
- :class:`SharedPrefix` (``"shared-prefix"``): retain the leading blocks of a
  load only when an earlier load began with the same block (a system prompt
  or a few-shot prefix that opens many requests).
- :class:`GhostFifo` (``"s3fifo"``): S3-FIFO's admission without its main
  queue (the device's LRU is the main queue): a first read puts the block in
  a ghost FIFO of ``ghost`` entries (by default as many as the region has);
  a read while it is still there retains it.

The choice, measured (``tools/bench/resident_bench.py`` prints the table:
virtual time, fpga-cxlhm timing, 16 MiB blocks, 8 users x 6 turns each
adding a block and re-reading its history after one shared system-prompt
block, 2 one-hit blocks after every request; 312 block loads in all). With
32 resident entries ``frequency`` and ``s3fifo`` both got 100 resident hits
(67 retains, 35 evictions), ``shared-prefix`` 46 (the system prompt alone)
and no residency 0; with 64 entries ``frequency`` and ``s3fifo`` got 126.
With 8 entries all three got only the system prompt's 46, ``frequency``
churning (121 retains, 113 evictions: harmless, a retain is a buffer
exchange). ``frequency`` is :data:`DEFAULT`: never fewer hits than the
others in these runs, and its horizon does not shrink with the region, so
reuse a few turns apart is still seen. None of the three let a one-hit
block into the region (tests/unit/test_residency.py shows the hot prefix
staying resident beside a stream 32x the DRAM, the stream's virtual time
unchanged).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Protocol

from chm.errors import InvalidArgument
from chm.kv.protocol import DeviceLike
from chm.kv.window import SlidingWindow

__all__ = [
    "DEFAULT",
    "POLICIES",
    "Admission",
    "GhostFifo",
    "SecondHit",
    "SharedPrefix",
    "load_blocks",
    "make_admission",
]


class Admission(Protocol):
    """Decides, per load, which of its blocks the device should retain."""

    name: str

    def decide(self, addrs: Sequence[int]) -> list[bool]:
        """One flag per block of a load (its addresses in load order);
        called once per load, before its prefetches are issued."""
        ...

    def forget(self, addr: int) -> None:
        """The block at ``addr`` is gone (removed or overwritten)."""
        ...


def _check_count(name: str, v: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidArgument(None, f"{name}={v!r}: must be an int >= 1")
    return v


class SecondHit:
    """Retain a block on its ``hits``-th read among the last ``history``
    distinct blocks seen (LRU horizon)."""

    name = "frequency"

    def __init__(self, history: int = 1 << 16, hits: int = 2) -> None:
        self.history = _check_count("history", history)
        self.hits = _check_count("hits", hits)
        self._seen: collections.OrderedDict[int, int] = collections.OrderedDict()

    def decide(self, addrs: Sequence[int]) -> list[bool]:
        out = []
        seen = self._seen
        for a in addrs:
            n = seen.pop(a, 0) + 1
            seen[a] = n
            out.append(n >= self.hits)
        while len(seen) > self.history:
            seen.popitem(last=False)
        return out

    def forget(self, addr: int) -> None:
        self._seen.pop(addr, None)


class SharedPrefix:
    """Retain the leading ``depth`` blocks of a load whose first block
    opened an earlier load too."""

    name = "shared-prefix"

    def __init__(self, history: int = 1 << 12, depth: int = 1) -> None:
        self.history = _check_count("history", history)
        self.depth = _check_count("depth", depth)
        self._openers: collections.OrderedDict[int, None] = collections.OrderedDict()

    def decide(self, addrs: Sequence[int]) -> list[bool]:
        if not addrs:
            return []
        first = addrs[0]
        shared = first in self._openers
        self._openers.pop(first, None)
        self._openers[first] = None
        while len(self._openers) > self.history:
            self._openers.popitem(last=False)
        k = self.depth if shared else 0
        return [i < k for i in range(len(addrs))]

    def forget(self, addr: int) -> None:
        self._openers.pop(addr, None)


class GhostFifo:
    """Retain a block read again while it is in a FIFO of the ``ghost`` last
    blocks read once (S3-FIFO's ghost queue as the admission filter)."""

    name = "s3fifo"

    def __init__(self, ghost: int = 64) -> None:
        self.ghost = _check_count("ghost", ghost)
        self._fifo: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._hot: set[int] = set()

    def decide(self, addrs: Sequence[int]) -> list[bool]:
        out = []
        for a in addrs:
            if a in self._hot:
                out.append(True)
            elif a in self._fifo:
                del self._fifo[a]
                self._hot.add(a)
                out.append(True)
            else:
                self._fifo[a] = None
                if len(self._fifo) > self.ghost:
                    self._fifo.popitem(last=False)
                out.append(False)
        # the hot set is bounded by what the device can hold anyway
        if len(self._hot) > 4 * self.ghost:
            self._hot.clear()
        return out

    def forget(self, addr: int) -> None:
        self._fifo.pop(addr, None)
        self._hot.discard(addr)


POLICIES = ("frequency", "shared-prefix", "s3fifo")
DEFAULT = "frequency"


def make_admission(name: str, entries: int) -> Admission:
    """The admission ``name`` (one of :data:`POLICIES`) for a region of
    ``entries`` entries. Raises InvalidArgument for another name."""
    entries = max(1, int(entries))
    if name == "frequency":
        return SecondHit(history=max(1 << 12, 64 * entries))
    if name == "shared-prefix":
        return SharedPrefix()
    if name == "s3fifo":
        return GhostFifo(ghost=entries)
    raise InvalidArgument(None, f"residency: {name!r} is not one of {', '.join(POLICIES)}")


def load_blocks(
    dev: DeviceLike,
    ranges: Sequence[tuple[int, int]],
    admission: Admission | None,
    window: int,
) -> int:
    """Stages ``ranges`` in order through a sliding window of ``window``
    prefetches, retaining what ``admission`` picks, waiting on each and
    releasing it (the data is not copied out); returns how many were staged.
    The load loop of :class:`chm.kv.Lookup` without the index, for devices
    that move no data (virtual time)."""
    retain = admission.decide([a for a, _ in ranges]) if admission is not None else None
    n = 0
    with SlidingWindow(dev, ranges, window, retain) as win:
        for _, h in win:
            h.wait()
            n += 1
    return n
