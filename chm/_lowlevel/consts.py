"""Constants of include/chm.h and the types the wrappers hand out."""

from __future__ import annotations

from typing import Any

from chm._ffi import lib
from chm._robuf import ReadOnlyBuffer

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
