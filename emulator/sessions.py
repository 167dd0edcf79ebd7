"""Per-client scopes of handles and pins inside the daemon.

Each Scope is a C device session (``chm_session_open``) with the daemon's
per-client quota (``client_quota``): the device scopes the client's handles, holds it to at
most ``quota`` slots plus queue entries (-EAGAIN beyond), serves the refill
queue round-robin across clients (one client flooding it delays another's
prefetch by about one grant) and releases everything on
``chm_session_close``. Every token and KV pin a client obtains is also
recorded here, so a token of another scope is refused with -ESTALE (as a
stale handle is) before the device sees it, and the daemon can count what
clients hold. In direct mode (no staging window, no sessions) a scope uses
the device's default session.
"""

from __future__ import annotations

import contextlib
import errno
import threading
from collections import Counter
from typing import Any

import numpy as np

from chm import _lowlevel as _ll
from chm.device import Device
from chm.errors import ChmError, NotSupported
from chm.kv import KEY_DTYPE, Store

__all__ = ["Scope", "Scopes", "default_quota"]


def _rc(exc: ChmError) -> int:
    return -(exc.errno or errno.EIO)


def default_quota(slot_count: int, refill_queue: int) -> int:
    """A client's quota when none is configured: every request entry of the
    device (slots + refill queue), so one client alone can use the whole
    device as an embedded caller can. With several clients, a smaller
    ``client_quota`` keeps one from taking every queue entry (the others'
    prefetches would get -EAGAIN until it releases some); the queue is served
    round-robin either way."""
    return max(1, slot_count + refill_queue)


class Scope:
    """What one client holds: its device session, prefetch tokens and KV pins."""

    def __init__(
        self,
        dev: Device,
        store: Store | None,
        sid: int,
        registry: Scopes | None = None,
        quota: int | None = None,
    ) -> None:
        self.sid = sid
        self._registry = registry
        self._dev = dev
        self._store = store
        self.tokens: set[int] = set()
        self.pins: Counter[tuple[int, int]] = Counter()
        self._lock = threading.Lock()
        self.quota = quota
        self.session = _ll.SESSION_DEFAULT
        if quota is not None:
            with contextlib.suppress(NotSupported):  # direct mode: no window, no sessions
                self.session = _ll.session_open(self._ptr(), quota)

    def _ptr(self) -> Any:
        return self._dev._p("chm_prefetch_object")

    def prefetch(self, addr: int, length: int, flags: int) -> tuple[int, int]:
        """(0, token) or (-errno, 0); -EAGAIN also over the quota."""
        try:
            tok = _ll.session_prefetch_one(self._ptr(), self.session, addr, length, flags)
        except ChmError as exc:
            return _rc(exc), 0
        except (TypeError, OverflowError):
            return -errno.EINVAL, 0
        with self._lock:
            self.tokens.add(tok)
        return 0, tok

    def owns(self, token: int) -> bool:
        with self._lock:
            return token in self.tokens

    def _foreign(self, token: int) -> bool:
        """Live in another scope: refused without asking the device."""
        return self._registry is not None and self._registry.holder(token) not in (None, self)

    def wait(self, token: int, timeout_ns: int) -> tuple[int, int, int, int]:
        """(0, pool offset, length, device address) or (-errno, 0, 0, 0).

        Another scope's live token is -ESTALE; a token live nowhere is asked
        of the device, which answers for it as for any stale or foreign
        handle (-ESTALE, -EINVAL) with no effect."""
        mine = self.owns(token)
        if not mine and self._foreign(token):
            return -errno.ESTALE, 0, 0, 0
        try:
            v = _ll.session_wait(self._ptr(), self.session, token, timeout_ns if mine else 0)
        except ChmError as exc:
            return _rc(exc), 0, 0, 0
        if not mine:  # issued to another scope an instant ago
            return -errno.ESTALE, 0, 0, 0
        return 0, v.pool_offset, v.length, v.dev_addr

    def release(self, token: int) -> int:
        with self._lock:
            mine = token in self.tokens
            self.tokens.discard(token)
        if not mine:
            if self._foreign(token):
                return -errno.ESTALE
            try:  # live nowhere: the device refuses it as stale or foreign
                _ll.session_wait(self._ptr(), self.session, token, 0)
            except ChmError as exc:
                return _rc(exc)
            return -errno.ESTALE
        try:
            _ll.session_release_one(self._ptr(), self.session, token)
        except ChmError as exc:
            return _rc(exc)
        return 0

    def pin(self, keys: np.ndarray[Any, Any]) -> list[bool]:
        assert self._store is not None
        got = self._store.pin(keys)
        with self._lock:
            for k, ok in zip(keys.tolist(), got, strict=True):
                if ok:
                    self.pins[(int(k[0]), int(k[1]))] += 1
        return got

    def unpin(self, pairs: list[tuple[int, int]]) -> None:
        mine: list[tuple[int, int]] = []
        with self._lock:
            for p in pairs:
                if self.pins[p] > 0:
                    self.pins[p] -= 1
                    if not self.pins[p]:
                        del self.pins[p]
                    mine.append(p)
        if mine and self._store is not None:
            _unpin(self._store, mine)

    def close(self) -> tuple[int, int]:
        """Releases every token and pin; returns how many of each."""
        with self._lock:
            toks, self.tokens = list(self.tokens), set()
            pins, self.pins = list(self.pins.elements()), Counter()
            sess, self.session = self.session, _ll.SESSION_DEFAULT
        if sess != _ll.SESSION_DEFAULT:
            # one call releases every handle of the session
            with contextlib.suppress(ChmError):  # the device is closing: all released
                _ll.session_close(self._ptr(), sess)
        else:
            for t in toks:
                try:
                    _ll.prefetch_release(self._ptr(), t)
                except ChmError:  # the device is closing: its slots go with it
                    continue
        if pins and self._store is not None and not self._store.closed:
            _unpin(self._store, pins)
        return len(toks), len(pins)


def _unpin(store: Store, pairs: list[tuple[int, int]]) -> None:
    try:
        store.unpin(_keys(pairs))
    except ChmError:  # a key removed meanwhile: unpin the others one by one
        for p in pairs:
            with contextlib.suppress(ChmError):
                store.unpin(_keys([p]))


def _keys(pairs: list[tuple[int, int]]) -> np.ndarray[Any, Any]:
    ks = np.zeros(len(pairs), dtype=KEY_DTYPE)
    if pairs:
        ks["hi"] = [p[0] for p in pairs]
        ks["lo"] = [p[1] for p in pairs]
    return ks


class Scopes:
    """All live scopes, for counting what clients hold. ``quota`` is each
    new scope's session quota (None: no session of its own)."""

    def __init__(self, quota: int | None = None) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, Scope] = {}
        self._next = 1
        self.quota = quota

    def open(self, dev: Device, store: Store | None) -> Scope:
        with self._lock:
            s = Scope(dev, store, self._next, self, self.quota)
            self._next += 1
            self._live[s.sid] = s
            return s

    def close(self, s: Scope) -> tuple[int, int]:
        with self._lock:
            self._live.pop(s.sid, None)
        return s.close()

    def holder(self, token: int) -> Scope | None:
        with self._lock:
            live = list(self._live.values())
        for s in live:
            if s.owns(token):
                return s
        return None

    def held(self) -> dict[str, int]:
        with self._lock:
            live = list(self._live.values())
        return {
            "clients": len(live),
            "handles": sum(len(s.tokens) for s in live),
            "pins": sum(sum(s.pins.values()) for s in live),
        }

    def all(self) -> list[Scope]:
        with self._lock:
            return list(self._live.values())
