"""chm: a userspace CXL hybrid-memory device (DRAM in front of SSD) and its driver.

Example::

    import chm

    with chm.Device.open(capacity="64G", backend="pread") as dev:
        with dev.prefetch(0, 16 << 20) as h:
            data = bytes(h.wait())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chm import errors
from chm._lowlevel import version as _c_version
from chm.config import Config, OptionInfo, options
from chm.device import Device, Handle, HandleBatch, Session
from chm.errors import ChmError
from chm.sizes import format_size, parse_size
from chm.stats import Stats

if TYPE_CHECKING:
    from chm.remote import RemoteDevice

__version__ = "0.1.0"

__all__ = [
    "ChmError",
    "Config",
    "Device",
    "Handle",
    "HandleBatch",
    "Session",
    "OptionInfo",
    "Stats",
    "errors",
    "connect",
    "format_size",
    "options",
    "parse_size",
    "version",
]


def version() -> str:
    """The C core's version as "MAJOR.MINOR.PATCH"."""
    v = _c_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def connect(
    path: str,
    timeout: float = 10.0,
    request_timeout: float = 30.0,
    secret_file: str | None = None,
) -> RemoteDevice:
    """Connects to a ``chm-emu serve`` daemon: a device (``chm.kv.DeviceLike``)
    whose staged objects are read zero-copy; see :func:`chm.remote.connect`
    for the two deadlines and ``tcp://HOST:PORT`` with ``secret_file``."""
    from chm.remote import connect as _connect

    return _connect(path, timeout, request_timeout, secret_file)
