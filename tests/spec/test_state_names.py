"""The internal state machines reach Python by name, through chm_state_name().

The state enums live in csrc/states.h, not in the public header; the C core
names each state (the fw_spec name in lowercase) and chm._lowlevel builds its
SLOT_STATES / WBUF_STATES / LINE_STATES / RESIDENT_STATES tables from those names. They must be
the spec's states, values and all, and out-of-range questions answer NULL.
"""

from __future__ import annotations

import pytest
import specdata

from chm import _lowlevel as ll
from chm._ffi import ffi, lib

MACHINES = specdata.machines(specdata.load())
TABLES = {
    "slot": (ll.SLOT_STATES, lib.CHM_STATE_SLOT),
    "entry": (ll.WBUF_STATES, lib.CHM_STATE_WBUF),
    "line": (ll.LINE_STATES, lib.CHM_STATE_LINE),
    "resident": (ll.RESIDENT_STATES, lib.CHM_STATE_RESIDENT),
}


@pytest.mark.parametrize("machine", sorted(TABLES))
def test_names_are_the_specs(machine: str) -> None:
    table, _ = TABLES[machine]
    spec = {s["name"].lower(): s["value"] for s in MACHINES[machine]["states"]}
    assert table == spec


@pytest.mark.parametrize("machine", sorted(TABLES))
def test_out_of_range_is_null(machine: str) -> None:
    table, kind = TABLES[machine]
    assert lib.chm_state_name(kind, len(table)) == ffi.NULL
    assert lib.chm_state_name(kind, -1) == ffi.NULL


def test_unknown_kind_is_null() -> None:
    assert lib.chm_state_name(4, 0) == ffi.NULL
    assert lib.chm_state_name(-1, 0) == ffi.NULL
