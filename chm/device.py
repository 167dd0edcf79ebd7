"""The embedded device: ``chm.Device`` and its prefetch ``Handle``.

    with chm.Device.open(capacity="64G", backend="pread") as dev:
        with dev.prefetch(addr, 16 << 20) as h:
            view = h.wait()          # read-only memoryview into device DRAM
            arr = h.array("f2")      # numpy array over the same bytes
            ...                      # drop views before the block ends

Views are zero-copy windows into the device's DRAM pool. They are valid
only until their handle is released (or the device closed): a released
``memoryview`` raises ``ValueError`` on use. Releasing a handle while
something still views its memory (a numpy array from ``h.array()``, a slice
of the view, ...) raises :class:`chm.errors.ViewInUse` and keeps the slot
held, so memory that is still viewed is never reused. Timeouts are seconds
(float); ``None`` waits forever.
"""

from __future__ import annotations

import contextlib
import numbers
import operator
import os
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chm import _lowlevel as _ll
from chm.config import Config
from chm.errors import Cancelled, InvalidArgument, ViewInUse
from chm.stats import Stats

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["Device", "Handle", "timeout_ns"]

_FOREVER = _ll.UINT64_MAX
_getrefcount = sys.getrefcount
_prefetch = _ll.prefetch_object
_wait_buffer = _ll.prefetch_wait_buffer
_release = _ll.prefetch_release
_NOQUEUE = _ll.PF_NOQUEUE


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
    using it on another device, is an error there).
    """

    # _buf is the buffer object over the slot while the handle holds a view
    # (None before wait() and after release); _mv is the memoryview handed
    # out over _buf (None when there is none) or False once released.
    __slots__ = ("_buf", "_dev", "_mv", "token")

    def __init__(self, dev: Device, token: int) -> None:
        self._dev = dev
        self.token = token
        self._mv: memoryview | bool | None = None
        self._buf: Any = None

    # -- staging

    def wait(self, timeout: float | None = None) -> memoryview:
        """Blocks until the object is staged; returns a read-only memoryview.

        Waiting again returns the same view (or a new one over the same bytes
        if that one was released, e.g. by ``with h.wait() as v:``). Raises
        WaitTimeout when not staged within ``timeout`` seconds (``0`` polls),
        DeviceIOError when the fill failed (release the handle), StaleHandle
        after release, InvalidArgument for a handle of another device,
        Cancelled when the device is closed.
        """
        mv = self._mv
        if mv is not None and mv is not False:
            try:
                if mv:  # staged objects are never empty; raises if released
                    return mv  # type: ignore[return-value]
            except ValueError:
                pass
        if self._buf is None:
            dev = self._dev
            ptr = dev._ptr
            if ptr is None:
                raise _closed_error("chm_prefetch_wait")
            tns = _FOREVER if timeout is None else timeout_ns(timeout)
            buf = _wait_buffer(ptr, self.token, tns)
            # Registering is atomic with close()'s check: a view is either
            # known to close() (which then refuses) or never handed out.
            with dev._lock:
                if dev._ptr is None:
                    raise _closed_error("chm_prefetch_wait")
                if self._buf is None:  # else another thread's wait won
                    self._buf = buf
                    dev._views.add(self)
        mv = self._mv = memoryview(self._buf).toreadonly()
        return mv

    def array(
        self, dtype: npt.DTypeLike = "u1", timeout: float | None = None
    ) -> np.ndarray[Any, Any]:
        """The staged bytes as a read-only numpy array (waits if needed).

        The array views device DRAM: drop it before releasing the handle
        (``release()`` raises ViewInUse while it is alive).
        """
        import numpy as np

        return np.frombuffer(self.wait(timeout), dtype=dtype)

    def ready(self) -> bool:
        """True when wait() would return at once (polls; never raises a timeout)."""
        if self._buf is not None:
            return True
        try:
            self.wait(0)
        except TimeoutError:
            return False
        return True

    # -- release

    def _buf_refs(self) -> int:
        return _getrefcount(self._buf)

    def _exported(self) -> bool:
        """True while something other than this handle's own memoryview
        (a slice, a numpy array, another memoryview) still uses the view."""
        if self._buf is None:
            return False
        mv = self._mv
        extra = 1 if mv is not None and mv is not False else 0
        return _getrefcount(self._buf) > _BUF_BASE_REFS + extra

    def _in_use(self) -> ViewInUse:
        return ViewInUse(
            None,
            f"handle {self.token:#x}: its view is still exported (slices, numpy arrays or "
            "memoryviews derived from it are alive); drop them first",
            call="release",
        )

    def _end_view(self) -> None:
        """Ends a held view; raises ViewInUse (nothing freed) if still exported."""
        if self._buf is None:
            return
        mv = self._mv
        if mv is not None and mv is not False:
            try:
                mv.release()  # type: ignore[union-attr]
            except BufferError:
                raise self._in_use() from None
            self._mv = None
        if self._exported():
            raise self._in_use()
        self._buf = None
        self._dev._views.discard(self)

    def release(self) -> None:
        """Releases the slot. A second call is a no-op.

        Raises ViewInUse (and keeps the slot held) while the view is still
        exported; StaleHandle if the token was already released through
        another route.
        """
        mv = self._mv
        if mv is False:
            return
        if self._buf is not None:
            # Inline copy of _end_view(): this is the hot path.
            if mv is not None:
                try:
                    mv.release()  # type: ignore[union-attr]
                except BufferError:
                    raise self._in_use() from None
                self._mv = None
            # Every slice, numpy array or memoryview derived from the view
            # keeps the exported buffer referenced; only ours may remain.
            if _getrefcount(self._buf) > _BUF_BASE_REFS:
                raise self._in_use()
            self._buf = None
            self._dev._views.discard(self)
        self._mv = False
        ptr = self._dev._ptr
        if ptr is not None:  # else closing the device released everything
            with contextlib.suppress(Cancelled):  # close() raced us: all released
                _release(ptr, self.token)

    close = release

    @property
    def released(self) -> bool:
        return self._mv is False

    @property
    def device(self) -> Device:
        return self._dev

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        mv = self._mv
        state = "released" if mv is False else ("held" if self._buf is not None else "issued")
        return f"<chm.Handle {self.token:#x} {state}>"


def _calibrate_refs() -> int:
    h = Handle.__new__(Handle)
    h._buf = bytearray(1)
    return h._buf_refs()


_BUF_BASE_REFS = _calibrate_refs()


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
    directory that is deleted when the device closes (the ghost backend needs
    none). Every method is thread-safe; none may be called once ``close()``
    has begun.
    """

    def __init__(self, config: Config | None = None, /, **options: Any) -> None:
        self._ptr: Any = None
        self._views: set[Handle] = set()  # handles holding a view
        self._tmpdir: str | None = None
        self._cleanup: weakref.finalize[Any, Any] | None = None
        self._lock = threading.Lock()
        cfg = config.copy() if config is not None else Config()
        if options:
            cfg.update(options)
        if int(cfg.cdata.n_targets) == 0 and cfg.backend != "ghost":
            tmp = tempfile.mkdtemp(prefix="chm-", dir=_default_tmp_parent())
            self._tmpdir = tmp
            self._cleanup = weakref.finalize(self, shutil.rmtree, tmp, ignore_errors=True)
            try:
                cfg.set("targets", [str(Path(tmp) / "target0.img")])
                cfg.set("create", True)
            except BaseException:
                self._cleanup()
                raise
        try:
            cfg.validate()
            self._ptr = _ll.dev_open(cfg.cdata)
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
        backend: str = "uring",
        mode: str = "prefetch",
        **options: Any,
    ) -> Device:
        """Opens a device from keywords (any option of :func:`chm.config.options`).

        ``targets`` is a path or a list of paths, used as they are: with
        ``create=True`` a missing file is created (mode 0600, sparse) and a
        short one extended, else that is NotFound / NoSpace naming the path
        and sizes. ``None`` uses a file created in a temporary directory.
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
            held = list(self._views)
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
        if self._cleanup is not None:
            self._cleanup()

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

        Raises InvalidArgument (length 0, larger than a slot, beyond capacity),
        WouldBlock (refill queue full, or no free slot with ``noqueue``),
        NotSupported (direct mode), Cancelled (closed).
        """
        ptr = self._ptr
        if ptr is None:
            raise _closed_error("chm_prefetch_object")
        return Handle(self, _prefetch(ptr, addr, length, _NOQUEUE if noqueue else 0))

    def adopt(self, token: int) -> Handle:
        """Wraps a raw handle token (e.g. received from a client) in a Handle.

        Nothing is checked here; the device validates the token on use.
        """
        try:
            value = operator.index(token)
        except TypeError:
            raise InvalidArgument(None, f"a handle token is an int, not {token!r}") from None
        return Handle(self, value)

    # -- data path

    def read(self, addr: int, length: int) -> bytes:
        """Reads ``length`` bytes at ``addr`` (DRAM hit when staged, else SSD)."""
        ptr = self._p("chm_read")
        n: object = length  # any integer type; others fail in the C call
        if isinstance(n, numbers.Integral) and int(n) > self._capacity:
            # refuse before allocating a host buffer for it
            what = f"chm_read(addr={addr}, len={length}): longer than the device"
            raise InvalidArgument(None, what, call="chm_read")
        return _ll.read(ptr, addr, length)

    def read_into(self, addr: int, buf: Any) -> int:
        """Reads ``len(buf)`` bytes at ``addr`` into a writable buffer."""
        return _ll.read_into(self._p("chm_read"), addr, buf)

    def write(self, addr: int, data: Any) -> bool:
        """Offers an object for writing; True if admitted, False if skipped.

        ``addr`` and ``len(data)`` must be multiples of 512 bytes.
        """
        rc = _ll.write_object(self._p("chm_write_object"), addr, data, 0)
        return rc != _ll.WRITE_SKIPPED

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
