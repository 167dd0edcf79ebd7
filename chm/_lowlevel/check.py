"""The single choke point for errors: :func:`_check` turns a C call's
``-errno`` into the matching :mod:`chm.errors` exception, carrying
``chm_strerror()``'s text, the C core's reason, the C function's name and its
arguments; the helpers here shape the argument errors the wrappers raise
before a call."""

from __future__ import annotations

import os
from typing import Any

from chm._ffi import ffi, lib
from chm._lowlevel.consts import ERRMSG_MAX, UINT64_MAX, CData
from chm.errors import InvalidArgument, error_for


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
