"""Stats: a repr with enum names and no reserved fields; staged prefetches
and read() hits counted apart, so neither figure surprises."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import chm
from chm import _lowlevel as _ll

SMALL: dict[str, Any] = {"capacity": "64M", "dram": "16M", "wbuf": "4M", "slot_size": "1M"}


def test_repr_names_enums_and_hides_reserved() -> None:
    with chm.Device.open(backend="ghost", mode="lru", **SMALL) as dev:
        st = dev.stats()
    text = repr(st)
    assert "backend='ghost'" in text
    assert "mode='lru'" in text
    assert f"pool_kind={st.pool_kind_name!r}" in text
    assert st.pool_kind_name in _ll.POOL_KINDS
    assert "reserved" not in text
    assert not [f.name for f in fields(st) if f.name.startswith("reserved")]
    # every other field is in the repr, by name
    for f in fields(st):
        assert f"{f.name}=" in text
    # the fields themselves stay the C values
    assert st.backend == _ll.BACKENDS["ghost"] and st.mode == _ll.MODES["lru"]


def test_staged_prefetch_is_not_a_read() -> None:
    with chm.Device.open(backend="ghost", **SMALL) as dev:
        with dev.prefetch(0, 65536) as h:
            h.wait(timeout=10)
            staged_only = dev.stats()
            dev.read(4096, 4096)  # inside the held object: a DRAM hit
            after_hit = dev.stats()
        dev.read(1 << 24, 4096)  # never staged: an SSD miss
        after_miss = dev.stats()
    assert staged_only.staged == staged_only.prefetch_completed == 1
    assert staged_only.staged_rate == 1.0
    assert staged_only.reads == 0
    assert staged_only.read_hit_rate == staged_only.hit_rate == 0.0
    assert (after_hit.read_hits, after_hit.read_hit_rate) == (1, 1.0)
    assert after_miss.read_hit_rate == after_miss.hit_rate == 0.5
    assert after_miss.staged_rate == 1.0


def test_staged_rate_counts_what_is_still_filling() -> None:
    zero = chm.Stats()
    assert zero.staged_rate == 0.0 and zero.read_hit_rate == 0.0
    half = chm.Stats(prefetch_issued=4, prefetch_completed=2)
    assert half.staged_rate == 0.5


def test_delta_keeps_enum_gauges() -> None:
    with chm.Device.open(backend="ghost", **SMALL) as dev:
        before = dev.stats()
        with dev.prefetch(0, 4096) as h:
            h.wait(timeout=10)
        d = dev.stats() - before
    assert d.prefetch_issued == 1 and d.staged == 1
    assert d.backend_name == "ghost" and "backend='ghost'" in repr(d)
