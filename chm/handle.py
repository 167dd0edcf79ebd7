"""Prefetch handles: one issued prefetch (``Handle``) and a batch of them
(``HandleBatch``), with their views of device DRAM.

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
``None`` waits forever.

A handle sees its device through :class:`DeviceCore`, the few internals of
:class:`chm.device.Device` it shares (the C pointer, the lock, the handle
registry), so this module does not import the device's.
"""

from __future__ import annotations

import contextlib
import numbers
import operator
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from chm import _lowlevel as _ll
from chm.errors import Cancelled, ChmError, InvalidArgument, StaleHandle, ViewInUse

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["DeviceCore", "Handle", "HandleBatch", "SessionCore", "timeout_ns"]

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


class SessionCore(Protocol):
    """What a handle uses of the :class:`chm.session.Session` that issued it."""

    _sid: int
    _closed: bool

    def _p(self, what: str) -> Any: ...


class DeviceCore(Protocol):
    """What handles and sessions use of their :class:`chm.device.Device`.

    ``_ptr`` is the C device (None once closed); ``_lock`` guards the handle
    registry ``_handles`` (token -> the live Handle, weakly) and close.
    """

    _ptr: Any
    _lock: threading.RLock
    _handles: dict[int, weakref.ref[Handle]]

    def _p(self, what: str) -> Any: ...

    def _forget(self, h: Handle) -> None: ...

    def _live_handles(self) -> list[Handle]: ...


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

    def __init__(self, dev: DeviceCore, token: int, sess: SessionCore | None = None) -> None:
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
    def device(self) -> DeviceCore:
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
        self, dev: DeviceCore, sess: SessionCore | None, hs: Any, res: Any, n: int, issued: int
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
