"""Prefix lookup and the load pipeline.

A lookup asks the index about at most ``LOOKUP_BATCH`` (32) keys at once
with prefix semantics: the match stops at the first key that is absent.
As soon as the hits are known their prefetches are issued (the paper's early
hit), through a sliding window whose size is the request's fair share of
``w_max``; :meth:`Lookup.load` then copies the staged blocks, in order, into
the caller's buffers, verifying each block's checksum first.

On a device in lru mode (the transparent-cache baseline) prefetches are
only hints that pin nothing, so a lookup issues none: :meth:`Lookup.load`
reads each hit straight into its buffer through the device's cache, in
order, and verifies it there. On the ghost backend (virtual time, no data)
the prefetch pipeline and the direct reads run as usual but nothing is
copied or verified.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from typing import Any, Protocol

import numpy as np
import xxhash

from chm.errors import ChmError, DeviceIOError, InvalidArgument, WaitTimeout
from chm.kv.buffers import as_dst
from chm.kv.protocol import DeviceLike
from chm.kv.window import KVManager, SlidingWindow, w_max

__all__ = ["LOOKUP_BATCH", "BlockSource", "Lookup", "prefix_hits"]

LOOKUP_BATCH = 32
_hash = xxhash.xxh3_64_intdigest
_requests = itertools.count(1)
# Blocks this large are hashed on a helper thread while the loading thread
# copies them (both release the GIL), so verifying costs no extra time.
_OVERLAP_BYTES = 1 << 20
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hasher() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="chm-kv-hash")
    return _pool


def prefix_hits(found: np.ndarray[Any, Any]) -> int:
    """How many leading entries of a found-mask are True (the prefix length)."""
    miss = np.flatnonzero(~found)
    return int(miss[0]) if miss.size else int(found.size)


class BlockSource(Protocol):
    """What a :class:`Lookup` needs of the store whose blocks it loads.

    ``read_path`` is ``"window"`` (prefetch through the staging window),
    ``"direct"`` (lru mode: reads through the device's cache) or
    ``"timing"`` (the ghost backend: the calls run, no bytes move);
    ``has_bytes`` whether blocks have bytes to verify.
    """

    @property
    def device(self) -> DeviceLike: ...

    @property
    def manager(self) -> KVManager: ...

    @property
    def read_path(self) -> str: ...

    @property
    def has_bytes(self) -> bool: ...

    @property
    def window_bytes(self) -> int: ...

    def pin(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Pins index rows against eviction; a copy of their entries."""
        ...

    def unpin(self, rows: np.ndarray[Any, Any], ents: np.ndarray[Any, Any], bad: list[int]) -> None:
        """Undoes pin(); the entries at positions ``bad`` failed their
        checksum and are dropped."""
        ...

    def retain(self, addrs: list[int]) -> list[bool] | None:
        """Which blocks the device should keep resident (None: none)."""
        ...

    def count(self, name: str, n: int = 1) -> None:
        """Adds ``n`` to the store's counter ``name``."""
        ...

    def read_into(self, addr: int, dst: Any) -> int:
        """The device's ``read_into`` (the direct path), one at a time with
        the store's other data calls where the device needs it."""
        ...


class Lookup:
    """Pinned hits of one request with their prefetches issued.

    ``hits`` is the prefix length, ``tokens`` the opaque read tokens of the
    prefetches issued so far. Use :meth:`load` to copy the blocks out, or
    :meth:`close` to give everything back (a context manager).
    """

    def __init__(
        self, store: BlockSource, rows: np.ndarray[Any, Any], request: object = None
    ) -> None:
        self._store = store
        self._rows = rows
        self._ents = store.pin(rows)
        self._request = request if request is not None else ("lookup", next(_requests))
        self._closed = False
        self.hits = int(rows.size)
        self.loaded = 0
        self._win: SlidingWindow | None = None
        self.tokens: list[int] = []
        if store.read_path == "direct":
            return
        mgr = store.manager
        biggest = int(self._ents["length"].max()) if rows.size else 1
        mgr.admit(self._request, w_max(biggest, self.hits, store.window_bytes))
        ranges = list(zip(self._ents["addr"].tolist(), self._ents["length"].tolist(), strict=True))
        req = self._request
        retain = store.retain([a for a, _ in ranges])
        try:
            self._win = SlidingWindow(store.device, ranges, lambda: mgr.window(req), retain)
        except BaseException:
            self.close()
            raise
        self.tokens = [h.token for _, h in self._win._q]

    def load(self, dsts: Any, timeout: float | None = None, *, prefix: bool = True) -> list[bool]:
        """Copies the hits into ``dsts`` (one writable buffer per hit, in order).

        Returns per hit whether it was loaded. A block that fails its
        checksum or its read is a miss (counted; a large block's buffer may
        have been written before its checksum was known); with ``prefix`` the load
        stops there, as it does at ``timeout`` (seconds for the whole load),
        leaving the rest unloaded. Never waits past the timeout. Closes the
        lookup.
        """
        try:
            outs = self._destinations(dsts)
        except BaseException:
            self.close()  # a refused load gives its pins and prefetches back
            raise
        n = self.hits
        ok = [False] * n
        st = self._store
        deadline = None if timeout is None else time.monotonic() + timeout
        checks = self._ents["checksum"].tolist()
        lens = self._ents["length"].tolist()
        bad: list[int] = []
        if self._win is None:
            return self._read_direct(outs, deadline, prefix)
        data = st.read_path != "timing"
        try:
            for j, h in self._win:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    v = h.wait(left)
                except WaitTimeout:
                    st.count("timeouts")
                    break
                except DeviceIOError:
                    st.count("io_errors")
                    if prefix:
                        break
                    continue
                if not data:  # the ghost backend: the timing ran, no bytes exist
                    ok[j] = True
                    continue
                if lens[j] >= _OVERLAP_BYTES:  # hash on the helper while this thread copies
                    fut = _hasher().submit(_hash, v)
                    outs[j][: lens[j]] = np.frombuffer(v, np.uint8)
                    good = fut.result() == checks[j]
                else:
                    good = _hash(v) == checks[j]
                    if good:
                        outs[j][: lens[j]] = np.frombuffer(v, np.uint8)
                del v
                if not good:
                    st.count("checksum_errors")
                    bad.append(j)
                    if prefix:
                        break
                    continue
                ok[j] = True
        except ChmError:
            st.count("io_errors")
        finally:
            if self._win.blocked:
                st.count("window_blocked", self._win.blocked)
            self.close(bad)
        self.loaded = sum(ok)
        st.count("gets_hit", self.loaded)
        return ok

    def _read_direct(
        self, outs: list[np.ndarray[Any, Any]], deadline: float | None, prefix: bool
    ) -> list[bool]:
        """lru mode: each hit read into its buffer through the device's
        cache, in order, then verified (a bad block's buffer was written)."""
        st = self._store
        ok = [False] * self.hits
        bad: list[int] = []
        ents = self._ents
        verify = st.has_bytes  # the ghost backend holds no bytes to verify
        try:
            for j, (addr, n, check) in enumerate(
                zip(
                    ents["addr"].tolist(),
                    ents["length"].tolist(),
                    ents["checksum"].tolist(),
                    strict=True,
                )
            ):
                if deadline is not None and time.monotonic() >= deadline:
                    st.count("timeouts")
                    break
                dst = outs[j][:n]
                try:
                    st.read_into(addr, dst)
                except ChmError:
                    st.count("io_errors")
                    if prefix:
                        break
                    continue
                if verify and _hash(dst.data) != check:
                    st.count("checksum_errors")
                    bad.append(j)
                    if prefix:
                        break
                    continue
                ok[j] = True
        finally:
            self.close(bad)
        self.loaded = sum(ok)
        st.count("gets_hit", self.loaded)
        return ok

    def _destinations(self, dsts: Any) -> list[np.ndarray[Any, Any]]:
        n = self.hits
        if len(dsts) < n:
            raise InvalidArgument(None, f"load: {len(dsts)} destination buffers for {n} hits")
        outs = []
        seen: dict[int, np.ndarray[Any, Any]] = {}  # one buffer given for several hits
        lens = self._ents["length"].tolist()
        for j in range(n):
            d = seen.get(id(dsts[j]))
            if d is None:
                d = seen[id(dsts[j])] = as_dst(dsts[j], f"destination {j}")
            need = lens[j]
            if d.size < need:
                raise InvalidArgument(
                    None, f"destination {j}: {d.size} bytes, the block has {need}"
                )
            outs.append(d)
        return outs

    def close(self, bad: list[int] | None = None) -> None:
        """Releases the prefetches and the pins (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            win = self._win
            if win is not None:
                win.close()
        finally:
            self._store.manager.leave(self._request)
            self._store.unpin(self._rows, self._ents, bad or [])

    def __enter__(self) -> Lookup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
