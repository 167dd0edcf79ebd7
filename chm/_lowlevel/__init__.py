"""1:1 typed wrappers over include/chm.h.

The wrappers live by concern: ``consts`` (the header's constants), ``check``
(the error choke point), ``names`` (enumerations and state names), ``config``,
``device`` (open/close, prefetch, data path, stats, batches, faults) and
``session``; this package re-exports them all, and the layers above use only
``chm._lowlevel``.

This package and ``chm._ffi`` are the only ones that touch ``ffi``/``lib``.
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

from chm._lowlevel.check import _check, last_error_detail, last_error_path, status_error, strerror
from chm._lowlevel.config import (
    config_copy,
    config_get,
    config_init,
    config_new,
    config_option,
    config_options,
    config_set,
    config_to_dict,
    config_validate,
    parse_size,
    struct_fields,
    timing_preset,
    version,
)
from chm._lowlevel.consts import (
    ERRMSG_MAX,
    HIST_BUCKETS,
    IO_ALIGN,
    MAX_TARGETS,
    PATH_MAX,
    PF_NOQUEUE,
    PF_RETAIN,
    UINT64_MAX,
    VERSION_TUPLE,
    WRITE_SKIPPED,
    Buffer,
    CData,
)
from chm._lowlevel.device import (
    BATCH_MAX,
    advance_clock,
    clock_ns,
    dev_close,
    dev_config,
    dev_lost,
    dev_open,
    dev_open_err,
    dev_pool_fd,
    dev_shutdown,
    fault_inject,
    flush,
    new_stats,
    prefetch_object,
    prefetch_objects,
    prefetch_release,
    prefetch_release_many,
    prefetch_wait,
    prefetch_wait_buffer,
    read,
    read_into,
    resident_evict,
    stats,
    stats_into,
    write_length,
    write_object,
    write_objects,
)
from chm._lowlevel.names import (
    BACKENDS,
    CLOCKS,
    FAULTS,
    LINE_STATES,
    MODES,
    POOL_KINDS,
    RESIDENT_STATES,
    SLOT_STATES,
    WBUF_STATES,
    OptionInfo,
    ViewInfo,
    enum_name,
    enum_value,
    name_of,
    state_name,
)
from chm._lowlevel.session import (
    SESSION_DEFAULT,
    SESSION_MAX,
    batch_status_buffer,
    batch_statuses,
    batch_token,
    prefetch_batch,
    release_batch,
    session_close,
    session_open,
    session_prefetch,
    session_prefetch_one,
    session_release,
    session_release_one,
    session_wait,
    session_wait_buffer,
    session_wait_status,
)
from chm._robuf import ReadOnlyBuffer
from chm.errors import ChmError

__all__ = [
    "BACKENDS",
    "BATCH_MAX",
    "Buffer",
    "CData",
    "CLOCKS",
    "ChmError",
    "ERRMSG_MAX",
    "FAULTS",
    "HIST_BUCKETS",
    "IO_ALIGN",
    "LINE_STATES",
    "MAX_TARGETS",
    "MODES",
    "OptionInfo",
    "PATH_MAX",
    "PF_NOQUEUE",
    "PF_RETAIN",
    "POOL_KINDS",
    "RESIDENT_STATES",
    "ReadOnlyBuffer",
    "SESSION_DEFAULT",
    "SESSION_MAX",
    "SLOT_STATES",
    "UINT64_MAX",
    "VERSION_TUPLE",
    "ViewInfo",
    "WBUF_STATES",
    "WRITE_SKIPPED",
    "_check",
    "advance_clock",
    "batch_status_buffer",
    "batch_statuses",
    "batch_token",
    "clock_ns",
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
    "dev_config",
    "dev_lost",
    "dev_open",
    "dev_open_err",
    "dev_pool_fd",
    "dev_shutdown",
    "enum_name",
    "enum_value",
    "fault_inject",
    "flush",
    "last_error_detail",
    "last_error_path",
    "name_of",
    "new_stats",
    "parse_size",
    "prefetch_batch",
    "prefetch_object",
    "prefetch_objects",
    "prefetch_release",
    "prefetch_release_many",
    "prefetch_wait",
    "prefetch_wait_buffer",
    "read",
    "read_into",
    "release_batch",
    "resident_evict",
    "session_close",
    "session_open",
    "session_prefetch",
    "session_prefetch_one",
    "session_release",
    "session_release_one",
    "session_wait",
    "session_wait_buffer",
    "session_wait_status",
    "state_name",
    "stats",
    "stats_into",
    "status_error",
    "strerror",
    "struct_fields",
    "timing_preset",
    "version",
    "write_length",
    "write_object",
    "write_objects",
]
