"""The embedded device: ``chm.Device`` and its prefetch ``Handle``.

    with chm.Device.open(capacity="64G", backend="pread") as dev:
        with dev.prefetch(addr, 16 << 20) as h:
            view = h.wait()          # read-only memoryview into device DRAM
            arr = h.array("f2")      # read-only numpy array over the same bytes
            ...                      # drop views before the block ends

Views are zero-copy windows into the device's DRAM pool, read-only all the
way down: the memoryview's ``.obj`` (and the ``.base`` chain of every array)
is a :class:`chm._robuf.ReadOnlyBuffer`, which refuses writable exports. They
are valid only until their handle is released (or the device closed): a
released ``memoryview`` raises ``ValueError`` on use, and so does a new export
of a released ``.obj``. Releasing a handle while something still views its
memory (a numpy array from ``h.array()``, a slice of the view, ...) raises
:class:`chm.errors.ViewInUse` and keeps the slot held, so memory that is
still viewed is never reused.

One Handle per slot: a view keeps its Handle alive, ``Device.adopt(token)``
of a token that has a live Handle returns that Handle, and a Handle that is
garbage-collected without ``release()`` gives its slot back then, with a
ResourceWarning (as an unclosed file does). Timeouts are seconds (float);
``None`` waits forever. Integer arguments refuse bools (InvalidArgument).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import numbers
import operator
import os
import stat
import tempfile
import threading
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chm import _lowlevel as _ll
from chm._scratch import ScratchDir
from chm.backend import open_device
from chm.config import Config
from chm.errors import (
    Busy,
    Cancelled,
    ChmError,
    InvalidArgument,
    StaleHandle,
    ViewInUse,
    error_for,
)
from chm.stats import Stats

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["Device", "Handle", "HandleBatch", "Session", "timeout_ns"]

_FOREVER = _ll.UINT64_MAX
_prefetch = _ll.prefetch_object
_wait_buffer = _ll.prefetch_wait_buffer
_release = _ll.prefetch_release
_NOQUEUE = _ll.PF_NOQUEUE
_RETAIN = _ll.PF_RETAIN


def _pf_flags(noqueue: bool, retain: bool) -> int:
    return (_NOQUEUE if noqueue else 0) | (_RETAIN if retain else 0)


_ref = weakref.ref
_QUOTA_ANY = 2**32 - 1  # a session quota that never limits


def timeout_ns(timeout: float | None) -> int:
    """Seconds (``None`` = forever, 0 = poll) to the C API's nanoseconds."""
    if timeout is None:
        return _FOREVER
    t: object = timeout  # numpy numbers too; bools are not seconds
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise InvalidArgument(None, f"timeout must be seconds or None, not {timeout!r}")
    seconds = float(t)
    if seconds != seconds or seconds < 0:  # NaN or negative
        raise InvalidArgument(None, f"timeout must be >= 0, not {timeout!r}")
    if seconds >= _FOREVER / 1e9:  # includes inf: as good as forever
        return _FOREVER
    ns = int(seconds * 1e9)
    return ns if ns < _FOREVER else _FOREVER - 1


def _closed_error(what: str) -> Cancelled:
    return Cancelled(None, f"{what}: device is closed", call=what, detail="device is closed")


class Handle:
    """One issued prefetch: ``wait()`` for the staged view, then ``release()``.

    A context manager that releases on exit. ``token`` is the raw 64-bit
    handle of the C API (a generation-checked token: releasing it twice, or
    using it on another device, is an error there). A Handle dropped without
    ``release()`` is released when garbage-collected (ResourceWarning); its
    views keep it alive, so that never happens under a view.
    """

    # _buf: weak reference to the ReadOnlyBuffer over the slot (which holds
    # this Handle strongly, so views keep their handle alive); _mv: weak
    # reference to the memoryview wait() handed out; _done: released;
    # _sess: the Session that issued it (None: the device's default session;
    # held strongly, so a live handle keeps its session open); _batch: the
    # HandleBatch it was taken from (which releases it; held strongly).
    __slots__ = ("__weakref__", "_batch", "_buf", "_dev", "_done", "_mv", "_sess", "token")

    def __init__(self, dev: Device, token: int, sess: Session | None = None) -> None:
        self._dev = dev
        self.token = token
        self._done = False
        self._mv: weakref.ref[memoryview] | None = None
        self._buf: weakref.ref[_ll.ReadOnlyBuffer] | None = None
        self._sess = sess
        self._batch: HandleBatch | None = None

    def _c_release(self, ptr: Any) -> None:
        """The device call that releases the token (in its session)."""
        sess = self._sess
        if sess is None:
            _release(ptr, self.token)
        else:
            _ll.session_release_one(ptr, sess._sid, self.token)

    # -- staging

    def wait(self, timeout: float | None = None) -> memoryview:
        """Blocks until the object is staged; returns a read-only memoryview.

        Waiting again returns the same view while it is alive (or a new one
        over the same bytes). The view holds every write admitted before the
        first wait and is a snapshot: later writes never change it (they
        reach ``Device.read`` and the next prefetch). Raises WaitTimeout when not staged within
        ``timeout`` seconds (``0`` polls), DeviceIOError when the fill failed
        (release the handle), StaleHandle after release, InvalidArgument for a
        handle of another device, Cancelled when the device is closed.
        """
        ref = self._mv
        if ref is not None:
            mv = ref()
            if mv is not None:
                try:
                    if mv:  # staged objects are never empty; raises if released
                        return mv
                except ValueError:
                    pass
        ref_b = self._buf
        buf = ref_b() if ref_b is not None else None
        if buf is None or buf.released:
            dev = self._dev
            ptr = dev._ptr
            if ptr is None:
                raise _closed_error("chm_prefetch_wait")
            tns = _FOREVER if timeout is None else timeout_ns(timeout)
            sess = self._sess
            if sess is None:
                new = _wait_buffer(ptr, self.token, tns, self)
            else:
                new = _ll.session_wait_buffer(ptr, sess._sid, self.token, tns, self)
            # Registering is atomic with close() (under the lock) and with
            # release()'s lock-free path: the buffer is published before
            # _done is read, which release() sets before it reads _buf, so
            # one of the two sees the other. A view is either known to them
            # or never handed out.
            with dev._lock:
                if dev._ptr is None:
                    raise _closed_error("chm_prefetch_wait")
                ref_b = self._buf
                buf = ref_b() if ref_b is not None else None
                if buf is None or buf.released:  # else another thread's wait won
                    buf = new
                    self._buf = _ref(buf)
                if self._done:
                    if buf is new:
                        self._buf = None
                    raise StaleHandle(
                        None,
                        f"chm_prefetch_wait(handle={self.token:#x}): released meanwhile",
                        call="chm_prefetch_wait",
                    )
                mv = memoryview(buf)
                self._mv = _ref(mv)
            return mv
        try:
            mv = memoryview(buf)
        except ValueError:  # ended meanwhile by release() or close() in another thread
            return self.wait(timeout)
        self._mv = _ref(mv)
        return mv

    def array(
        self, dtype: npt.DTypeLike = "u1", timeout: float | None = None
    ) -> np.ndarray[Any, Any]:
        """The staged bytes as a read-only numpy array (waits if needed).

        The array views device DRAM: drop it before releasing the handle
        (``release()`` raises ViewInUse while it is alive).
        """
        import numpy as np

        # Over a memoryview of the exporter, not over the view wait() handed
        # out: release() then sees the array in the exporter's count and
        # refuses before ending anything.
        return np.frombuffer(memoryview(self.wait(timeout).obj), dtype=dtype)

    def ready(self) -> bool:
        """True when wait() would return at once (polls; never raises a timeout)."""
        if self._view() is not None:
            return True
        try:
            self.wait(0)
        except TimeoutError:
            return False
        return True

    # -- release

    def _view(self) -> _ll.ReadOnlyBuffer | None:
        """The live buffer over the slot, if a view was handed out."""
        ref = self._buf
        buf = ref() if ref is not None else None
        if buf is None or buf.released:
            return None
        return buf

    def _own_view(self) -> memoryview | None:
        ref = self._mv
        return ref() if ref is not None else None

    def _exported(self) -> bool:
        """True while something other than the memoryview wait() handed out
        (an array, a memoryview of ``.obj``) exports the slot's buffer."""
        buf = self._view()
        if buf is None:
            return False
        return buf.exports > (1 if self._own_view() is not None else 0)

    def _in_use(self) -> ViewInUse:
        return ViewInUse(
            None,
            f"handle {self.token:#x}: its view is still exported (slices, numpy arrays or "
            "memoryviews derived from it are alive); drop them first",
            call="release",
        )

    def _end_view(self) -> None:
        """Ends a held view (under the device lock); raises ViewInUse, with
        the slot untouched, while anything else still exports it."""
        buf = self._view()
        if buf is not None:
            mv = self._own_view()
            if buf.exports > (1 if mv is not None else 0):
                raise self._in_use()
            if mv is not None:
                try:
                    mv.release()
                except BufferError:  # an array or memoryview made from it
                    raise self._in_use() from None
            try:
                buf.release()
            except BufferError:  # a slice of the view keeps it exported
                raise self._in_use() from None
        self._buf = self._mv = None

    def release(self) -> None:
        """Releases the slot. A second call is a no-op.

        Raises ViewInUse (and keeps the slot held) while the view is still
        exported; StaleHandle if the token was already released through
        another route.
        """
        if self._done:
            return
        dev = self._dev
        ref = self._buf
        if ref is None or ref() is None:  # no view: the lock-free path
            self._done = True  # published before _buf is read again (see wait())
            ref = self._buf
            if ref is None or ref() is None:
                # Not done before, so adopt() gave no other Handle for this
                # token: the registry entry, if any, is ours.
                dev._handles.pop(self.token, None)
                ptr = dev._ptr
                if ptr is not None:  # else closing the device released everything
                    with contextlib.suppress(Cancelled):  # close() raced us
                        if self._sess is None:  # the hot path: no extra call
                            _release(ptr, self.token)
                        else:
                            self._c_release(ptr)
                return
            self._done = False  # a wait() registered a view meanwhile
        with dev._lock:
            if self._done:
                return
            if self._buf is not None:
                self._end_view()
            self._done = True
            dev._handles.pop(self.token, None)
        ptr = dev._ptr
        if ptr is not None:  # else closing the device released everything
            with contextlib.suppress(Cancelled):  # close() raced us: all released
                self._c_release(ptr)

    close = release

    # Finalisation runs in whatever thread drops the last reference or runs
    # the collector, possibly one inside a device-lock section (the lock is
    # reentrant) and at interpreter exit: it uses only what the instance and
    # its class hold, and never raises but for the warning.
    _warn = staticmethod(warnings.warn)
    _Error = ChmError

    def __del__(self) -> None:
        if self._done or self._batch is not None:
            return  # released, or its batch releases it
        try:
            dev = self._dev
            with dev._lock:
                if self._done or self._view() is not None:
                    return  # adopt() revived it and it has a view: its owner releases it
                self._done = True
                dev._forget(self)
                ptr = dev._ptr
            if ptr is None:
                return  # the device is closed: nothing is held
            self._c_release(ptr)
        except (self._Error, AttributeError, TypeError):
            return  # released through another route, or torn down at exit
        self._warn(
            f"unreleased chm handle {self.token:#x} of {dev!r}: released by the garbage "
            "collector (release it, or use 'with dev.prefetch(...) as h')",
            ResourceWarning,
            source=self,
        )

    @property
    def released(self) -> bool:
        return self._done

    @property
    def device(self) -> Device:
        return self._dev

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._done else ("held" if self._view() is not None else "issued")
        return f"<chm.Handle {self.token:#x} {state}>"


class HandleBatch:
    """The handles of one batched prefetch, held and released together.

    What :meth:`Device.prefetch_batch` (and :meth:`Session.prefetch_batch`)
    return: the C call's arrays as they are, with no Python object per
    element, so a 32-object prefix costs two device calls and a few objects.
    ``len(batch)`` elements; ``issued`` of them were issued; ``statuses`` is a
    read-only ``memoryview`` of ``int`` (0, or the element's -errno);
    :meth:`error` gives the exception :meth:`Device.prefetch` would have
    raised for an element. ``batch[i]`` is element i's :class:`Handle`, made
    on first use (the same object every time; raises the element's error if it
    was not issued); ``batch.wait(i)`` and ``batch.array(i)`` are its view,
    with the Handle's view rules. :meth:`release` releases every element in
    one call (a context manager does it on exit): all or nothing, it raises
    ViewInUse and releases none while any element's view is still exported.
    An element released on its own (``batch[i].release()``) stays released.
    A batch dropped unreleased is released when garbage-collected, with a
    ResourceWarning; a view of an element keeps its batch alive.
    """

    __slots__ = ("__weakref__", "_dev", "_done", "_hmap", "_hs", "_n", "_res", "_sess", "issued")

    def __init__(
        self, dev: Device, sess: Session | None, hs: Any, res: Any, n: int, issued: int
    ) -> None:
        self._dev = dev
        self._sess = sess
        self._hs = hs
        self._res = res
        self._n = n
        self.issued = issued
        self._done = False
        self._hmap: dict[int, Handle] | None = None

    def __len__(self) -> int:
        return self._n

    @property
    def ok(self) -> bool:
        """True when every element was issued."""
        return self.issued == self._n

    @property
    def statuses(self) -> memoryview:
        """Per element: 0 (issued) or its -errno, as a read-only memoryview."""
        return _ll.batch_status_buffer(self._res, self._n)

    def _index(self, i: int) -> int:
        if isinstance(i, bool):
            raise InvalidArgument(None, f"a batch index is an int, not {i!r}")
        j = operator.index(i)
        n = self._n
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise IndexError(f"batch index {i} out of range for {n} elements")
        return j

    def error(self, i: int) -> ChmError | None:
        """The exception :meth:`Device.prefetch` would have raised for element
        i, or None when it was issued."""
        j = self._index(i)
        rc = int(self._res[j])
        if not rc:
            return None
        err: ChmError = _ll.status_error(rc, "chm_session_prefetch", f"element {j}")
        return err

    def token(self, i: int) -> int:
        """Element i's raw handle token (raises its error if not issued)."""
        j = self._index(i)
        err = self.error(j)
        if err is not None:
            raise err
        return _ll.batch_token(self._hs, j)

    def __getitem__(self, i: int) -> Handle:
        j = self._index(i)
        err = self.error(j)
        if err is not None:
            raise err
        dev = self._dev
        tok = _ll.batch_token(self._hs, j)
        with dev._lock:
            hmap = self._hmap
            if hmap is None:
                hmap = self._hmap = {}
            h = hmap.get(j)
            if h is not None:
                return h
            if self._done:
                raise StaleHandle(None, f"{self!r}: released", call="HandleBatch")
            ref = dev._handles.get(tok)
            h = ref() if ref is not None else None
            if h is None or h._done:
                h = Handle(dev, tok, self._sess)
                h._batch = self
                dev._handles[tok] = _ref(h)
            hmap[j] = h
            return h

    def wait(self, i: int, timeout: float | None = None) -> memoryview:
        """Element i's staged view (:meth:`Handle.wait`)."""
        return self[i].wait(timeout)

    def array(
        self, i: int, dtype: npt.DTypeLike = "u1", timeout: float | None = None
    ) -> np.ndarray[Any, Any]:
        """Element i's staged bytes as a read-only numpy array (:meth:`Handle.array`)."""
        return self[i].array(dtype, timeout)

    def _end_handles(self) -> None:
        """Ends the views of the elements' live Handles and marks them
        released (device lock held); ViewInUse, nothing changed, while one
        is still exported."""
        dev = self._dev
        reg = dev._handles
        live: list[Handle] = []
        for j in range(self._n):
            if self._res[j]:
                continue
            ref = reg.get(_ll.batch_token(self._hs, j))
            h = ref() if ref is not None else None
            if h is not None and not h._done:
                live.append(h)
        for h in live:
            if h._exported():
                raise h._in_use()
        for h in live:
            h._end_view()
            h._done = True
            dev._forget(h)

    def release(self) -> None:
        """Releases every element in one device call; a second call is a no-op."""
        if self._done:
            return
        dev = self._dev
        if dev._handles or self._hmap:
            with dev._lock:
                if self.released:  # by another thread meanwhile
                    return
                self._end_handles()
                self._done = True
        else:
            self._done = True  # published before the registry is read again
            if dev._handles:  # an element was taken meanwhile
                with dev._lock:
                    try:
                        self._end_handles()
                    except ViewInUse:
                        self._done = False
                        raise
        self._c_release()

    close = release

    def _c_release(self) -> None:
        ptr = self._dev._ptr
        sess = self._sess
        if ptr is None or (sess is not None and sess._closed):
            return  # closing the device or the session released everything
        # Elements released through another route answer -ESTALE, elements
        # never issued -EINVAL: both mean there is nothing left to release.
        try:
            _ll.release_batch(ptr, 0 if sess is None else sess._sid, self._hs, self._n, self._res)
        except Cancelled:  # close() raced us: all released
            return

    _warn = staticmethod(warnings.warn)
    _Error = ChmError

    def __del__(self) -> None:
        if self._done or not self.issued:
            return
        try:
            self._done = True
            self._c_release()
        except (self._Error, AttributeError, TypeError):
            return
        self._warn(
            f"unreleased chm batch of {self._n} handles of {self._dev!r}: released by the "
            "garbage collector (release it, or use 'with dev.prefetch_batch(...) as b')",
            ResourceWarning,
            source=self,
        )

    @property
    def released(self) -> bool:
        return self._done

    def __enter__(self) -> HandleBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._done else "held"
        return f"<chm.HandleBatch {self.issued}/{self._n} issued {state}>"


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

    def __init__(self, dev: Device, quota: int | None = None) -> None:
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
    def device(self) -> Device:
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


def _flock_holder(path: str) -> str:
    """Who holds a flock on path ('pid N', from /proc/locks), or a hint."""
    try:
        ino = os.stat(path).st_ino
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].endswith(f":{ino}"):
                    return f"pid {parts[4]}"
    except (OSError, ValueError):
        pass
    return "an unknown process"


def _lock_targets(paths: Sequence[str], fds: dict[str, int]) -> None:
    """Takes exclusive non-blocking flocks on the regular-file targets not in fds.

    A second embedded opener of the same backing file (in this process or
    another) gets Busy naming the path and the holder, instead of two
    devices sharing a file with private caches. Block devices are opened
    O_EXCL by the C core instead.
    """
    new: list[int] = []
    try:
        for p in paths:
            if p in fds:
                continue
            # Only regular files are locked here, and only they are opened:
            # opening a FIFO for reading would block until a writer came, a
            # character device may act on open. The C core refuses those,
            # naming the path and what it is; a path this process may not
            # reach (missing, unsearchable directory) it reports likewise.
            try:
                if not stat.S_ISREG(os.stat(p).st_mode):
                    continue
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError:
                continue
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
                os.close(fd)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                err = Busy(
                    errno.EBUSY,
                    f"target {p}: already open by {_flock_holder(p)} (one device per backing "
                    "file; close the other first)",
                    call="chm_dev_open",
                )
                err.filename = p
                raise err from None
            fds[p] = fd
            new.append(fd)
    except BaseException:
        for fd in new:
            os.close(fd)
        raise


def _unlock(fds: dict[str, int]) -> None:
    while fds:
        os.close(fds.popitem()[1])


def _scratch_dir() -> ScratchDir:
    """A fresh scratch directory for a device opened without targets; a
    parent this process may not write is a ChmError (PermissionDenied for
    EACCES) naming it and what to do, not a bare OSError."""
    parent = _default_tmp_parent()
    try:
        return ScratchDir(parent)
    except ChmError:
        raise
    except OSError as exc:
        code = exc.errno or errno.EIO
        where = parent if parent is not None else tempfile.gettempdir()
        err = error_for(code)(
            code,
            f"scratch backing file under {where} (CHM_TMPDIR or the system temporary "
            f"directory): {exc.strerror}; set CHM_TMPDIR to a directory this process "
            "may write, or pass targets",
            call="Device",
        )
        err.filename = exc.filename if exc.filename is not None else where
        raise err from exc


def _default_tmp_parent() -> str | None:
    env = os.environ.get("CHM_TMPDIR")
    if env:
        return env
    return None


class Device:
    """An embedded chm device (the C core, in this process).

    ``Device(config)`` opens a device from a :class:`chm.Config`;
    :meth:`Device.open` builds the config from keywords. When the config names
    no targets, a sparse backing file is created in a fresh temporary
    directory (``chm-<pid>-*`` under ``CHM_TMPDIR`` or the system temporary
    directory) that is deleted when the device closes; opening one first
    removes those left by processes that died without closing (see
    :mod:`chm._scratch`). The ghost backend needs none. Every method is
    thread-safe; none may be called once ``close()`` has begun.
    """

    def __init__(self, config: Config | None = None, /, **options: Any) -> None:
        self._ptr: Any = None
        # token -> the live Handle of that token (weakly: a dropped Handle is
        # finalised, and released, as usual)
        self._handles: dict[int, weakref.ref[Handle]] = {}
        self._tmpdir: str | None = None
        self._cleanup: weakref.finalize[Any, Any] | None = None
        self._locks: dict[str, int] = {}  # target path -> fd holding its flock
        # Reentrant: a Handle finaliser may run in a thread inside a locked section.
        self._lock = threading.RLock()
        cfg = config.copy() if config is not None else Config()
        if options:
            cfg.update(options)
        if int(cfg.cdata.n_targets) == 0 and cfg.backend != "ghost":
            scratch = _scratch_dir()
            self._tmpdir = scratch.path
            self._cleanup = weakref.finalize(self, scratch.remove)
            try:
                cfg.set("targets", [str(Path(scratch.path) / "target0.img")])
                cfg.set("create", True)
            except BaseException:
                self._cleanup()
                raise
        try:
            cfg.validate()
            targets = list(cfg.to_dict()["targets"])
            _lock_targets(targets, self._locks)
            # a Device collected without close() gives its locks back too
            weakref.finalize(self, _unlock, self._locks)
            try:
                self._ptr = open_device(cfg)
                _lock_targets(targets, self._locks)  # the files this open created
            except BaseException:
                if self._ptr is not None:
                    _ll.dev_shutdown(self._ptr)
                    self._ptr = None
                _unlock(self._locks)
                raise
        except BaseException:
            if self._cleanup is not None:
                self._cleanup()
            raise
        self._config = Config._from_cdata(_ll.dev_config(self._ptr))
        self._capacity = self._config.capacity

    @classmethod
    def open(
        cls,
        targets: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        capacity: int | str = "64G",
        dram: int | str | None = None,
        backend: str | None = None,
        mode: str = "prefetch",
        **options: Any,
    ) -> Device:
        """Opens a device from keywords (any option of :func:`chm.config.options`).

        ``targets`` is a path or a list of paths, used as they are: with
        ``create=True`` a missing file is created (mode 0600, sparse) and a
        short one extended, else that is NotFound / NoSpace naming the path
        and sizes. ``None`` uses a file created in a temporary directory.
        ``backend`` None (or ``"auto"``) is uring when this host allows
        io_uring, else pread; ``dev.backend`` says which (see
        :mod:`chm.backend`).
        """
        cfg = Config(capacity=capacity, backend=backend, mode=mode)
        if dram is not None:  # else the device default (chm-emu options)
            cfg.set("dram", dram)
        if targets is not None:
            if isinstance(targets, (str, os.PathLike)):
                targets = [targets]
            cfg.set("targets", [os.fspath(t) for t in targets])
        if options:
            cfg.update(options)
        return cls(cfg)

    # -- lifecycle

    def close(self) -> None:
        """Closes the device (idempotent).

        Outstanding prefetches are cancelled and their views end. Raises
        ViewInUse, leaving the device open, while any staged view is still
        exported by something else (e.g. a numpy array).

        Writes not yet flushed are written back first, best effort (failed
        write-backs are retried for up to 10 s). Those that still fail are
        dropped, and once the device is fully closed this raises NoSpace
        (the backing's filesystem is full) or DeviceIOError naming the
        target file, the bytes lost and that they were written but never
        flushed. :meth:`flush` first to find out while the data is still
        held.
        """
        lost = self._close()
        if lost is not None:
            raise lost

    def _close(self) -> ChmError | None:
        """close(), returning (not raising) the error reporting writes the
        final flush dropped."""
        with self._lock:
            ptr = self._ptr
            if ptr is None:
                return None
            held = [h for h in self._live_handles() if h._view() is not None]
            for h in held:  # all or nothing: refuse before ending any view
                if h._exported():
                    raise h._in_use()
            for h in held:
                h._end_view()
            self._ptr = None
        # Shut down, don't free: a thread that read the pointer just before
        # gets -ECANCELED from the still-valid struct, which the pointer's
        # destructor frees once the last reference is gone.
        _ll.dev_shutdown(ptr)
        lost: ChmError | None = None
        try:
            _ll.dev_lost(ptr)
        except ChmError as exc:  # raised once everything is closed
            lost = exc
        del ptr
        _unlock(self._locks)
        if self._cleanup is not None:
            self._cleanup()
        return lost

    def _live_handles(self) -> list[Handle]:
        refs = list(self._handles.values())
        return [h for h in (r() for r in refs) if h is not None]

    def _forget(self, h: Handle) -> None:
        """Drops h from the token registry (caller holds the lock)."""
        ref = self._handles.get(h.token)
        if ref is not None and ref() in (h, None):
            del self._handles[h.token]

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def __enter__(self) -> Device:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        lost = self._close()
        if lost is None:
            return
        if exc is None:
            raise lost
        # the exception already propagating is the one to see; the loss
        # must not pass unreported either
        _log.error("%s", lost)

    def _p(self, what: str) -> Any:
        ptr = self._ptr
        if ptr is None:
            raise _closed_error(what)
        return ptr

    # -- prefetch

    def prefetch(
        self, addr: int, length: int, *, noqueue: bool = False, retain: bool = False
    ) -> Handle:
        """Issues a prefetch of ``[addr, addr+length)``; never blocks.

        Alignment: none. Any ``addr`` and any ``length`` from 1 to
        ``slot_size`` bytes; the fill is widened to 4096-byte boundaries
        inside the device. With ``retain`` and a resident region (the
        ``resident`` option), the object stays in device DRAM after release,
        so a later prefetch it covers is staged at once with no SSD read
        (``Stats.resident_hits``); which objects to retain is the caller's
        policy (:mod:`chm.kv.residency`).

        Raises InvalidArgument (length 0, larger than a slot, beyond capacity,
        a bool for addr or length), WouldBlock (refill queue full, or no free
        slot with ``noqueue``), NotSupported (direct mode), Cancelled (closed),
        TypeError (addr or length not an integer).
        """
        ptr = self._ptr
        if ptr is None:
            raise _closed_error("chm_prefetch_object")
        h = Handle(self, _prefetch(ptr, addr, length, _pf_flags(noqueue, retain)))
        self._handles[h.token] = _ref(h)
        return h

    def prefetch_many(
        self,
        addrs: Sequence[int],
        lengths: Sequence[int],
        *,
        noqueue: bool = False,
        retain: bool = False,
    ) -> list[Handle | ChmError]:
        """Issues one prefetch per ``(addrs[i], lengths[i])`` in one call;
        never blocks. Returns, in order, a Handle for each object issued and,
        for each one refused, the exception :meth:`prefetch` would have raised
        for it (not raised: the others are issued regardless). The handles
        follow the rules of :meth:`prefetch`'s. Raises InvalidArgument only for
        the call as a whole (lengths of the sequences differ, more than
        CHM_BATCH_MAX elements, a bool or negative value), Cancelled (closed).
        :meth:`prefetch_batch` does the same with no Python object per element.

        Alignment: none, as for :meth:`prefetch`.
        """
        return self._prefetch_many(None, addrs, lengths, _pf_flags(noqueue, retain))

    def _prefetch_many(
        self,
        sess: Session | None,
        addrs: Sequence[int],
        lengths: Sequence[int],
        flags: int,
    ) -> list[Handle | ChmError]:
        if sess is None:
            call = "chm_prefetch_objects"
            toks, res = _ll.prefetch_objects(self._p(call), addrs, lengths, flags)
        else:
            call = "chm_session_prefetch"
            ptr = sess._p(call)
            toks, res = _ll.session_prefetch(ptr, sess._sid, addrs, lengths, flags)
        out: list[Handle | ChmError] = [Handle(self, tok, sess) for tok in toks]
        if any(res):  # refused elements: their exceptions instead
            for i, rc in enumerate(res):
                if rc:
                    args = f"addr={addrs[i]:#x}, len={lengths[i]}"
                    out[i] = _ll.status_error(rc, call, args)
            self._handles.update((h.token, _ref(h)) for h in out if isinstance(h, Handle))
        else:
            self._handles.update((h.token, _ref(h)) for h in out)  # type: ignore[union-attr,arg-type]
        return out

    def prefetch_batch(
        self,
        addrs: Sequence[int],
        lengths: Sequence[int],
        *,
        noqueue: bool = False,
        retain: bool = False,
    ) -> HandleBatch:
        """Issues one prefetch per ``(addrs[i], lengths[i])`` in one call, as
        :meth:`prefetch_many` does, and returns them as one
        :class:`HandleBatch` (per-element statuses, Handles made only when
        asked for, one call to release them all). Raises what
        :meth:`prefetch_many` raises for the call as a whole.

        Alignment: none, as for :meth:`prefetch`.
        """
        return self._prefetch_batch(None, addrs, lengths, _pf_flags(noqueue, retain))

    def _prefetch_batch(
        self,
        sess: Session | None,
        addrs: Sequence[int],
        lengths: Sequence[int],
        flags: int,
    ) -> HandleBatch:
        call = "chm_session_prefetch"
        if sess is None:
            ptr = self._ptr
            if ptr is None:
                raise _closed_error(call)
            sid = 0
        else:
            ptr = sess._p(call)
            sid = sess._sid
        hs, res, ok = _ll.prefetch_batch(ptr, sid, addrs, lengths, flags)
        return HandleBatch(self, sess, hs, res, len(addrs), ok)

    def session(self, quota: int | None = None) -> Session:
        """Opens a :class:`Session`: a scope of handles that holds at most
        ``quota`` request entries at once (None: no limit but the device's).
        Raises InvalidArgument (quota 0, not an int), NoSpace
        (``chm._lowlevel.SESSION_MAX`` sessions open), Cancelled (closed)."""
        return Session(self, quota)

    def release_many(self, handles: Sequence[Handle]) -> list[ChmError | None]:
        """Releases several handles in one device call. Returns, in order,
        None for each released (or already released) handle and the exception
        :meth:`Handle.release` would have raised otherwise; a handle whose view
        is still exported gets ViewInUse and keeps its slot, as there; a
        handle of a :class:`Session` gets InvalidArgument (release it there)."""
        return self._release_many(None, handles)

    def _release_many(
        self, sess: Session | None, handles: Sequence[Handle]
    ) -> list[ChmError | None]:
        out: list[ChmError | None] = [None] * len(handles)
        toks: list[int] = []
        where: list[int] = []
        reg_pop = self._handles.pop
        tok_add, where_add = toks.append, where.append
        with self._lock:
            for i, h in enumerate(handles):
                if h._dev is self and h._sess is sess and not h._done and h._buf is None:
                    h._done = True  # no view: the usual
                    reg_pop(h.token, None)
                    tok_add(h.token)
                    where_add(i)
                    continue
                if h._dev is not self:
                    out[i] = InvalidArgument(None, f"{h!r} belongs to another device")
                    continue
                if h._sess is not sess:
                    out[i] = InvalidArgument(None, f"{h!r} belongs to another session")
                    continue
                if h._done:
                    continue
                if h._buf is not None and h._buf() is not None:
                    try:
                        h._end_view()
                    except ViewInUse as e:
                        out[i] = e
                        continue
                h._done = True
                self._handles.pop(h.token, None)
                toks.append(h.token)
                where.append(i)
        ptr = self._ptr
        if ptr is None or not toks or (sess is not None and sess._closed):
            return out  # a closed device or session released everything
        try:
            if sess is None:
                res = _ll.prefetch_release_many(ptr, toks)
            else:
                res = _ll.session_release(ptr, sess._sid, toks)
        except Cancelled:
            return out  # close() raced us: all released
        for i, rc in zip(where, res, strict=True):
            if rc < 0 and rc != -errno.ECANCELED:
                out[i] = _ll.status_error(rc, "chm_prefetch_release_many", f"h={toks[0]:#x}")
        return out

    def write_many(self, addrs: Sequence[int], datas: Sequence[Any]) -> list[bool | ChmError]:
        """Offers several objects for writing in one call. Returns, in order,
        True (admitted), False (skipped) or the exception :meth:`write` would
        have raised for that object.

        Alignment: as for :meth:`write`: each ``addrs[i]`` and
        ``len(datas[i])`` a multiple of 512 bytes (``CHM_IO_ALIGN``), else
        that element is InvalidArgument saying which.
        """
        rcs = _ll.write_objects(self._p("chm_write_objects"), addrs, datas)
        out: list[bool | ChmError] = []
        for i, rc in enumerate(rcs):
            if rc < 0:
                args = f"addr={addrs[i]:#x}, len={len(datas[i])}"
                out.append(_ll.status_error(rc, "chm_write_objects", args))
            else:
                out.append(rc != _ll.WRITE_SKIPPED)
        return out

    def adopt(self, token: int) -> Handle:
        """The Handle of a raw token (e.g. received from a client).

        A token that has a live, unreleased Handle in this process gives that
        very Handle, so one slot never has two Handles (whose releases could
        free it under the other's view). Otherwise a new Handle is made, which
        owns the slot like any other: release it (or it is released, with a
        ResourceWarning, when garbage-collected). Nothing is checked here; the
        device validates the token on use.
        """
        if isinstance(token, bool):
            raise InvalidArgument(None, f"a handle token is an int, not {token!r}")
        try:
            value = operator.index(token)
        except TypeError:
            raise InvalidArgument(None, f"a handle token is an int, not {token!r}") from None
        with self._lock:
            ref = self._handles.get(value)
            h = ref() if ref is not None else None
            if h is None or h._done:
                h = Handle(self, value)
                self._handles[value] = _ref(h)
            return h

    def view_info(self, handle: Handle, timeout: float | None = 0) -> tuple[int, int, int]:
        """``(dev_addr, length, pool_offset)`` of a staged handle's view, asked
        of the device again (a wait of up to ``timeout`` seconds: by default
        it polls), not of the cached memoryview; no view is made.
        ``pool_offset`` is the view's offset in the DRAM pool (``2**64-1`` for
        lru-mode views, which are host copies). Raises what
        :meth:`Handle.wait` raises (WaitTimeout while not staged).

        Alignment: not applicable (no address is given).
        """
        if handle._dev is not self:
            raise InvalidArgument(None, f"{handle!r} belongs to another device")
        tns = timeout_ns(timeout)
        sess = handle._sess
        if sess is None:
            info = _ll.prefetch_wait(self._p("chm_prefetch_wait"), handle.token, tns)
        else:
            info = _ll.session_wait(sess._p("chm_session_wait"), sess._sid, handle.token, tns)
        return info.dev_addr, info.length, info.pool_offset

    # -- data path

    def read(self, addr: int, length: int) -> bytes:
        """Reads ``length`` bytes at ``addr`` (DRAM hit when staged, else SSD).

        Alignment: none. Any ``addr`` and any ``length`` of at least 1 byte
        inside the capacity.

        Raises InvalidArgument (length 0, beyond the capacity, a bool),
        DeviceIOError (a backing read failed), Cancelled (closed).
        """
        ptr = self._p("chm_read")
        n: object = length  # any integer type; others fail in the C call
        if isinstance(n, numbers.Integral) and int(n) > self._capacity:
            # refuse before allocating a host buffer for it
            why = f"read: len {length} is longer than the device ({self._capacity} bytes)"
            what = f"chm_read(addr={addr}, len={length}): {why}"
            raise InvalidArgument(None, what, call="chm_read", detail=why)
        return _ll.read(ptr, addr, length)

    def read_into(self, addr: int, buf: Any) -> int:
        """Reads ``len(buf)`` bytes at ``addr`` into a writable buffer.

        Alignment: none, as for :meth:`read`.
        """
        return _ll.read_into(self._p("chm_read"), addr, buf)

    def write(self, addr: int, data: Any) -> bool:
        """Offers an object for writing; True if admitted, False if skipped.

        Alignment: ``addr`` and ``len(data)`` must be multiples of 512 bytes
        (``CHM_IO_ALIGN``, the direct-I/O granularity, or a block-device
        target's larger logical block size); otherwise InvalidArgument
        saying which, e.g. "write: addr 0x7b is not a multiple of 512
        (CHM_IO_ALIGN)". Reads and prefetches have no such rule.
        """
        rc = _ll.write_object(self._p("chm_write_object"), addr, data, 0)
        return rc != _ll.WRITE_SKIPPED

    def write_length(self, addr: int, length: int) -> bool:
        """Offers ``length`` bytes at ``addr`` with no payload; True if admitted.

        The ghost backend only (no data moves there, so the write costs the
        model's time and O(1) host time whatever its size); InvalidArgument on
        a backend that moves data.

        Alignment: ``addr`` and ``length`` must be multiples of 512 bytes
        (``CHM_IO_ALIGN``), as for :meth:`write`; otherwise InvalidArgument.
        """
        if self._config.backend != "ghost":
            raise InvalidArgument(
                None,
                f"write_length(addr={addr}, len={length}): a write without a payload "
                f"needs the ghost backend, not {self._config.backend!r}",
                call="chm_write_object",
            )
        rc = _ll.write_length(self._p("chm_write_object"), addr, length)
        return rc != _ll.WRITE_SKIPPED

    def clock_ns(self) -> int:
        """The device clock in ns (simulated in virtual time, else since open).

        A lock-free read: much cheaper than ``stats().clock_now_ns``.
        """
        return _ll.clock_ns(self._p("chm_clock_ns"))

    def advance_clock(self, t_ns: int) -> None:
        """Virtual time: moves the simulated clock forward to ``t_ns``.

        A time in the past changes nothing. The write buffer's flusher runs up
        to the new time, so idle gaps drain it. Unsupported (NotSupported) with
        ``clock="real"``.
        """
        _ll.advance_clock(self._p("chm_advance_clock"), t_ns)

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every admitted write is durable (WaitTimeout after ``timeout``)."""
        _ll.flush(self._p("chm_flush"), timeout_ns(timeout))

    # -- introspection

    def resident_evict(self, addr: int, length: int) -> int:
        """Drops the resident entries overlapping ``[addr, addr+length)``
        (one with a view out when its handles are released); returns how
        many. 0 on a device without a resident region. Raises
        InvalidArgument (length 0, beyond capacity), Cancelled (closed).

        Alignment: none. Any ``addr`` and any ``length`` from 1 to the end
        of the device; every entry the range touches is dropped."""
        return _ll.resident_evict(self._p("chm_resident_evict"), addr, length)

    def stats(self) -> Stats:
        """The device counters, read without waiting for the device: each
        field is exact, but fields are not one atomic cut while calls run
        (they agree once the device is quiet)."""
        return Stats.from_dict(_ll.stats(self._p("chm_stats")))

    @property
    def config(self) -> Config:
        """The effective configuration (derived fields filled in)."""
        return self._config.copy()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def backend(self) -> str:
        return self._config.backend

    @property
    def mode(self) -> str:
        return self._config.mode

    @property
    def slot_bytes(self) -> int:
        return self._config.slot_bytes

    @property
    def tmpdir(self) -> str | None:
        """The temporary directory holding the backing files, if one was made."""
        return self._tmpdir

    def pool_fd(self) -> int:
        """The DRAM pool's memfd (pool="memfd" only; owned by the device)."""
        return _ll.dev_pool_fd(self._p("chm_dev_pool_fd"))

    def inject_fault(self, kind: str | int, nth: int = 1, arg: int = 0) -> None:
        """Arms a backend fault: ``eio_read``, ``eio_write``, ``short_read``, ``slow``, ``none``."""
        if isinstance(kind, str):
            try:
                code = _ll.FAULTS[kind]
            except KeyError:
                raise InvalidArgument(
                    None, f"unknown fault {kind!r}; valid: {', '.join(_ll.FAULTS)}"
                ) from None
        else:
            try:
                if isinstance(kind, bool):
                    raise TypeError
                code = operator.index(kind)
            except TypeError:
                raise InvalidArgument(
                    None, f"a fault kind is a name or an int, not {kind!r}"
                ) from None
        _ll.fault_inject(self._p("chm_fault_inject"), code, nth, arg)

    def __repr__(self) -> str:
        state = "closed" if self._ptr is None else "open"
        return (
            f"<chm.Device {state} capacity={self._capacity} backend={self.backend} "
            f"mode={self.mode}>"
        )
