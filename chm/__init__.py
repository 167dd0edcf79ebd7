"""chm: a userspace CXL hybrid-memory device (DRAM in front of SSD) and its driver.

Example::

    import chm

    with chm.Device.open(capacity="64G", backend="pread") as dev:
        with dev.prefetch(0, 16 << 20) as h:
            data = bytes(h.wait())
"""

from __future__ import annotations

from chm import errors, kv
from chm._lowlevel import version as _c_version
from chm.config import Config, OptionInfo, options
from chm.device import Device, Handle
from chm.errors import ChmError
from chm.remote import connect
from chm.sizes import format_size, parse_size
from chm.stats import Stats

__version__ = "0.1.0"

__all__ = [
    "ChmError",
    "Config",
    "Device",
    "Handle",
    "OptionInfo",
    "Stats",
    "errors",
    "format_size",
    "connect",
    "kv",
    "options",
    "parse_size",
    "version",
]


def version() -> str:
    """The C core's version as "MAJOR.MINOR.PATCH"."""
    v = _c_version()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
