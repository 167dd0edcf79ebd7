"""Config reads by the option name a user sets, and the enum names come
from the C core (chm_enum_name), not from a second list in Python."""

from __future__ import annotations

import re

import pytest

import chm
from chm import _lowlevel as _ll
from chm._ffi import lib
from chm.config import options
from chm.errors import InvalidArgument, NotFound


def test_reads_by_option_name() -> None:
    cfg = chm.Config(dram="64M", wbuf="8M", slot_size="1M", mode="lru", targets=["/a", "/b"])
    assert cfg["dram"] == 64 << 20 == cfg.dram_bytes
    assert cfg["wbuf"] == 8 << 20
    assert cfg["slot_size"] == cfg["slot-size"] == 1 << 20  # the dashed alias set() takes
    assert cfg["mode"] == "lru"
    assert cfg["pool"] == "anon"
    assert cfg["targets"] == ["/a", "/b"]
    assert cfg["numa_node"] == -1
    assert cfg["timing"] == "none"
    assert chm.Config(timing="fpga-cxlhm")["timing"] == "fpga-cxlhm"
    assert chm.Config(timing="fpga-cxlhm", link_lat_ns=1)["timing"] == "custom"
    # struct fields still read as before
    assert cfg["dram_bytes"] == 64 << 20 and cfg["pool_kind"] == "anon"


def test_every_option_reads_back_what_was_set() -> None:
    """Each option's value read by name sets an equal Config."""
    base = chm.Config(backend="ghost", timing="gen5-tlc-200g")
    copy = chm.Config()
    for o in options():
        copy.set(o.name, base[o.name])
    assert copy == base


def test_unknown_key_names_the_options() -> None:
    with pytest.raises(KeyError) as info:
        chm.Config()["dram_size"]
    text = str(info.value)
    assert "'dram_size' is not an option" in text
    for name in ("dram", "wbuf", "slot_size", "capacity"):
        assert re.search(rf"\b{name}\b", text)
    assert chm.Config().get("dram_size", 7) == 7


def test_enum_tables_are_the_c_cores() -> None:
    kinds = {
        "BACKEND": _ll.BACKENDS,
        "MODE": _ll.MODES,
        "POOL": _ll.POOL_KINDS,
        "CLOCK": _ll.CLOCKS,
        "FAULT": _ll.FAULTS,
    }
    for kind, table in kinds.items():
        k = getattr(lib, f"CHM_ENUM_{kind}")
        assert table, kind
        for name, value in table.items():
            assert _ll.enum_name(k, value) == name
            assert _ll.enum_value(k, name.upper()) == value
        assert _ll.enum_name(k, len(table)) is None
    assert _ll.MODES == {"prefetch": 0, "lru": 1, "direct": 2}
    # the internal state machines' names come from chm_state_name
    assert _ll.SLOT_STATES["draining"] == 5 and _ll.LINE_STATES["writing_back"] == 3
    with pytest.raises(NotFound, match="'nope' is not a name"):
        _ll.enum_value(lib.CHM_ENUM_MODE, "nope")
    with pytest.raises(InvalidArgument, match="unknown kind"):
        _ll.enum_value(99, "lru")
    # the option parser takes exactly these names
    for name in _ll.MODES:
        assert chm.Config(mode=name)["mode"] == name
    for name in _ll.POOL_KINDS:
        assert chm.Config(pool=name)["pool"] == name


def test_stats_repr_by_name() -> None:
    with chm.Device.open(
        capacity="16M", backend="ghost", dram="1M", wbuf="256K", slot_size="64K"
    ) as d:
        text = repr(d.stats())
    assert "mode='prefetch'" in text and "backend='ghost'" in text and "pool_kind='anon'" in text
    assert "reserved" not in text
