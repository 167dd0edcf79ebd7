"""object_size: defaults sized from the caller's object, and objects no slot or
write buffer can take reported as configuration errors, not skips."""

from __future__ import annotations

import pytest

import chm
from chm.errors import InvalidArgument

MIB = 1 << 20
GHOST = dict(backend="ghost", capacity="1T", dram="1G")


def test_object_size_sizes_the_default_slot_and_write_buffer() -> None:
    cfg = chm.Config(object_size="64M")
    assert cfg.slot_bytes == 64 * MIB
    assert cfg.wbuf_bytes == 128 * MIB  # two objects: one flushing, one arriving
    small = chm.Config(object_size="1M")  # smaller than the defaults: unchanged
    assert (small.slot_bytes, small.wbuf_bytes) == (32 * MIB, 32 * MIB)
    with chm.Device.open(object_size="64M", **GHOST) as dev:
        assert dev.write_length(0, 64 * MIB) is True
        with dev.prefetch(64 * MIB, 64 * MIB) as h:
            assert len(h.wait(1.0)) == 64 * MIB


def test_an_explicit_size_smaller_than_the_object_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match=r"object_size: 67108864-byte .* slot_size 16777216"):
        chm.Device.open(slot_size="16M", object_size="64M", **GHOST)
    with pytest.raises(InvalidArgument, match=r"object_size: 67108864-byte .* wbuf 33554432"):
        chm.Device.open(wbuf="32M", object_size="64M", slot_size="64M", **GHOST)


def test_a_write_or_prefetch_larger_than_buffer_or_slot_is_a_configuration_error() -> None:
    with chm.Device.open(wbuf="32M", slot_size="16M", **GHOST) as dev:
        with pytest.raises(InvalidArgument, match=r"len 67108864 .*\(wbuf 33554432\).*object_size"):
            dev.write_length(0, 64 * MIB)
        with pytest.raises(InvalidArgument, match=r"len 67108864 .*\(slot_size 16777216\)"):
            dev.prefetch(0, 64 * MIB)
        st = dev.stats()
        assert (st.wr_admitted, st.wr_skipped, st.prefetch_issued) == (0, 0, 0)
        assert dev.write_length(0, 32 * MIB) is True  # a whole buffer still fits
