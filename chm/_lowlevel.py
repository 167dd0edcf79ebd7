"""1:1 typed wrappers over include/chm.h.

This module and ``chm._ffi`` are the only ones that touch ``ffi``/``lib``.
Every failing call goes through :func:`_check`, which turns ``-errno`` into
the matching :mod:`chm.errors` exception carrying ``chm_strerror()``'s text,
the C function's name and its arguments.

Device pointers returned by :func:`dev_open` carry an ``ffi.gc`` destructor
as a leak safety net only; :func:`dev_close` runs it explicitly.

The hot-path wrappers (prefetch/wait/release) keep their out-parameters in
per-thread scratch structs so they allocate nothing per call.

Integer arguments: a value of another type is a TypeError naming the call
and its arguments; a bool (an int to Python, but never an address, a length
or a count) or a value out of range is InvalidArgument.

A staged view is exported through :class:`chm._robuf.ReadOnlyBuffer`, never
as a cffi buffer: cffi buffers are writable, and a memoryview's ``.obj`` (the
base of every numpy array made from it) hands its exporter to anyone.
"""

from __future__ import annotations

import errno
import operator
import os
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

from chm._ffi import ffi, lib
from chm._robuf import ReadOnlyBuffer
from chm.errors import ChmError, InvalidArgument, error_for

# Opaque cffi objects (struct pointers) handed to the layers above.
CData = Any
Buffer = ReadOnlyBuffer  # a view of device DRAM (read-only buffer protocol)

UINT64_MAX: int = 2**64 - 1
WRITE_SKIPPED: int = int(lib.CHM_WRITE_SKIPPED)
IO_ALIGN: int = int(lib.CHM_IO_ALIGN)
MAX_TARGETS: int = int(lib.CHM_MAX_TARGETS)
PATH_MAX: int = int(lib.CHM_PATH_MAX)
HIST_BUCKETS: int = int(lib.CHM_HIST_BUCKETS)
ERRMSG_MAX: int = int(lib.CHM_ERRMSG_MAX)
PF_NOQUEUE: int = int(lib.CHM_PF_NOQUEUE)
PF_RETAIN: int = int(lib.CHM_PF_RETAIN)
VERSION_TUPLE: tuple[int, int, int] = (
    int(lib.CHM_VERSION_MAJOR),
    int(lib.CHM_VERSION_MINOR),
    int(lib.CHM_VERSION_PATCH),
)


def enum_name(kind: int, value: int) -> str | None:
    """chm_enum_name(): the name of ``value`` in enumeration ``kind``
    (``lib.CHM_ENUM_*``), None when it has none."""
    p = lib.chm_enum_name(kind, value)
    return None if p == ffi.NULL else str(ffi.string(p).decode())


def enum_value(kind: int, name: str) -> int:
    """chm_enum_value(): the value named ``name`` (any case) in enumeration
    ``kind``; NotFound for an unknown name, InvalidArgument for an unknown kind."""
    try:
        rc = lib.chm_enum_value(kind, name.encode())
    except (UnicodeEncodeError, AttributeError, TypeError) as exc:
        raise _arg_error("chm_enum_value", f"{kind}, {name!r}", exc) from None
    return _check(rc, "chm_enum_value", f"{kind}, {name!r}")


def _enum_table(kind: int) -> dict[str, int]:
    """One enumeration's ``{name: value}``, as the C core names it
    (chm_enum_name): no name is typed twice."""
    out: dict[str, int] = {}
    value = 0
    while (name := enum_name(kind, value)) is not None:
        out[name] = value
        value += 1
    return out


BACKENDS: dict[str, int] = _enum_table(lib.CHM_ENUM_BACKEND)
MODES: dict[str, int] = _enum_table(lib.CHM_ENUM_MODE)
POOL_KINDS: dict[str, int] = _enum_table(lib.CHM_ENUM_POOL)
CLOCKS: dict[str, int] = _enum_table(lib.CHM_ENUM_CLOCK)
FAULTS: dict[str, int] = _enum_table(lib.CHM_ENUM_FAULT)


def state_name(kind: int, value: int) -> str | None:
    """chm_state_name(): the fw_spec name of state ``value`` of the internal
    state machine ``kind`` (``lib.CHM_STATE_*``), None when it has none."""
    p = lib.chm_state_name(kind, value)
    return None if p == ffi.NULL else str(ffi.string(p).decode())


def _state_names(kind: int) -> dict[str, int]:
    """{name: value} of one internal state machine, as the C core names it."""
    out: dict[str, int] = {}
    while (name := state_name(kind, len(out))) is not None:
        out[name] = len(out)
    return out


# The device's internal state machines (fw_spec/*.yaml), by name.
SLOT_STATES: dict[str, int] = _state_names(lib.CHM_STATE_SLOT)
WBUF_STATES: dict[str, int] = _state_names(lib.CHM_STATE_WBUF)
LINE_STATES: dict[str, int] = _state_names(lib.CHM_STATE_LINE)
RESIDENT_STATES: dict[str, int] = _state_names(lib.CHM_STATE_RESIDENT)


def name_of(table: dict[str, int], value: int) -> str | None:
    """The name of ``value`` in one of the tables above, None if it has none."""
    for name, v in table.items():
        if v == value:
            return name
    return None


class OptionInfo(NamedTuple):
    """One configuration option as declared by the C core."""

    name: str
    type: str
    default: str
    help: str


class ViewInfo(NamedTuple):
    """A staged object: a zero-copy buffer over device DRAM plus its place."""

    buffer: Buffer
    length: int
    dev_addr: int
    pool_offset: int


# ---------------------------------------------------------------- errors


def strerror(err: int) -> str:
    """chm_strerror(): the English text for a -errno (or errno) value."""
    code = -abs(int(err))
    return str(ffi.string(lib.chm_strerror(code)).decode("utf-8", "replace"))


def last_error_detail(rc: int) -> str | None:
    """chm_last_error_detail(): the C core's one-line reason for the failure
    ``rc`` of this thread's latest call, None when it gave none. Only
    meaningful right after that call, on the same thread."""
    text = str(ffi.string(lib.chm_last_error_detail(rc)).decode("utf-8", "replace"))
    return text or None


def last_error_path(rc: int) -> str | None:
    """chm_last_error_path(): the file the failure ``rc`` of this thread's
    latest call was about (a target, the pool file), None when it named
    none. Only meaningful right after that call, on the same thread."""
    text = os.fsdecode(ffi.string(lib.chm_last_error_path(rc)))
    return text or None


def _check(
    rc: int,
    call: str = "chm",
    args: str = "",
    detail: str | None = None,
    filename: str | None = None,
) -> int:
    """The single choke point: returns rc >= 0, raises for -errno.

    The exception's message ends with why the call failed: ``detail`` when
    the caller has it, else the reason the C core recorded at the failure
    site (:func:`last_error_detail`, read here, right after the call, on the
    caller's thread). ``filename`` (the offending path, when the caller
    knows it) is set as the exception's ``.filename``, as OSError does.
    """
    if rc >= 0:
        return rc
    if detail is None:
        detail = last_error_detail(rc)
    if filename is None:
        filename = last_error_path(rc)
    err = status_error(rc, call, args, detail)
    if filename is not None:
        err.filename = filename
    raise err


def status_error(rc: int, call: str = "chm", args: str = "", detail: str | None = None) -> Any:
    """The exception (not raised) for a -errno status, e.g. one element of a
    batched call; :func:`_check` raises the same."""
    code = -rc
    message = f"{call}({args}): {strerror(code)}"
    if detail:
        message = f"{message}: {detail}"
    return error_for(code)(code, message, call=call, detail=detail)


def _ns(timeout_ns: int) -> str:
    """A timeout argument as an error message shows it: UINT64_MAX (no
    deadline) as "forever", not 18446744073709551615."""
    return "forever" if timeout_ns == UINT64_MAX else str(timeout_ns)


def _arg_error(call: str, args: str, exc: Exception | str) -> InvalidArgument:
    code = InvalidArgument.default_errno
    return InvalidArgument(code, f"{call}({args}): {exc}", call=call, detail=str(exc))


def _type_error(call: str, args: str, exc: Exception) -> TypeError:
    """A wrong-typed argument: cffi's bare "an integer is required", with the
    call and the arguments it was given."""
    return TypeError(f"{call}({args}): {exc}")


def _refuse_bools(call: str, args: str, *named: tuple[str, object]) -> None:
    """Raises InvalidArgument if one of the named integer arguments is a bool."""
    for name, value in named:
        if value.__class__ is bool:
            raise _arg_error(call, args, f"{name} must be an integer, not a bool")


def _errbuf() -> CData:
    return ffi.new("char[]", ERRMSG_MAX)


def _errtext(buf: CData) -> str | None:
    text = str(ffi.string(buf).decode("utf-8", "replace"))
    return text or None


# ---------------------------------------------------------------- version


def version() -> int:
    """chm_version(): MAJOR*10000 + MINOR*100 + PATCH."""
    return int(lib.chm_version())


# ---------------------------------------------------------------- config


def config_init(cfg: CData) -> None:
    """chm_config_init(): fills *cfg with defaults."""
    _check(lib.chm_config_init(cfg), "chm_config_init")


def config_new() -> CData:
    """Allocates a struct chm_config filled by chm_config_init()."""
    cfg = ffi.new("struct chm_config *")
    config_init(cfg)
    return cfg


def config_copy(cfg: CData) -> CData:
    """A new struct chm_config with the same contents."""
    out = ffi.new("struct chm_config *")
    ffi.memmove(out, cfg, ffi.sizeof("struct chm_config"))
    return out


def config_set(cfg: CData, key: str, value: str) -> None:
    """chm_config_set(): sets one option from its text form.

    Raises NotFound for an unknown key, InvalidArgument for a bad value (the
    device's one-line reason is in the message and in ``.detail``).
    """
    if "\0" in key or "\0" in value:  # C would see the text up to the NUL only
        raise _arg_error("chm_config_set", f"{key!r}, {value!r}", ValueError("contains a NUL byte"))
    err = _errbuf()
    try:
        rc = lib.chm_config_set(cfg, key.encode(), value.encode(), err, ERRMSG_MAX)
    except (UnicodeEncodeError, TypeError) as exc:
        raise _arg_error("chm_config_set", f"{key!r}, {value!r}", exc) from None
    if rc < 0:
        _check(rc, "chm_config_set", f"{key!r}, {value!r}", _errtext(err))


_GETBUF = MAX_TARGETS * PATH_MAX + 64  # room for every target and the commas


def config_get(cfg: CData, key: str) -> str:
    """chm_config_get(): option ``key`` of *cfg in its text form; NotFound
    for an unknown key."""
    if "\0" in key:
        raise _arg_error("chm_config_get", repr(key), ValueError("contains a NUL byte"))
    out = ffi.new("char[]", _GETBUF)
    try:
        rc = lib.chm_config_get(cfg, key.encode(), out, _GETBUF)
    except UnicodeEncodeError as exc:
        raise _arg_error("chm_config_get", repr(key), exc) from None
    _check(rc, "chm_config_get", repr(key))
    return str(ffi.string(out, rc).decode("utf-8", "replace"))


def parse_size(text: str) -> int:
    """chm_parse_size(): the byte count a size string names (the grammar of
    every size option); InvalidArgument with the C core's reason otherwise."""
    if "\0" in text:
        raise _arg_error("chm_parse_size", repr(text), "contains a NUL byte")
    out = ffi.new("uint64_t *")
    try:
        rc = lib.chm_parse_size(text.encode(), out)
    except UnicodeEncodeError:
        raise _arg_error("chm_parse_size", repr(text), "not a size (non-ASCII text)") from None
    _check(rc, "chm_parse_size", repr(text))
    return int(out[0])


def config_validate(cfg: CData) -> None:
    """chm_config_validate(): raises InvalidArgument with the reason."""
    err = _errbuf()
    rc = lib.chm_config_validate(cfg, err, ERRMSG_MAX)
    if rc < 0:
        _check(rc, "chm_config_validate", "", _errtext(err))


def _cstr(p: CData) -> str:
    if p == ffi.NULL:
        return ""
    return str(ffi.string(p).decode("utf-8", "replace"))


def config_option(idx: int) -> OptionInfo:
    """chm_config_option(): option number idx; NotFound past the end."""
    info = ffi.new("struct chm_option_info *")
    _check(lib.chm_config_option(idx, info), "chm_config_option", str(idx))
    return OptionInfo(_cstr(info.name), _cstr(info.type), _cstr(info.defval), _cstr(info.help))


def config_options() -> list[OptionInfo]:
    """Every option the C core declares, in its order."""
    out: list[OptionInfo] = []
    info = ffi.new("struct chm_option_info *")
    idx = 0
    while lib.chm_config_option(idx, info) == 0:
        out.append(
            OptionInfo(_cstr(info.name), _cstr(info.type), _cstr(info.defval), _cstr(info.help))
        )
        idx += 1
    return out


def timing_preset(name: str) -> dict[str, int]:
    """chm_timing_preset(): the preset's struct chm_timing as a dict."""
    out = ffi.new("struct chm_timing *")
    _check(lib.chm_timing_preset(name.encode(), out), "chm_timing_preset", repr(name))
    return _struct_to_dict(out[0])


def _iter_fields(ctype: Any) -> Iterator[tuple[str, Any]]:
    for name, field in ctype.fields:
        yield name, field.type


def _value(v: Any, ctype: Any) -> Any:
    kind = ctype.kind
    if kind == "primitive":
        return v if not isinstance(v, bytes) else v.decode("utf-8", "replace")
    if kind == "array":
        item = ctype.item
        if item.kind == "primitive" and item.cname == "char":
            return str(ffi.string(v).decode("utf-8", "replace"))
        return [_value(x, item) for x in v]
    if kind == "struct":
        return _struct_to_dict(v)
    if kind == "enum":
        return int(v)
    return v


def _struct_to_dict(obj: Any) -> dict[str, Any]:
    ctype = ffi.typeof(obj)
    return {name: _value(getattr(obj, name), ft) for name, ft in _iter_fields(ctype)}


def config_to_dict(cfg: CData) -> dict[str, Any]:
    """The raw struct chm_config as a dict (field names, ints, strings)."""
    d = _struct_to_dict(cfg[0])
    n = int(cfg.n_targets)
    d["targets"] = [str(ffi.string(cfg.targets[i]).decode()) for i in range(min(n, MAX_TARGETS))]
    return d


def struct_fields(cname: str) -> list[str]:
    """Field names of a C struct, e.g. ``struct_fields("struct chm_stats")``."""
    return [name for name, _ in ffi.typeof(cname).fields]


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


__all__ = [
    "BACKENDS",
    "CLOCKS",
    "FAULTS",
    "IO_ALIGN",
    "LINE_STATES",
    "MODES",
    "POOL_KINDS",
    "SLOT_STATES",
    "UINT64_MAX",
    "WBUF_STATES",
    "WRITE_SKIPPED",
    "ChmError",
    "OptionInfo",
    "ReadOnlyBuffer",
    "ViewInfo",
    "config_copy",
    "config_get",
    "config_init",
    "config_new",
    "config_option",
    "config_options",
    "config_set",
    "config_to_dict",
    "config_validate",
    "dev_close",
    "dev_shutdown",
    "dev_config",
    "dev_open",
    "dev_open_err",
    "dev_pool_fd",
    "enum_name",
    "enum_value",
    "fault_inject",
    "flush",
    "last_error_detail",
    "last_error_path",
    "name_of",
    "parse_size",
    "prefetch_object",
    "prefetch_release",
    "prefetch_wait",
    "prefetch_wait_buffer",
    "read",
    "read_into",
    "state_name",
    "stats",
    "strerror",
    "struct_fields",
    "timing_preset",
    "version",
]


# ---------------------------------------------------------------- sessions
# chm_session_*: the calls of a session token (0 = the device's default
# session). The batch form keeps its cffi arrays, so a caller can release
# the very array it got, with no Python object per element.

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


def session_wait_buffer(
    dev: CData, sess: int, h: int, timeout_ns: int, owner: object = None
) -> Buffer:
    """chm_session_wait(): the read-only zero-copy buffer (keeps ``owner``,
    or ``dev`` when None, alive)."""
    call = "chm_session_wait"
    vp = ffi.new("struct chm_view *")
    try:
        rc = _sess_wait_c(dev, sess, h, timeout_ns, vp)
    except OverflowError as exc:
        raise _arg_error(call, f"handle={h}, timeout_ns={timeout_ns}", exc) from None
    _check(rc, call, f"session={sess:#x}, handle={h:#x}, timeout_ns={_ns(timeout_ns)}")
    return _view_buffer(vp.data, vp.len, dev if owner is None else owner)


def session_wait(dev: CData, sess: int, h: int, timeout_ns: int) -> ViewInfo:
    """chm_session_wait(): the staged object and its place."""
    call = "chm_session_wait"
    vp = ffi.new("struct chm_view *")
    try:
        rc = _sess_wait_c(dev, sess, h, timeout_ns, vp)
    except OverflowError as exc:
        raise _arg_error(call, f"handle={h}, timeout_ns={timeout_ns}", exc) from None
    _check(rc, call, f"session={sess:#x}, handle={h:#x}, timeout_ns={_ns(timeout_ns)}")
    n = int(vp.len)
    return ViewInfo(_view_buffer(vp.data, n, dev), n, int(vp.dev_addr), int(vp.pool_offset))


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


__all__ += [
    "SESSION_DEFAULT",
    "SESSION_MAX",
    "batch_status_buffer",
    "batch_statuses",
    "batch_token",
    "prefetch_batch",
    "release_batch",
    "session_close",
    "session_open",
    "session_prefetch",
    "session_prefetch_one",
    "session_release",
    "session_release_one",
    "session_wait",
    "session_wait_buffer",
]
