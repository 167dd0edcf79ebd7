"""The C core's names: enumerations (backends, modes, pools, clocks,
faults), the internal state machines' states, and the result tuples."""

from __future__ import annotations

from typing import NamedTuple

from chm._ffi import ffi, lib
from chm._lowlevel.check import _arg_error, _check
from chm._lowlevel.consts import Buffer


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
