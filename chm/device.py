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
import numbers
import operator
import os
import stat
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
from chm.errors import Busy, Cancelled, ChmError, InvalidArgument, StaleHandle, ViewInUse
from chm.stats import Stats

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["Device", "Handle", "timeout_ns"]

_FOREVER = _ll.UINT64_MAX
_prefetch = _ll.prefetch_object
_wait_buffer = _ll.prefetch_wait_buffer
_release = _ll.prefetch_release
_NOQUEUE = _ll.PF_NOQUEUE
_ref = weakref.ref


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
    return Cancelled(None, f"{what}: device is closed", call=what)


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
    # reference to the memoryview wait() handed out; _done: released.
    __slots__ = ("__weakref__", "_buf", "_dev", "_done", "_mv", "token")

    def __init__(self, dev: Device, token: int) -> None:
        self._dev = dev
        self.token = token
        self._done = False
        self._mv: weakref.ref[memoryview] | None = None
        self._buf: weakref.ref[_ll.ReadOnlyBuffer] | None = None

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
            new = _wait_buffer(ptr, self.token, tns, self)
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
                        _release(ptr, self.token)
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
                _release(ptr, self.token)

    close = release

    # Finalisation runs in whatever thread drops the last reference or runs
    # the collector, possibly one inside a device-lock section (the lock is
    # reentrant) and at interpreter exit: it uses only what the instance and
    # its class hold, and never raises but for the warning.
    _warn = staticmethod(warnings.warn)
    _Error = ChmError

    def __del__(self) -> None:
        if self._done:
            return
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
            _release(ptr, self.token)
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
            try:
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # the C core reports it (or creates it)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
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
            scratch = ScratchDir(_default_tmp_parent())
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
        """
        with self._lock:
            ptr = self._ptr
            if ptr is None:
                return
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
        del ptr
        _unlock(self._locks)
        if self._cleanup is not None:
            self._cleanup()

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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _p(self, what: str) -> Any:
        ptr = self._ptr
        if ptr is None:
            raise _closed_error(what)
        return ptr

    # -- prefetch

    def prefetch(self, addr: int, length: int, *, noqueue: bool = False) -> Handle:
        """Issues a prefetch of ``[addr, addr+length)``; never blocks.

        Any ``addr`` and ``length`` (no alignment needed): the fill is widened
        to 4096-byte boundaries inside the device.

        Raises InvalidArgument (length 0, larger than a slot, beyond capacity,
        a bool for addr or length), WouldBlock (refill queue full, or no free
        slot with ``noqueue``), NotSupported (direct mode), Cancelled (closed),
        TypeError (addr or length not an integer).
        """
        ptr = self._ptr
        if ptr is None:
            raise _closed_error("chm_prefetch_object")
        try:
            h = Handle(self, _prefetch(ptr, addr, length, _NOQUEUE if noqueue else 0))
        except InvalidArgument:
            big = self._too_big("prefetch", length)
            if big is not None:
                raise big from None
            raise
        self._handles[h.token] = _ref(h)
        return h

    def _too_big(self, what: str, length: object) -> InvalidArgument | None:
        """The configuration error for an object no slot or write buffer can take."""
        if not isinstance(length, int) or isinstance(length, bool):
            return None
        cfg = self._config
        if what == "prefetch" and cfg.mode != "direct" and length > cfg.slot_bytes:
            limit, opt = cfg.slot_bytes, "slot_size"
        elif what == "write" and cfg.mode == "prefetch" and length > cfg.wbuf_bytes:
            limit, opt = cfg.wbuf_bytes, "wbuf"
        else:
            return None
        call = "chm_prefetch_object" if what == "prefetch" else "chm_write_object"
        return InvalidArgument(
            None,
            f"{what} of a {length}-byte object: larger than {opt}={limit} bytes, so "
            f"it can never succeed (a configuration error); open the device with "
            f"{opt} >= {length}, or object_size={length} to size the defaults",
            call=call,
        )

    def prefetch_many(
        self, addrs: Sequence[int], lengths: Sequence[int], *, noqueue: bool = False
    ) -> list[Handle | ChmError]:
        """Issues one prefetch per ``(addrs[i], lengths[i])`` in one call;
        never blocks. Returns, in order, a Handle for each object issued and,
        for each one refused, the exception :meth:`prefetch` would have raised
        for it (not raised: the others are issued regardless). The handles
        follow the rules of :meth:`prefetch`'s. Raises InvalidArgument only for
        the call as a whole (lengths of the sequences differ, more than
        CHM_BATCH_MAX elements, a bool or negative value), Cancelled (closed).
        """
        ptr = self._ptr
        if ptr is None:
            raise _closed_error("chm_prefetch_objects")
        toks, res = _ll.prefetch_objects(ptr, addrs, lengths, _NOQUEUE if noqueue else 0)
        out: list[Handle | ChmError] = [Handle(self, tok) for tok in toks]
        if any(res):  # refused elements: their exceptions instead
            for i, rc in enumerate(res):
                if rc:
                    args = f"addr={addrs[i]:#x}, len={lengths[i]}"
                    out[i] = _ll.status_error(rc, "chm_prefetch_objects", args)
            self._handles.update((h.token, _ref(h)) for h in out if isinstance(h, Handle))
        else:
            self._handles.update((h.token, _ref(h)) for h in out)  # type: ignore[union-attr,arg-type]
        return out

    def release_many(self, handles: Sequence[Handle]) -> list[ChmError | None]:
        """Releases several handles in one device call. Returns, in order,
        None for each released (or already released) handle and the exception
        :meth:`Handle.release` would have raised otherwise; a handle whose view
        is still exported gets ViewInUse and keeps its slot, as there."""
        out: list[ChmError | None] = [None] * len(handles)
        toks: list[int] = []
        where: list[int] = []
        reg_pop = self._handles.pop
        tok_add, where_add = toks.append, where.append
        with self._lock:
            for i, h in enumerate(handles):
                if h._dev is self and not h._done and h._buf is None:  # no view: the usual
                    h._done = True
                    reg_pop(h.token, None)
                    tok_add(h.token)
                    where_add(i)
                    continue
                if h._dev is not self:
                    out[i] = InvalidArgument(None, f"{h!r} belongs to another device")
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
        if ptr is None or not toks:
            return out  # a closed device released everything
        try:
            res = _ll.prefetch_release_many(ptr, toks)
        except Cancelled:
            return out  # close() raced us: all released
        for i, rc in zip(where, res, strict=True):
            if rc < 0 and rc != -errno.ECANCELED:
                out[i] = _ll.status_error(rc, "chm_prefetch_release_many", f"h={toks[0]:#x}")
        return out

    def write_many(self, addrs: Sequence[int], datas: Sequence[Any]) -> list[bool | ChmError]:
        """Offers several objects for writing in one call. Returns, in order,
        True (admitted), False (skipped) or the exception :meth:`write` would
        have raised for that object (e.g. InvalidArgument when its address or
        length is not a multiple of 512 bytes, CHM_IO_ALIGN)."""
        rcs = _ll.write_objects(self._p("chm_write_objects"), addrs, datas)
        out: list[bool | ChmError] = []
        for i, rc in enumerate(rcs):
            if rc < 0:
                n = len(datas[i])
                big = self._too_big("write", n) if rc == -errno.EINVAL else None
                args = f"addr={addrs[i]:#x}, len={n}"
                out.append(big or _ll.status_error(rc, "chm_write_objects", args))
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

    # -- data path

    def read(self, addr: int, length: int) -> bytes:
        """Reads ``length`` bytes at ``addr`` (DRAM hit when staged, else SSD).

        Any ``addr`` and ``length`` (no alignment needed).
        """
        ptr = self._p("chm_read")
        n: object = length  # any integer type; others fail in the C call
        if isinstance(n, numbers.Integral) and int(n) > self._capacity:
            # refuse before allocating a host buffer for it
            what = f"chm_read(addr={addr}, len={length}): longer than the device"
            raise InvalidArgument(None, what, call="chm_read")
        return _ll.read(ptr, addr, length)

    def read_into(self, addr: int, buf: Any) -> int:
        """Reads ``len(buf)`` bytes at ``addr`` into a writable buffer.

        Any ``addr`` and length (no alignment needed).
        """
        return _ll.read_into(self._p("chm_read"), addr, buf)

    def write(self, addr: int, data: Any) -> bool:
        """Offers an object for writing; True if admitted, False if skipped.

        ``addr`` and ``len(data)`` must be multiples of 512 bytes (the
        direct-I/O granularity, ``chm._lowlevel.IO_ALIGN``); otherwise
        InvalidArgument. Reads and prefetches have no such rule.
        """
        try:
            rc = _ll.write_object(self._p("chm_write_object"), addr, data, 0)
        except InvalidArgument:
            big = self._too_big("write", memoryview(data).nbytes if data is not None else 0)
            if big is not None:
                raise big from None
            raise
        return rc != _ll.WRITE_SKIPPED

    def write_length(self, addr: int, length: int) -> bool:
        """Offers ``length`` bytes at ``addr`` with no payload; True if admitted.

        The ghost backend only (no data moves there, so the write costs the
        model's time and O(1) host time whatever its size); InvalidArgument on
        a backend that moves data. Alignment as :meth:`write`.
        """
        if self._config.backend != "ghost":
            raise InvalidArgument(
                None,
                f"write_length(addr={addr}, len={length}): a write without a payload "
                f"needs the ghost backend, not {self._config.backend!r}",
                call="chm_write_object",
            )
        try:
            rc = _ll.write_length(self._p("chm_write_object"), addr, length)
        except InvalidArgument:
            big = self._too_big("write", length)
            if big is not None:
                raise big from None
            raise
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

    def stats(self) -> Stats:
        """A consistent snapshot of the device counters."""
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
