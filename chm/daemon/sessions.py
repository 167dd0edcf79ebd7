"""Per-client scopes of handles and pins inside the daemon.

Each Scope is a device session (``Device.session``, a ``chm.Session``) with
the daemon's per-client quota (``client_quota``): the device scopes the
client's handles, holds it to at most ``quota`` slots plus queue entries
(-EAGAIN beyond), serves the refill queue round-robin across clients (one
client flooding it delays another's prefetch by about one grant) and
releases everything when the session closes. Every handle and KV pin a
client obtains is also recorded here, so another scope's token is refused
with -ESTALE (as a stale handle is) before the device sees it, and the daemon can count what
clients hold. In direct mode (no staging window, no sessions) a scope uses
the device's default session."""

from __future__ import annotations

import contextlib
import errno
import threading
from collections import Counter
from typing import Any

import numpy as np

from chm import _lowlevel as _ll
from chm.device import Device, Handle, Session
from chm.errors import ChmError, NotSupported
from chm.kv import KEY_DTYPE, Store

__all__ = ["NOQUEUE", "RETAIN", "Scope", "Scopes", "default_quota"]

NOQUEUE = 1  # the PREFETCH flags of fw_spec/protocol.md: CHM_PF_NOQUEUE,
RETAIN = 2  # CHM_PF_RETAIN
_FOREVER = 2**64 - 1  # a WAIT timeout that never ends


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
    """What one client holds: its device session, prefetch handles and KV pins."""

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
        # token -> the Handle this client holds (the daemon never takes a
        # view of it: waits ask Device.view_info)
        self.tokens: dict[int, Handle] = {}
        self.pins: Counter[tuple[int, int]] = Counter()
        self._lock = threading.Lock()
        self.quota = quota
        self._sess: Session | None = None  # None: the device's default session
        if quota is not None:
            with contextlib.suppress(NotSupported):  # direct mode: no window, no sessions
                self._sess = dev.session(quota)

    def prefetch(self, addr: int, length: int, flags: int) -> tuple[int, int]:
        """(0, token) or (-errno, 0); -EAGAIN also over the quota."""
        if flags & ~(NOQUEUE | RETAIN):
            return -errno.EINVAL, 0  # as the device refuses unknown flags
        kw = {"noqueue": bool(flags & NOQUEUE), "retain": bool(flags & RETAIN)}
        sess = self._sess
        try:
            if sess is None:
                h = self._dev.prefetch(addr, length, **kw)
            else:
                h = sess.prefetch(addr, length, **kw)
        except ChmError as exc:
            return _rc(exc), 0
        except (TypeError, OverflowError):
            return -errno.EINVAL, 0
        with self._lock:
            self.tokens[h.token] = h
        return 0, h.token

    def prefetch_many(self, items: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
        """:meth:`prefetch` of each ``(addr, length, flags)``, in one device
        call per run of elements with the same flags; the same answers."""
        out: list[tuple[int, int]] = []
        i = 0
        while i < len(items):
            flags = items[i][2]
            j = i + 1
            while j < len(items) and items[j][2] == flags:
                j += 1
            run = items[i:j]
            i = j
            if flags & ~(NOQUEUE | RETAIN) or len(run) == 1:
                out += [self.prefetch(a, n, f) for a, n, f in run]
                continue
            kw = {"noqueue": bool(flags & NOQUEUE), "retain": bool(flags & RETAIN)}
            addrs, lens = [e[0] for e in run], [e[1] for e in run]
            sess = self._sess
            try:
                if sess is None:
                    got = self._dev.prefetch_many(addrs, lens, **kw)
                else:
                    got = sess.prefetch_many(addrs, lens, **kw)
            except ChmError:  # refused as a whole: each element says why
                out += [self.prefetch(a, n, f) for a, n, f in run]
                continue
            with self._lock:
                for h in got:
                    if isinstance(h, Handle):
                        self.tokens[h.token] = h
            out += [(_rc(h), 0) if isinstance(h, ChmError) else (0, h.token) for h in got]
        return out

    def _held(self, token: int) -> Handle | None:
        with self._lock:
            return self.tokens.get(token)

    def owns(self, token: int) -> bool:
        return self._held(token) is not None

    def _unheld(self, token: int) -> int:
        """The answer for a token this scope does not hold: another scope's
        live token is -ESTALE without asking the device; one live nowhere is
        asked of the device in this scope's session (a poll, no view made),
        which answers for it as for any stale or foreign handle (-ESTALE,
        -EINVAL) with no effect."""
        sess = self._sess
        if sess is None or (
            self._registry is not None and self._registry.holder(token) not in (None, self)
        ):
            return -errno.ESTALE
        try:
            self._dev.view_info(Handle(self._dev, token, sess))
        except ChmError as exc:
            return _rc(exc)
        return -errno.ESTALE

    def wait(self, token: int, timeout_ns: int) -> tuple[int, int, int, int]:
        """(0, pool offset, length, device address) or (-errno, 0, 0, 0);
        a token this scope does not hold answers as :meth:`_unheld` says."""
        h = self._held(token)
        if h is None:
            return self._unheld(token), 0, 0, 0
        sess = self._sess
        try:  # a status, no view made: the daemon never takes a view of it
            ptr = self._dev._p("chm_session_wait") if sess is None else sess._p("chm_session_wait")
        except ChmError as exc:
            return _rc(exc), 0, 0, 0
        sid = _ll.SESSION_DEFAULT if sess is None else sess._sid
        return _ll.session_wait_status(ptr, sid, token, min(timeout_ns, _FOREVER))

    def release(self, token: int) -> int:
        """0, or -errno (a token this scope does not hold: :meth:`_unheld`)."""
        with self._lock:
            h = self.tokens.pop(token, None)
        if h is None:
            return self._unheld(token)
        try:
            h.release()
        except ChmError as exc:
            return _rc(exc)
        return 0

    def release_many(self, tokens: list[int]) -> list[int]:
        """:meth:`release` of each token, the held ones in one device call."""
        out = [0] * len(tokens)
        held: list[Handle] = []
        where: list[int] = []
        with self._lock:
            for j, t in enumerate(tokens):
                h = self.tokens.pop(t, None)
                if h is None:
                    out[j] = 1  # not held here: answered below
                else:
                    held.append(h)
                    where.append(j)
        for j, t in enumerate(tokens):
            if out[j] == 1:
                out[j] = self._unheld(t)
        if held:
            sess = self._sess
            try:
                res = self._dev.release_many(held) if sess is None else sess.release_many(held)
            except ChmError as exc:
                res = [exc] * len(held)
            for j, r in zip(where, res, strict=True):
                out[j] = 0 if r is None else _rc(r)
        return out

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
        """Releases every handle and pin; returns how many of each."""
        with self._lock:
            hs, self.tokens = list(self.tokens.values()), {}
            pins, self.pins = list(self.pins.elements()), Counter()
            sess, self._sess = self._sess, None
        if sess is not None:
            # one call releases every handle of the session
            with contextlib.suppress(ChmError):  # the device is closing: all released
                sess.close()
        else:
            for h in hs:
                with contextlib.suppress(ChmError):  # the device is closing: its slots go with it
                    h.release()
        if pins and self._store is not None and not self._store.closed:
            _unpin(self._store, pins)
        return len(hs), len(pins)


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
