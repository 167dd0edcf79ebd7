"""A bool is not an address, a length, a token or a count.

``dev.prefetch(True, 4096)`` staged address 1. Everywhere the public API
takes an integer, a bool is refused with InvalidArgument (as timeouts and
sizes already refused bools), naming the call and the argument; nothing is
issued or leaked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import chm
from chm.errors import InvalidArgument

MakeDevice = Callable[..., chm.Device]

CALLS: list[tuple[str, Callable[[chm.Device], Any], str]] = [
    ("prefetch addr", lambda d: d.prefetch(True, 4096), "addr=True"),
    ("prefetch len", lambda d: d.prefetch(0, True), "len=True"),
    ("read addr", lambda d: d.read(True, 4), "addr=True"),
    ("read len", lambda d: d.read(0, True), "len=True"),
    ("read_into addr", lambda d: d.read_into(False, bytearray(4)), "addr=False"),
    ("write addr", lambda d: d.write(False, b"x" * 512), "addr=False"),
    ("adopt", lambda d: d.adopt(True), "True"),
    ("fault kind", lambda d: d.inject_fault(True), "True"),
    ("fault nth", lambda d: d.inject_fault("eio_read", nth=True), "nth=True"),
    ("fault arg", lambda d: d.inject_fault("slow", 1, arg=True), "arg=True"),
    ("wait timeout", lambda d: d.prefetch(0, 4096).wait(timeout=True), "True"),
    ("flush timeout", lambda d: d.flush(timeout=False), "False"),
]


@pytest.mark.parametrize(("name", "call", "shown"), CALLS, ids=[c[0] for c in CALLS])
def test_bool_is_refused(
    make_device: MakeDevice, name: str, call: Callable[[chm.Device], Any], shown: str
) -> None:
    dev = make_device()
    with pytest.raises(InvalidArgument) as info:
        call(dev)
    assert type(info.value) is InvalidArgument
    assert shown in str(info.value), str(info.value)
    st = dev.stats()
    assert st.prefetch_issued <= 1 and st.read_hits + st.read_misses == 0
    assert st.wr_admitted + st.wr_skipped == 0


@pytest.mark.parametrize("key", ["capacity", "dram", "slot_size"])
def test_bool_sizes_are_refused(key: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        chm.Config(**{key: True})
    assert type(info.value) is InvalidArgument
