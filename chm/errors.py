"""Exceptions raised by chm.

Every C call returns -errno on failure; ``chm._lowlevel`` turns that into one
of the classes below. Each is a :class:`ChmError` (an :class:`OSError`, with
``.errno`` set) and, where one fits, also the matching builtin, so callers can
catch either ``chm.errors.WaitTimeout`` or ``TimeoutError``.
"""

from __future__ import annotations

import errno as _errno

__all__ = [
    "Busy",
    "Cancelled",
    "ChmError",
    "Damaged",
    "DeviceIOError",
    "InvalidArgument",
    "NoMemory",
    "NoSpace",
    "NotFound",
    "NotSupported",
    "PermissionDenied",
    "StaleHandle",
    "ViewInUse",
    "WaitTimeout",
    "WouldBlock",
    "error_for",
]


class ChmError(OSError):
    """Base class: a chm call failed with ``errno``.

    ``call`` names the C function (or driver operation) and ``detail`` holds
    extra context such as the device's one-line reason for a bad config;
    ``filename`` is the offending path where there is one (e.g. a missing
    target).
    """

    default_errno = 0

    def __init__(
        self,
        errno: int | None = None,
        message: str = "",
        *,
        call: str | None = None,
        detail: str | None = None,
    ) -> None:
        code = self.default_errno if errno is None else errno
        super().__init__(code, message)
        self.call = call
        self.detail = detail

    def __str__(self) -> str:
        return f"[Errno {self.errno}] {self.strerror}"

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild,
            (type(self), self.errno, self.strerror, self.call, self.detail, self.filename),
        )


def _rebuild(
    cls: type[ChmError],
    code: int,
    message: str,
    call: str | None,
    detail: str | None,
    filename: str | None = None,
) -> ChmError:
    err = cls(code, message, call=call, detail=detail)
    if filename is not None:
        err.filename = filename
    return err


class InvalidArgument(ChmError, ValueError):
    """EINVAL: a bad argument, range, configuration value or foreign handle."""

    default_errno = _errno.EINVAL


class NotFound(ChmError, FileNotFoundError):
    """ENOENT: no such object, option or backing target."""

    default_errno = _errno.ENOENT


class PermissionDenied(ChmError, PermissionError):
    """EACCES (or EPERM): not permitted: a backing target or scratch
    directory this process may not reach (the message names the path and
    the directory it may not search), or, through a daemon, an address or
    operation this client has no right to."""

    default_errno = _errno.EACCES


class WouldBlock(ChmError, BlockingIOError):
    """EAGAIN: the refill queue is full (or no free slot with noqueue)."""

    default_errno = _errno.EAGAIN


class NoSpace(ChmError):
    """ENOSPC: no space left: a backing target too small for its share, or
    the filesystem under a backing file full at a write-back or flush (the
    message names the file and its free space; the data stays buffered)."""

    default_errno = _errno.ENOSPC


class Busy(ChmError):
    """EBUSY: the resource is in use."""

    default_errno = _errno.EBUSY


class WaitTimeout(ChmError, TimeoutError):
    """ETIMEDOUT: the object was not staged (or flushed) in time."""

    default_errno = _errno.ETIMEDOUT


class DeviceIOError(ChmError):
    """EIO: backing I/O failed."""

    default_errno = _errno.EIO


class Damaged(ChmError):
    """EUCLEAN: stored state is damaged or inconsistent (e.g. a KV journal
    lost beside a backing that holds blocks); the message names the repair."""

    default_errno = _errno.EUCLEAN


class StaleHandle(ChmError):
    """ESTALE: the handle was already released or never issued."""

    default_errno = _errno.ESTALE


class Cancelled(ChmError):
    """ECANCELED: the device is closing or closed."""

    default_errno = _errno.ECANCELED


class NotSupported(ChmError):
    """EOPNOTSUPP: the feature (backend, pool kind, mode) is unavailable here."""

    default_errno = _errno.EOPNOTSUPP


class NoMemory(ChmError, MemoryError):
    """ENOMEM: host memory for the DRAM pool could not be obtained."""

    default_errno = _errno.ENOMEM


class ViewInUse(ChmError, BufferError):
    """A staged view is still exported (e.g. a numpy array over it is alive).

    Raised by ``Handle.release()`` and ``Device.close()``: the slot stays held
    and nothing is freed until every object viewing the memory is gone.
    """

    default_errno = _errno.EBUSY


_BY_ERRNO: dict[int, type[ChmError]] = {
    _errno.EINVAL: InvalidArgument,
    _errno.ENOENT: NotFound,
    _errno.EAGAIN: WouldBlock,
    _errno.ENOSPC: NoSpace,
    _errno.EBUSY: Busy,
    _errno.ETIMEDOUT: WaitTimeout,
    _errno.EIO: DeviceIOError,
    _errno.ESTALE: StaleHandle,
    _errno.EUCLEAN: Damaged,
    _errno.ECANCELED: Cancelled,
    _errno.EOPNOTSUPP: NotSupported,
    _errno.ENOMEM: NoMemory,
    _errno.EACCES: PermissionDenied,
    _errno.EPERM: PermissionDenied,
}


def error_for(code: int) -> type[ChmError]:
    """Returns the exception class for a positive errno value."""
    return _BY_ERRNO.get(code, ChmError)
