"""Which I/O backend a device gets: chosen at open time unless asked for.

A configuration that leaves ``backend`` unset (or sets it to ``"auto"``)
opens with io_uring when this host allows it and with the ``pread`` backend
when it does not (io_uring disabled by the ``kernel.io_uring_disabled``
sysctl, refused by a container's seccomp filter, or missing from the
kernel). The probe is the open itself: the C core refuses a uring device
with EOPNOTSUPP and the reason ``backend uring: ...``. The first refusal is
remembered for the process, so later opens go straight to pread.

``backend="uring"`` asked for explicitly is never replaced: on such a host it
raises :class:`~chm.errors.NotSupported` naming ``backend="pread"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chm import _lowlevel as _ll
from chm.errors import NotSupported

if TYPE_CHECKING:
    from chm.config import Config

__all__ = ["AUTO", "open_device", "uring_unavailable"]

AUTO = "auto"

_URING_REFUSAL = "backend uring:"

# Why io_uring was refused in this process (None: not refused so far).
_refused: str | None = None


def uring_unavailable() -> str | None:
    """The reason a uring open was refused by this host, or None if none was."""
    return _refused


def _refusal(exc: NotSupported) -> str | None:
    """The C core's reason when exc is the uring backend refusing to start."""
    detail = exc.detail or ""
    return detail if detail.startswith(_URING_REFUSAL) else None


def _open(cfg: Config) -> _ll.CData:
    return _ll.dev_open(cfg.cdata)


def open_device(cfg: Config) -> _ll.CData:
    """Opens the C device for a validated cfg, choosing the backend if it is unset.

    cfg is the caller's private copy: an automatic fallback sets its backend
    to pread.
    """
    global _refused
    if cfg.backend != "uring":
        return _open(cfg)
    if cfg.auto_backend:
        if _refused is None:
            try:
                return _open(cfg)
            except NotSupported as exc:
                reason = _refusal(exc)
                if reason is None:
                    raise
                _refused = reason
        cfg.set("backend", "pread")
        return _open(cfg)
    try:
        return _open(cfg)
    except NotSupported as exc:
        reason = _refusal(exc)
        if reason is None:
            raise
        raise NotSupported(
            exc.errno,
            f'backend="uring": io_uring is unavailable on this host ({reason}); '
            'use backend="pread", or leave backend unset to choose it at open time',
            call=exc.call,
            detail=reason,
        ) from None
