"""AddressSpace: several devices (the paper's CXL-HM nodes) as one KV tier.

Each device has its own :class:`Store` (index, allocator, journal). Saves
are placed per request: the first save of a request picks a device
(``round-robin``, or ``least-outstanding`` bytes in flight) and the rest of
the request's blocks go to the same device, in order, until
:meth:`finish`. Loads find each key on whichever device holds it. A device
that fails (a write error, a read error, a closed device) is taken out: its
blocks become misses and nothing is placed on it any more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from chm.errors import ChmError, InvalidArgument
from chm.kv.buffers import as_src
from chm.kv.lookup import prefix_hits
from chm.kv.store import PutStatus, Store

__all__ = ["PLACEMENTS", "AddressSpace"]


def _nbytes(bufs: Sequence[Any]) -> int:
    return sum(int(as_src(b, f"buffer {j}").size) for j, b in enumerate(bufs))


PLACEMENTS = ("round-robin", "least-outstanding")


class AddressSpace:
    """Stores on several devices behind one contains/prefix/save/load API."""

    def __init__(self, stores: Sequence[Store], placement: str = "round-robin") -> None:
        if not stores:
            raise InvalidArgument(None, "AddressSpace: needs at least one store")
        if placement not in PLACEMENTS:
            raise InvalidArgument(
                None, f"placement={placement!r}: expected one of {', '.join(PLACEMENTS)}"
            )
        self.stores = list(stores)
        self.placement = placement
        self._live = [True] * len(self.stores)
        self.failures: dict[int, str] = {}
        self._outstanding = [0] * len(self.stores)
        self._placed: dict[object, int] = {}
        self._rr = 0
        self._lock = threading.Lock()

    # ---- devices

    @property
    def live(self) -> list[int]:
        with self._lock:
            return [i for i, ok in enumerate(self._live) if ok]

    def fail(self, device: int, reason: str) -> None:
        """Takes a device out: its blocks are misses from now on."""
        with self._lock:
            if self._live[device]:
                self._live[device] = False
                self.failures[device] = reason
            for req in [r for r, d in self._placed.items() if d == device]:
                del self._placed[req]

    def place(self, request: object) -> int:
        """The device of a request (chosen on first use, then sticky)."""
        with self._lock:
            d = self._placed.get(request)
            if d is not None:
                return d
            live = [i for i, ok in enumerate(self._live) if ok]
            if not live:
                raise ChmError(None, "AddressSpace: every device has failed", call="place")
            if self.placement == "round-robin":
                d = live[self._rr % len(live)]
                self._rr += 1
            else:
                d = min(live, key=lambda i: (self._outstanding[i], i))
            self._placed[request] = d
            return d

    def finish(self, request: object) -> None:
        """Forgets a request's placement (its next save may go elsewhere)."""
        with self._lock:
            self._placed.pop(request, None)

    def _busy(self, device: int, nbytes: int) -> None:
        with self._lock:
            self._outstanding[device] += nbytes

    # ---- queries

    def _where(self, keys: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(normalised keys, device per key; -1 where no live device has it)."""
        ks = self.stores[0]._keys(keys)
        where = np.full(ks.size, -1, dtype=np.int64)
        for i in self.live:
            todo = where < 0
            if not todo.any():
                break
            found = np.asarray(self.stores[i].contains(ks[todo]), dtype=bool)
            idx = np.flatnonzero(todo)[found]
            where[idx] = i
        return ks, where

    def contains(self, keys: Any) -> list[bool]:
        return [bool(w >= 0) for w in self._where(keys)[1]]

    def prefix_len(self, keys: Any) -> int:
        return prefix_hits(self._where(keys)[1] >= 0)

    # ---- data

    def save(self, request: object, keys: Any, srcs: Sequence[Any]) -> list[PutStatus]:
        """Puts the blocks on the request's device; a status per key."""
        d = self.place(request)
        st = self.stores[d]
        ks = st._keys(keys)
        nbytes = _nbytes(srcs)
        self._busy(d, nbytes)
        try:
            out = st.put(ks, srcs)
        except ChmError as exc:
            self.fail(d, f"put: {exc}")
            return [PutStatus.ERROR] * ks.size
        finally:
            self._busy(d, -nbytes)
        if PutStatus.ERROR in out:
            self.fail(d, "put: the device failed a write")
        return out

    def load(
        self, request: object, keys: Any, dsts: Sequence[Any], timeout: float | None = None
    ) -> int:
        """Loads the leading hits into dsts in order (across devices); returns how many."""
        ks, where = self._where(keys)
        n = prefix_hits(where >= 0)
        deadline = None if timeout is None else time.monotonic() + timeout
        done = 0
        while done < n:
            d = int(where[done])
            end = done
            while end < n and where[end] == d:
                end += 1
            st = self.stores[d]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            before = st.stats().io_errors
            nbytes = _nbytes(dsts[done:end])
            self._busy(d, nbytes)
            try:
                got = st.load_prefix(ks[done:end], dsts[done:end], left, request)
            except ChmError as exc:
                self.fail(d, f"load: {exc}")
                break
            finally:
                self._busy(d, -nbytes)
            if st.stats().io_errors > before:
                self.fail(d, "load: the device failed a read")
            done += got
            if done < end:
                break
        return done

    def flush(self, timeout: float | None = None) -> None:
        for i in self.live:
            try:
                self.stores[i].flush(timeout)
            except TimeoutError:
                raise
            except ChmError as exc:
                self.fail(i, f"flush: {exc}")

    def close(self) -> None:
        errs: list[BaseException] = []
        for st in self.stores:
            try:
                st.close()
            except ChmError as exc:
                errs.append(exc)
        if errs:
            raise errs[0]

    def __enter__(self) -> AddressSpace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
