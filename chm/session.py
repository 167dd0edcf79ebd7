"""Sessions: scopes of handles on one device, each with a quota.

A session sees its device through :class:`SessionOwner`, the device's
internals it shares (see :class:`chm.handle.DeviceCore`) plus the batched
calls it runs in its own scope, so this module does not import the device's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

from chm import _lowlevel as _ll
from chm.errors import Cancelled, ChmError, StaleHandle
from chm.handle import _QUOTA_ANY, DeviceCore, Handle, HandleBatch, _pf_flags, _ref

__all__ = ["Session", "SessionOwner"]


class SessionOwner(DeviceCore, Protocol):
    """The device a :class:`Session` runs on (:class:`chm.device.Device`)."""

    def _prefetch_many(
        self, sess: Session | None, addrs: Sequence[int], lengths: Sequence[int], flags: int
    ) -> list[Handle | ChmError]: ...

    def _prefetch_batch(
        self, sess: Session | None, addrs: Sequence[int], lengths: Sequence[int], flags: int
    ) -> HandleBatch: ...

    def _release_many(
        self, sess: Session | None, handles: Sequence[Handle]
    ) -> list[ChmError | None]: ...


class Session:
    """A scope of handles on one device, with a quota (``chm_session_open``).

    Made by :meth:`Device.session`. Its :meth:`prefetch`, :meth:`prefetch_many`,
    :meth:`prefetch_batch` and :meth:`release_many` are the device's, and its
    handles follow the same view rules; a handle of one session is refused
    by another (InvalidArgument) and by the device's default session. At most
    ``quota`` request entries (slots, including released ones whose fill is
    still in flight, plus queued requests) are held at once: a prefetch over
    it raises WouldBlock. The refill queue is served round-robin across
    sessions, so a session that floods it delays the others by at most one
    grant per turn. A context manager; :meth:`close` (idempotent) releases
    every handle of the session: like :meth:`Device.close`, it raises
    ViewInUse, closing nothing, while one of their views is still exported,
    and otherwise ends their views, so no view of a closed session ever shows
    other bytes. A live handle keeps its session open; a session dropped
    without ``close()`` is closed when garbage-collected.
    """

    def __init__(self, dev: SessionOwner, quota: int | None = None) -> None:
        self._dev = dev
        self._closed = True  # until opened (the finaliser looks at it)
        q = _QUOTA_ANY if quota is None else quota
        self._sid: int = _ll.session_open(dev._p("chm_session_open"), q)
        self._quota = q
        self._closed = False

    @property
    def quota(self) -> int:
        return self._quota

    @property
    def token(self) -> int:
        """The raw session token of the C API."""
        return self._sid

    @property
    def device(self) -> SessionOwner:
        return self._dev

    @property
    def closed(self) -> bool:
        return self._closed or self._dev._ptr is None

    def _p(self, what: str) -> Any:
        if self._closed:
            raise StaleHandle(None, f"{what}: {self!r} is closed", call=what)
        return self._dev._p(what)

    def prefetch(
        self, addr: int, length: int, *, noqueue: bool = False, retain: bool = False
    ) -> Handle:
        """:meth:`Device.prefetch` in this session (WouldBlock also over the quota).

        Alignment: none, as for :meth:`Device.prefetch`.
        """
        dev = self._dev
        tok = _ll.session_prefetch_one(
            self._p("chm_session_prefetch"), self._sid, addr, length, _pf_flags(noqueue, retain)
        )
        h = Handle(dev, tok, self)
        dev._handles[tok] = _ref(h)
        return h

    def prefetch_many(
        self,
        addrs: Sequence[int],
        lengths: Sequence[int],
        *,
        noqueue: bool = False,
        retain: bool = False,
    ) -> list[Handle | ChmError]:
        """:meth:`Device.prefetch_many` in this session.

        Alignment: none, as for :meth:`Device.prefetch`.
        """
        return self._dev._prefetch_many(self, addrs, lengths, _pf_flags(noqueue, retain))

    def prefetch_batch(
        self,
        addrs: Sequence[int],
        lengths: Sequence[int],
        *,
        noqueue: bool = False,
        retain: bool = False,
    ) -> HandleBatch:
        """:meth:`Device.prefetch_batch` in this session.

        Alignment: none, as for :meth:`Device.prefetch`.
        """
        return self._dev._prefetch_batch(self, addrs, lengths, _pf_flags(noqueue, retain))

    def release_many(self, handles: Sequence[Handle]) -> list[ChmError | None]:
        """:meth:`Device.release_many` for handles of this session (another
        session's handle gets InvalidArgument and keeps its slot)."""
        return self._dev._release_many(self, handles)

    def close(self) -> None:
        """Releases every handle of the session and closes it (idempotent)."""
        dev = self._dev
        with dev._lock:
            if self._closed:
                return
            mine = [h for h in dev._live_handles() if h._sess is self and not h._done]
            held = [h for h in mine if h._view() is not None]
            for h in held:  # all or nothing: refuse before ending any view
                if h._exported():
                    raise h._in_use()
            for h in held:
                h._end_view()
            for h in mine:
                h._done = True
                dev._forget(h)
            self._closed = True
            ptr = dev._ptr
        if ptr is not None:  # else closing the device closed the session
            with contextlib.suppress(Cancelled):
                _ll.session_close(ptr, self._sid)

    def __del__(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(ChmError, AttributeError, TypeError):
            self.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<chm.Session {self._sid:#x} {state} quota={self._quota}>"
