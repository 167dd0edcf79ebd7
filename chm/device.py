"""The embedded device: ``chm.Device``.

    with chm.Device.open(capacity="64G", backend="pread") as dev:
        with dev.prefetch(addr, 16 << 20) as h:
            view = h.wait()          # read-only memoryview into device DRAM
            arr = h.array("f2")      # read-only numpy array over the same bytes
            ...                      # drop views before the block ends

Views are zero-copy, read-only windows into the device's DRAM pool, valid
until their handle is released; :mod:`chm.handle` says how they are kept
safe. Timeouts are seconds (float);
``None`` waits forever. Integer arguments refuse bools (InvalidArgument).

``Handle`` and ``HandleBatch`` are defined in :mod:`chm.handle`, ``Session``
in :mod:`chm.session` and the backing-file locks in :mod:`chm._backing`;
this module imports them (they see the device only through the protocols
there) and re-exports ``Handle``, ``HandleBatch``, ``Session`` and
``timeout_ns``.
"""

from __future__ import annotations

import errno
import logging
import numbers
import operator
import os
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chm import _lowlevel as _ll
from chm._backing import lock_targets, scratch_dir, unlock
from chm.backend import open_device
from chm.config import Config
from chm.errors import Cancelled, ChmError, InvalidArgument, ViewInUse
from chm.handle import (
    Handle,
    HandleBatch,
    _closed_error,
    _pf_flags,
    _prefetch,
    _ref,
    timeout_ns,
)
from chm.session import Session
from chm.stats import Stats

_log = logging.getLogger(__name__)

__all__ = ["Device", "Handle", "HandleBatch", "Session", "timeout_ns"]


def _close_collected(ptr: Any, where: str) -> None:
    """Closes a device that was collected (or left open at exit) without
    ``close()``: its buffered writes are flushed as close would, and the
    bytes it still had to drop are logged at ERROR."""
    _ll.dev_shutdown(ptr)
    try:
        _ll.dev_lost(ptr)
    except ChmError as exc:
        _log.error("a chm.Device on %s was never closed; closing it: %s", where or "-", exc)


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
            scratch = scratch_dir()
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
            lock_targets(targets, self._locks)
            # a Device collected without close() gives its locks back too
            weakref.finalize(self, unlock, self._locks)
            try:
                self._ptr = open_device(cfg)
                lock_targets(targets, self._locks)  # the files this open created
            except BaseException:
                if self._ptr is not None:
                    _ll.dev_shutdown(self._ptr)
                    self._ptr = None
                unlock(self._locks)
                raise
        except BaseException:
            if self._cleanup is not None:
                self._cleanup()
            raise
        self._config = Config._from_cdata(_ll.dev_config(self._ptr))
        self._capacity = self._config.capacity
        # collected (or left open at exit) without close(): closed then, and
        # writes the final flush had to drop are logged, not lost unsaid
        self._collected = weakref.finalize(
            self, _close_collected, self._ptr, ", ".join(self._config.to_dict()["targets"])
        )

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
            self._collected.detach()
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
        unlock(self._locks)
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
