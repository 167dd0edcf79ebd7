"""chm_session_*: the calls of a session token (0 = the device's default
session). The batch form keeps its cffi arrays, so a caller can release
the very array it got, with no Python object per element."""

from __future__ import annotations

from typing import Any

from chm._ffi import ffi, lib
from chm._lowlevel.check import _arg_error, _check, _ns, _refuse_bools, _type_error
from chm._lowlevel.consts import Buffer, CData
from chm._lowlevel.device import BATCH_MAX, _batch_len, _u64_array, _view_buffer
from chm._lowlevel.names import ViewInfo
from chm._robuf import ReadOnlyBuffer

SESSION_DEFAULT: int = int(lib.CHM_SESSION_DEFAULT)
SESSION_MAX: int = int(lib.CHM_SESSION_MAX)
_sess_prefetch_c = lib.chm_session_prefetch
_sess_release_c = lib.chm_session_release
_sess_wait_c = lib.chm_session_wait
_new = ffi.new


def session_open(dev: CData, quota: int) -> int:
    """chm_session_open(): a new session token."""
    call = "chm_session_open"
    _refuse_bools(call, f"quota={quota!r}", ("quota", quota))
    out = ffi.new("chm_session *")
    try:
        rc = lib.chm_session_open(dev, quota, out)
    except OverflowError as exc:
        raise _arg_error(call, f"quota={quota}", exc) from None
    except TypeError as exc:
        raise _type_error(call, f"quota={quota!r}", exc) from None
    _check(rc, call, f"quota={quota}")
    return int(out[0])


def session_close(dev: CData, sess: int) -> int:
    """chm_session_close(): how many handles it released."""
    call = "chm_session_close"
    try:
        rc = lib.chm_session_close(dev, sess)
    except (OverflowError, TypeError) as exc:
        raise _arg_error(call, f"session={sess!r}", exc) from None
    return _check(rc, call, f"session={sess:#x}")


def session_prefetch_one(dev: CData, sess: int, addr: int, length: int, flags: int = 0) -> int:
    """One chm_session_prefetch() element; raises its status."""
    call = "chm_session_prefetch"
    what = f"addr={addr!r}, len={length!r}, flags={flags!r}"
    _refuse_bools(call, what, ("addr", addr), ("len", length))
    try:
        a = _new("uint64_t[1]", [addr])
        ln = _new("uint64_t[1]", [length])
    except OverflowError as exc:
        raise _arg_error(call, what, exc) from None
    except TypeError as exc:
        raise _type_error(call, what, exc) from None
    hs = _new("chm_handle[1]")
    res = _new("int32_t[1]")
    try:
        rc = _sess_prefetch_c(dev, sess, 1, a, ln, flags, hs, res)
    except OverflowError as exc:
        raise _arg_error(call, f"session={sess}, {what}", exc) from None
    _check(rc, call, f"session={sess:#x}")
    _check(res[0], call, f"addr={addr:#x}, len={length}, flags={flags:#x}")
    return int(hs[0])


def _waited(dev: CData, sess: int, h: int, timeout_ns: int) -> CData:
    """chm_session_wait() into a new view struct; raises its status."""
    call = "chm_session_wait"
    vp = ffi.new("struct chm_view *")
    try:
        rc = _sess_wait_c(dev, sess, h, timeout_ns, vp)
    except OverflowError as exc:
        raise _arg_error(call, f"handle={h}, timeout_ns={timeout_ns}", exc) from None
    _check(rc, call, f"session={sess:#x}, handle={h:#x}, timeout_ns={_ns(timeout_ns)}")
    return vp


def session_wait_buffer(
    dev: CData, sess: int, h: int, timeout_ns: int, owner: object = None
) -> Buffer:
    """chm_session_wait(): the read-only zero-copy buffer (keeps ``owner``,
    or ``dev`` when None, alive)."""
    vp = _waited(dev, sess, h, timeout_ns)
    return _view_buffer(vp.data, vp.len, dev if owner is None else owner)


def session_wait(dev: CData, sess: int, h: int, timeout_ns: int) -> ViewInfo:
    """chm_session_wait(): the staged object and its place."""
    vp = _waited(dev, sess, h, timeout_ns)
    n = int(vp.len)
    return ViewInfo(_view_buffer(vp.data, n, dev), n, int(vp.dev_addr), int(vp.pool_offset))


def session_wait_status(
    dev: CData, sess: int, h: int, timeout_ns: int
) -> tuple[int, int, int, int]:
    """chm_session_wait() as a status: ``(0, pool_offset, len, dev_addr)``
    or ``(-errno, 0, 0, 0)``; no view is made and nothing is raised (for a
    server that answers statuses, e.g. the daemon's WAIT)."""
    vp = _new("struct chm_view *")
    rc = _sess_wait_c(dev, sess, h, timeout_ns, vp)
    if rc < 0:
        return rc, 0, 0, 0
    return 0, int(vp.pool_offset), int(vp.len), int(vp.dev_addr)


def session_release_one(dev: CData, sess: int, h: int) -> None:
    """One chm_session_release() element; raises its status."""
    call = "chm_session_release"
    res = _new("int32_t[1]")
    try:
        hs = _new("chm_handle[1]", [h])
    except (OverflowError, TypeError) as exc:
        raise _arg_error(call, f"handle={h!r}", exc) from None
    _check(_sess_release_c(dev, sess, 1, hs, res), call, f"session={sess:#x}")
    _check(res[0], call, f"handle={h:#x}")


def session_prefetch(
    dev: CData, sess: int, addrs: Any, lens: Any, flags: int = 0
) -> tuple[list[int], list[int]]:
    """chm_session_prefetch(): (tokens, statuses), one per element."""
    hs, res, _ok = prefetch_batch(dev, sess, addrs, lens, flags)
    n = len(addrs)
    return ffi.unpack(hs, n), ffi.unpack(res, n)


def session_release(dev: CData, sess: int, tokens: Any) -> list[int]:
    """chm_session_release(): a status per token."""
    call = "chm_session_release"
    n = len(tokens)
    _batch_len(call, n)
    try:
        hs = _new("chm_handle[]", tokens)
    except (OverflowError, TypeError) as exc:
        raise _arg_error(call, f"n={n}", exc) from None
    res = _new("int32_t[]", n)
    _check(_sess_release_c(dev, sess, n, hs, res), call, f"session={sess:#x}, n={n}")
    return list(ffi.unpack(res, n))


def prefetch_batch(
    dev: CData, sess: int, addrs: Any, lens: Any, flags: int = 0
) -> tuple[CData, CData, int]:
    """chm_session_prefetch() keeping the arrays: (``chm_handle[n]``,
    ``int32_t[2n]`` whose first n are the statuses and whose last n
    :func:`release_batch` fills, how many were issued), for
    :func:`release_batch`, :func:`batch_token` and :func:`batch_statuses`."""
    call = "chm_session_prefetch"
    n = len(addrs)
    if n != len(lens) or n > BATCH_MAX:
        _batch_len(call, n, len(lens))
    try:
        a = _new("uint64_t[]", addrs)
        ln = _new("uint64_t[]", lens)
    except (OverflowError, TypeError):
        a = _u64_array(call, "addrs", addrs)  # raises the precise error
        ln = _u64_array(call, "lens", lens)
    else:
        if True in addrs or True in lens:  # 1 == True: look closer
            _u64_array(call, "addrs", addrs)
            _u64_array(call, "lens", lens)
    hs = _new("chm_handle[]", n)
    res = _new("int32_t[]", 2 * n)
    try:
        ok = _sess_prefetch_c(dev, sess, n, a, ln, flags, hs, res)
    except OverflowError as exc:
        raise _arg_error(call, f"session={sess!r}, n={n}", exc) from None
    if ok < 0:
        _check(ok, call, f"session={sess:#x}, n={n}")
    return hs, res, ok


def release_batch(dev: CData, sess: int, hs: CData, n: int, res: CData) -> int:
    """chm_session_release() of the n handles of a :func:`prefetch_batch`,
    its statuses into the last n of ``res``; how many were released."""
    ok: int = _sess_release_c(dev, sess, n, hs, res + n)
    if ok < 0:
        _check(ok, "chm_session_release", f"session={sess:#x}, n={n}")
    return ok


def batch_token(hs: CData, i: int) -> int:
    """Element i of a ``chm_handle[]``."""
    return int(hs[i])


def batch_statuses(res: CData, n: int) -> list[int]:
    """The first n statuses of an ``int32_t[]``."""
    return list(ffi.unpack(res, n))


def batch_status_buffer(res: CData, n: int) -> memoryview:
    """A read-only memoryview (format ``i``) over the first n of an ``int32_t[]``."""
    return memoryview(ReadOnlyBuffer(ffi.buffer(res, 4 * n), res)).cast("B").cast("i")
