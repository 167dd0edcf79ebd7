"""Every public method of chm.Device (and chm.Session) that takes a device
address or length states its alignment rule in its docstring, and the rule
it states is the rule the device enforces."""

from __future__ import annotations

import inspect

import pytest

import chm
from chm.device import Session
from chm.errors import InvalidArgument

_ADDRESSING = {"addr", "addrs", "length", "lengths", "data", "datas", "buf"}


def _addressing_methods(cls: type) -> list[str]:
    out = []
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_"):
            continue
        if _ADDRESSING & set(inspect.signature(fn).parameters):
            out.append(name)
    return out


@pytest.mark.parametrize("cls", [chm.Device, Session])
def test_every_addressing_method_states_its_alignment(cls: type) -> None:
    names = _addressing_methods(cls)
    assert {"prefetch", "prefetch_many"} <= set(names)
    for name in names:
        doc = inspect.getdoc(getattr(cls, name)) or ""
        assert "Alignment:" in doc, f"{cls.__name__}.{name} does not state its alignment rule"


def test_device_methods_covered() -> None:
    names = set(_addressing_methods(chm.Device))
    assert {"read", "read_into", "write", "write_many", "prefetch", "prefetch_batch"} <= names
    for name in ("write", "write_many"):
        assert "512" in (inspect.getdoc(getattr(chm.Device, name)) or "")
    for name in ("read", "read_into", "prefetch", "prefetch_many", "prefetch_batch"):
        assert "Alignment: none" in (inspect.getdoc(getattr(chm.Device, name)) or "")


def test_the_stated_rules_hold() -> None:
    with chm.Device.open(
        capacity="16M", backend="ghost", dram="1M", wbuf="256K", slot_size="64K"
    ) as d:
        with pytest.raises(InvalidArgument, match="addr 0x7b is not a multiple of 512"):
            d.write(0x7B, b"\0" * 512)
        with pytest.raises(InvalidArgument, match="len 513 is not a multiple of 512"):
            d.write(0, b"\0" * 513)
        out = d.write_many([512, 0x7B], [b"\0" * 512, b"\0" * 512])
        assert out[0] is True and isinstance(out[1], InvalidArgument)
        assert len(d.read(0x7B, 5)) == 5
        buf = bytearray(3)
        assert d.read_into(4095, buf) == 3
        with d.prefetch(4095, 3) as h:
            assert len(h.wait(10)) == 3
