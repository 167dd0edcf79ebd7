"""The device calls: open and close, prefetch (hot path: per-thread scratch
out-parameters, nothing allocated per call), the data path, stats, the
batched calls and fault injection."""

from __future__ import annotations

import errno
import operator
import os
import threading
from typing import Any

from chm._ffi import ffi, lib
from chm._lowlevel.check import (
    _arg_error,
    _check,
    _errbuf,
    _errtext,
    _ns,
    _refuse_bools,
    _type_error,
)
from chm._lowlevel.config import _iter_fields
from chm._lowlevel.consts import ERRMSG_MAX, MAX_TARGETS, Buffer, CData
from chm._lowlevel.names import ViewInfo
from chm._robuf import ReadOnlyBuffer

# ---------------------------------------------------------------- lifecycle


def _missing_path(cfg: CData) -> tuple[str, str] | None:
    """After -ENOENT from chm_dev_open(): the path that is missing and why
    (the C call says only ENOENT), or None when none is."""
    create = bool(cfg.create)
    for i in range(min(int(cfg.n_targets), MAX_TARGETS)):
        path = os.fsdecode(ffi.string(cfg.targets[i]))
        if os.path.exists(path):
            continue
        parent = os.path.dirname(path) or "."
        if not create:
            return path, f"target {path!r} does not exist (and create is off)"
        if not os.path.isdir(parent):
            return path, f"target {path!r}: no such directory {parent!r}"
        if os.path.islink(path):
            return path, f"target {path!r} is a dangling symlink"
    if int(cfg.pool_kind) == int(lib.CHM_POOL_FILE):
        path = os.fsdecode(ffi.string(cfg.pool_path))
        if path and not os.path.exists(path):
            return path, f"pool_path {path!r} does not exist"
    return None


def dev_open_err(cfg: CData) -> CData:
    """chm_dev_open_err(): returns the device pointer (with a leak-net
    destructor); a failure carries the device's one-line reason (the option,
    path and sizes involved) in the message and in ``.detail``. A missing
    target or pool file raises NotFound naming the path (also in
    ``.filename``)."""
    out = ffi.new("chm_dev **")
    err = _errbuf()
    rc = lib.chm_dev_open_err(cfg, out, err, ERRMSG_MAX)
    if rc < 0:
        detail = _errtext(err)
        filename = None
        if rc == -errno.ENOENT:
            missing = _missing_path(cfg)
            if missing is not None:
                filename = missing[0]
                detail = detail or missing[1]
        _check(rc, "chm_dev_open", "", detail, filename)
    return ffi.gc(out[0], lib.chm_dev_close)


# chm_dev_open() is chm_dev_open_err() without the reason: one wrapper for both.
dev_open = dev_open_err


def dev_close(dev: CData) -> None:
    """chm_dev_close(): shuts down and frees now. Only for a pointer no other
    thread can still be using; chm.Device uses dev_shutdown() instead."""
    ffi.release(dev)


def dev_shutdown(dev: CData) -> None:
    """chm_dev_shutdown(): cancels, drains and frees everything but the device
    struct, on which later calls answer -ECANCELED. The struct itself is freed
    by the pointer's destructor once nothing references it (views included),
    so a thread that read the pointer just before can never use freed memory."""
    lib.chm_dev_shutdown(dev)


def dev_lost(dev: CData) -> tuple[int, int]:
    """chm_dev_lost(), after :func:`dev_shutdown`: the (writes, bytes) that
    close's final flush could not make durable and dropped. Raises NoSpace
    (the backing's filesystem was full) or DeviceIOError when any were
    dropped, naming the target file (also ``.filename``), the bytes and the
    writes; returns (0, 0) when everything written reached the backing."""
    writes = ffi.new("uint64_t *")
    nbytes = ffi.new("uint64_t *")
    _check(lib.chm_dev_lost(dev, writes, nbytes), "chm_dev_close")
    return int(writes[0]), int(nbytes[0])


def dev_config(dev: CData) -> CData:
    """chm_dev_config(): the effective configuration."""
    out = ffi.new("struct chm_config *")
    _check(lib.chm_dev_config(dev, out), "chm_dev_config")
    return out


def dev_pool_fd(dev: CData) -> int:
    """chm_dev_pool_fd(): the memfd of a memfd pool (owned by the device)."""
    return _check(lib.chm_dev_pool_fd(dev), "chm_dev_pool_fd")


# ---------------------------------------------------------------- prefetch

_tls = threading.local()
_prefetch_c = lib.chm_prefetch_object
_wait_c = lib.chm_prefetch_wait
_release_c = lib.chm_prefetch_release
_buffer = ffi.buffer
_cast = ffi.cast


def _view_buffer(data: CData, n: int, owner: object) -> Buffer:
    """A read-only zero-copy buffer over a staged object. It keeps ``owner``
    alive for as long as it exists or anything exports it: the device pointer
    (so the mapped DRAM pool stays mapped), or a chm.Handle, which keeps its
    device and so the pointer."""
    return ReadOnlyBuffer(_buffer(_cast("char *", data), n), owner)


_alloc_raw = ffi.new_allocator(should_clear_after_alloc=False)


def _scratch_handle() -> CData:
    p = _tls.h = ffi.new("chm_handle *")
    return p


def _scratch_view() -> CData:
    p = _tls.v = ffi.new("struct chm_view *")
    return p


def prefetch_object(dev: CData, addr: int, length: int, flags: int = 0) -> int:
    """chm_prefetch_object(): issues a prefetch, returns the handle token."""
    try:
        hp = _tls.h
    except AttributeError:
        hp = _scratch_handle()
    if addr.__class__ is bool or length.__class__ is bool:
        what = f"addr={addr!r}, len={length!r}, flags={flags!r}"
        _refuse_bools("chm_prefetch_object", what, ("addr", addr), ("len", length))
    try:
        rc = _prefetch_c(dev, addr, length, flags, hp)
    except OverflowError as exc:
        raise _arg_error(
            "chm_prefetch_object", f"addr={addr}, len={length}, flags={flags}", exc
        ) from None
    except TypeError as exc:
        what = f"addr={addr!r}, len={length!r}, flags={flags!r}"
        raise _type_error("chm_prefetch_object", what, exc) from None
    if rc < 0:
        _check(rc, "chm_prefetch_object", f"addr={addr:#x}, len={length}, flags={flags:#x}")
    return hp[0]  # type: ignore[no-any-return]


def _wait(dev: CData, h: int, timeout_ns: int) -> CData:
    try:
        vp = _tls.v
    except AttributeError:
        vp = _scratch_view()
    try:
        rc = _wait_c(dev, h, timeout_ns, vp)
    except OverflowError as exc:
        raise _arg_error("chm_prefetch_wait", f"handle={h}, timeout_ns={timeout_ns}", exc) from None
    if rc < 0:
        _check(rc, "chm_prefetch_wait", f"handle={h:#x}, timeout_ns={_ns(timeout_ns)}")
    return vp


def resident_evict(dev: CData, addr: int, length: int) -> int:
    """chm_resident_evict(): drops the resident entries over a range; how many."""
    if addr.__class__ is bool or length.__class__ is bool:
        what = f"addr={addr!r}, len={length!r}"
        _refuse_bools("chm_resident_evict", what, ("addr", addr), ("len", length))
    try:
        rc = int(lib.chm_resident_evict(dev, addr, length))
    except OverflowError as exc:
        raise _arg_error("chm_resident_evict", f"addr={addr}, len={length}", exc) from None
    except TypeError as exc:
        raise _type_error("chm_resident_evict", f"addr={addr!r}, len={length!r}", exc) from None
    if rc < 0:
        _check(rc, "chm_resident_evict", f"addr={addr:#x}, len={length}")
    return rc


def prefetch_wait(dev: CData, h: int, timeout_ns: int) -> ViewInfo:
    """chm_prefetch_wait(): the staged object (read-only zero-copy buffer,
    which keeps ``dev`` alive) and its place."""
    vp = _wait(dev, h, timeout_ns)
    n = int(vp.len)
    return ViewInfo(_view_buffer(vp.data, n, dev), n, int(vp.dev_addr), int(vp.pool_offset))


def prefetch_wait_buffer(dev: CData, h: int, timeout_ns: int, owner: object = None) -> Buffer:
    """chm_prefetch_wait() returning only the read-only zero-copy buffer (hot
    path); it keeps ``owner`` alive, ``dev`` when None."""
    vp = _wait(dev, h, timeout_ns)
    return _view_buffer(vp.data, vp.len, dev if owner is None else owner)


def prefetch_release(dev: CData, h: int) -> None:
    """chm_prefetch_release(): frees the handle's slot or queue entry."""
    try:
        rc = _release_c(dev, h)
    except OverflowError as exc:
        raise _arg_error("chm_prefetch_release", f"handle={h}", exc) from None
    if rc < 0:
        _check(rc, "chm_prefetch_release", f"handle={h:#x}")


# ---------------------------------------------------------------- data path


def read(dev: CData, addr: int, length: int) -> bytes:
    """chm_read() into a new bytes object."""
    what = f"addr={addr!r}, len={length!r}"
    _refuse_bools("chm_read", what, ("addr", addr), ("len", length))
    try:
        length = operator.index(length)
    except TypeError as exc:
        raise _type_error("chm_read", what, exc) from None
    if length < 0:
        raise _arg_error("chm_read", f"addr={addr}, len={length}", ValueError("negative length"))
    buf = _alloc_raw("char[]", max(length, 1))
    try:
        rc = lib.chm_read(dev, addr, buf, length)
    except OverflowError as exc:
        raise _arg_error("chm_read", f"addr={addr}, len={length}", exc) from None
    except TypeError as exc:
        raise _type_error("chm_read", what, exc) from None
    if rc < 0:
        _check(rc, "chm_read", f"addr={addr:#x}, len={length}")
    return bytes(ffi.buffer(buf, length))


def read_into(dev: CData, addr: int, out: Any) -> int:
    """chm_read() into a writable buffer; returns the byte count."""
    try:
        cbuf = ffi.from_buffer("char[]", out, require_writable=True)
    except (TypeError, BufferError, ValueError) as exc:  # not a writable contiguous buffer
        raise _arg_error("chm_read", f"addr={addr}, buf=...", exc) from None
    n = len(cbuf)
    _refuse_bools("chm_read", f"addr={addr!r}, len={n}", ("addr", addr))
    try:
        rc = lib.chm_read(dev, addr, cbuf, n)
    except OverflowError as exc:
        raise _arg_error("chm_read", f"addr={addr}, len={n}", exc) from None
    except TypeError as exc:
        raise _type_error("chm_read", f"addr={addr!r}, len={n}", exc) from None
    if rc < 0:
        _check(rc, "chm_read", f"addr={addr:#x}, len={n}")
    return n


def write_object(dev: CData, addr: int, data: Any, flags: int = 0) -> int:
    """chm_write_object(): 0 admitted, WRITE_SKIPPED skipped."""
    try:
        cbuf = ffi.from_buffer("char[]", data)
    except (TypeError, BufferError, ValueError) as exc:  # not a contiguous buffer
        raise _arg_error("chm_write_object", f"addr={addr}, buf=...", exc) from None
    n = len(cbuf)
    what = f"addr={addr!r}, len={n}, flags={flags!r}"
    _refuse_bools("chm_write_object", what, ("addr", addr), ("flags", flags))
    try:
        rc = lib.chm_write_object(dev, addr, cbuf, n, flags)
    except OverflowError as exc:
        raise _arg_error("chm_write_object", f"addr={addr}, len={n}", exc) from None
    except TypeError as exc:
        raise _type_error("chm_write_object", what, exc) from None
    return _check(rc, "chm_write_object", f"addr={addr:#x}, len={n}, flags={flags:#x}")


def write_length(dev: CData, addr: int, length: int) -> int:
    """chm_write_object() with no payload (buf NULL; the ghost backend only)."""
    what = f"addr={addr!r}, len={length!r}"
    _refuse_bools("chm_write_object", what, ("addr", addr), ("len", length))
    try:
        rc = lib.chm_write_object(dev, addr, ffi.NULL, length, 0)
    except OverflowError as exc:
        raise _arg_error("chm_write_object", what, exc) from None
    except TypeError as exc:
        raise _type_error("chm_write_object", what, exc) from None
    return _check(rc, "chm_write_object", f"addr={addr:#x}, buf=NULL, len={length}")


def clock_ns(dev: CData) -> int:
    """chm_clock_ns(): the device clock, without a stats snapshot."""
    out = _clock_out()
    _check(lib.chm_clock_ns(dev, out), "chm_clock_ns")
    return int(out[0])


def _clock_out() -> CData:
    out = getattr(_tls, "clock", None)
    if out is None:
        out = _tls.clock = ffi.new("uint64_t *")
    return out


def advance_clock(dev: CData, t_ns: int) -> None:
    """chm_advance_clock(): raises the virtual clock to t_ns."""
    _refuse_bools("chm_advance_clock", f"t_ns={t_ns!r}", ("t_ns", t_ns))
    try:
        rc = lib.chm_advance_clock(dev, t_ns)
    except OverflowError as exc:
        raise _arg_error("chm_advance_clock", f"t_ns={t_ns}", exc) from None
    except TypeError as exc:
        raise _type_error("chm_advance_clock", f"t_ns={t_ns!r}", exc) from None
    _check(rc, "chm_advance_clock", f"t_ns={t_ns}")


def flush(dev: CData, timeout_ns: int) -> None:
    """chm_flush(): durability barrier."""
    try:
        rc = lib.chm_flush(dev, timeout_ns)
    except OverflowError as exc:
        raise _arg_error("chm_flush", f"timeout_ns={timeout_ns}", exc) from None
    _check(rc, "chm_flush", f"timeout_ns={_ns(timeout_ns)}")


_STATS_FIELDS = [(name, ft) for name, ft in _iter_fields(ffi.typeof("struct chm_stats"))]


def stats(dev: CData) -> dict[str, Any]:
    """chm_stats(): a consistent snapshot of every counter, by field name."""
    out = ffi.new("struct chm_stats *")
    _check(lib.chm_stats(dev, out), "chm_stats")
    s = out[0]
    d: dict[str, Any] = {}
    for name, ft in _STATS_FIELDS:
        v = getattr(s, name)
        d[name] = list(v) if ft.kind == "array" else v
    return d


BATCH_MAX = int(lib.CHM_BATCH_MAX)


def _u64_array(call: str, name: str, values: Any) -> CData:
    if bool in set(map(type, values)):
        raise _arg_error(call, f"{name}=...", "a bool is not an integer")
    try:
        return ffi.new("uint64_t[]", values)
    except OverflowError as exc:
        raise _arg_error(call, f"{name}=...", exc) from None
    except TypeError as exc:
        raise _type_error(call, f"{name}=...", exc) from None


def _batch_len(call: str, n: int, *others: int) -> None:
    if any(m != n for m in others):
        raise _arg_error(call, f"n={n}", f"array lengths differ: {(n, *others)}")
    if n > BATCH_MAX:
        raise _arg_error(call, f"n={n}", f"more than CHM_BATCH_MAX ({BATCH_MAX}) elements")


def prefetch_objects(
    dev: CData, addrs: Any, lens: Any, flags: int = 0
) -> tuple[list[int], list[int]]:
    """chm_prefetch_objects(): (tokens, statuses), one per element; a token
    is meaningful where its status is 0."""
    call = "chm_prefetch_objects"
    n = len(addrs)
    _batch_len(call, n, len(lens))
    a = _u64_array(call, "addrs", addrs)
    ln = _u64_array(call, "lens", lens)
    hs = ffi.new("chm_handle[]", n)
    res = ffi.new("int32_t[]", n)
    _check(lib.chm_prefetch_objects(dev, n, a, ln, flags, hs, res), call, f"n={n}")
    return ffi.unpack(hs, n), ffi.unpack(res, n)


def prefetch_release_many(dev: CData, tokens: Any) -> list[int]:
    """chm_prefetch_release_many(): a status per token."""
    call = "chm_prefetch_release_many"
    n = len(tokens)
    _batch_len(call, n)
    try:
        hs = ffi.new("chm_handle[]", tokens)  # Handle tokens: ints already
    except (OverflowError, TypeError) as exc:
        raise _arg_error(call, f"n={n}", exc) from None
    res = ffi.new("int32_t[]", n)
    _check(lib.chm_prefetch_release_many(dev, n, hs, res), call, f"n={n}")
    return list(ffi.unpack(res, n))


def write_objects(dev: CData, addrs: Any, bufs: Any, flags: int = 0) -> list[int]:
    """chm_write_objects(): a status per element (0, WRITE_SKIPPED, -errno)."""
    call = "chm_write_objects"
    n = len(addrs)
    _batch_len(call, n, len(bufs))
    a = _u64_array(call, "addrs", addrs)
    ptrs = ffi.new("void *[]", n)
    lens = ffi.new("uint64_t[]", n)
    keep = []
    for i, b in enumerate(bufs):
        try:
            cb = ffi.from_buffer("char[]", b)
        except (TypeError, BufferError, ValueError) as exc:
            raise _arg_error(call, f"bufs[{i}]=...", exc) from None
        keep.append(cb)
        ptrs[i] = cb
        lens[i] = len(cb)
    res = ffi.new("int32_t[]", n)
    _check(lib.chm_write_objects(dev, n, a, ptrs, lens, flags, res), call, f"n={n}")
    del keep
    return list(ffi.unpack(res, n))


def new_stats() -> CData:
    """A ``struct chm_stats *`` for :func:`stats_into`."""
    return ffi.new("struct chm_stats *")


def stats_into(dev: CData, out: CData) -> None:
    """chm_stats() into a struct from :func:`new_stats`, nothing converted
    (for measuring the call itself)."""
    _check(lib.chm_stats(dev, out), "chm_stats")


def fault_inject(dev: CData, kind: int, nth: int, arg: int) -> None:
    """chm_fault_inject(): arms a backend fault (tests)."""
    what = f"kind={kind!r}, nth={nth!r}, arg={arg!r}"
    _refuse_bools("chm_fault_inject", what, ("kind", kind), ("nth", nth), ("arg", arg))
    try:
        rc = lib.chm_fault_inject(dev, kind, nth, arg)
    except OverflowError as exc:
        raise _arg_error("chm_fault_inject", f"kind={kind}, nth={nth}, arg={arg}", exc) from None
    except TypeError as exc:
        raise _type_error("chm_fault_inject", what, exc) from None
    _check(rc, "chm_fault_inject", f"kind={kind}, nth={nth}, arg={arg}")
