"""Resident objects: the device's region (retain, hit, evict, coherence), the
admission policies of chm.kv.residency, and the workload the issue names: a
hot prefix shared by every request beside a one-hit-wonder stream larger
than the DRAM, where the prefix stays resident and the stream's load time
does not change."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import Cancelled, ChmError, InvalidArgument
from chm.kv import Store
from chm.kv import residency as R

MiB = 1 << 20
KiB = 1 << 10
BLK = 256 * KiB
STRIDE = BLK + 8 * KiB  # slot stride: slot_size aligned up, plus 4 KiB, plus 4 KiB fill slack


# ---- policies


def test_second_hit_retains_from_the_second_read() -> None:
    a = R.SecondHit(history=4)
    assert a.decide([1, 2]) == [False, False]
    assert a.decide([1, 3]) == [True, False]
    assert a.decide([1]) == [True]
    a.decide([4, 5, 6, 7])  # 1 falls off the horizon
    assert a.decide([1]) == [False]
    a.forget(1)
    assert a.decide([1]) == [False]


def test_shared_prefix_retains_only_a_shared_opening_block() -> None:
    a = R.SharedPrefix(depth=1)
    assert a.decide([10, 11]) == [False, False]
    assert a.decide([10, 12, 13]) == [True, False, False]
    assert a.decide([12, 10]) == [False, False]
    assert a.decide([]) == []


def test_ghost_fifo_admits_a_block_read_again_while_remembered() -> None:
    a = R.GhostFifo(ghost=2)
    assert a.decide([1, 2, 3]) == [False, False, False]  # 1 left the ghost
    assert a.decide([1, 3]) == [False, True]
    assert a.decide([3]) == [True]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_policy_arguments_are_checked(bad: Any) -> None:
    with pytest.raises(InvalidArgument):
        R.SecondHit(history=bad)
    with pytest.raises(InvalidArgument):
        R.GhostFifo(ghost=bad)


def test_unknown_policy_name() -> None:
    with pytest.raises(InvalidArgument, match="frequency"):
        R.make_admission("lfu", 8)
    assert {R.make_admission(n, 8).name for n in R.POLICIES} == set(R.POLICIES)


# ---- the device region


def _pattern(addr: int, n: int, salt: int) -> bytes:
    return (np.arange(addr, addr + n, dtype=np.uint64) * 31 + salt).astype(np.uint8).tobytes()


@pytest.fixture
def rdev(make_device: Callable[..., chm.Device]) -> chm.Device:
    return make_device(
        capacity="16M", dram="4M", wbuf="1M", slot_size=BLK, slots=4, resident=4 * STRIDE
    )


def test_retained_object_is_served_from_dram(rdev: chm.Device) -> None:
    for i in range(6):
        assert rdev.write(i * BLK, _pattern(i * BLK, BLK, 1))
        rdev.flush()  # the 1 MiB write buffer holds a few blocks at a time
    s0 = rdev.stats()
    assert s0.resident_entries_total == 4
    with rdev.prefetch(0, BLK, retain=True) as h:
        assert bytes(h.wait()) == _pattern(0, BLK, 1)
    s1 = rdev.stats()
    with rdev.prefetch(0, BLK) as h:
        assert bytes(h.wait()) == _pattern(0, BLK, 1)
    d = rdev.stats() - s1
    assert (d.resident_hits, d.resident_misses, d.bytes_read_ssd) == (1, 0, 0)
    assert (s1 - s0).resident_retained == 1
    # a write over it drops the unheld entry: the next read has the new bytes
    assert rdev.write(0, _pattern(0, BLK, 2))
    assert rdev.stats().resident_entries_used == 0
    with rdev.prefetch(0, BLK, retain=True) as h:
        assert bytes(h.wait()) == _pattern(0, BLK, 2)
    with rdev.prefetch(0, BLK) as h:
        assert bytes(h.wait()) == _pattern(0, BLK, 2)
    assert (rdev.stats() - s1).resident_hits == 2
    assert rdev.resident_evict(0, BLK) == 1
    assert rdev.stats().resident_entries_used == 0
    rdev.flush()


def test_held_resident_view_is_a_snapshot(rdev: chm.Device) -> None:
    assert rdev.write(0, _pattern(0, BLK, 1))
    with rdev.prefetch(0, BLK, retain=True) as h:
        h.wait()
    h = rdev.prefetch(0, BLK)
    v = h.wait()
    assert rdev.write(0, _pattern(0, BLK, 3))
    assert bytes(v) == _pattern(0, BLK, 1)  # W11 / R3
    del v
    s = rdev.stats()
    with rdev.prefetch(0, BLK) as h2:  # the entry is stale: no hit, the new bytes
        assert bytes(h2.wait()) == _pattern(0, BLK, 3)
    assert (rdev.stats() - s).resident_hits == 0
    h.release()
    assert rdev.stats().resident_entries_used == 0
    rdev.flush()


def test_bad_input(rdev: chm.Device, make_device: Callable[..., chm.Device]) -> None:
    with pytest.raises(InvalidArgument):
        rdev.resident_evict(0, 0)
    with pytest.raises(InvalidArgument):
        rdev.resident_evict(16 * MiB, 1)
    with pytest.raises(TypeError):
        rdev.resident_evict(0, "1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        rdev.resident_evict(True, 1)
    with pytest.raises(InvalidArgument, match="resident"):
        make_device(mode="lru", resident="1M")
    with pytest.raises(InvalidArgument, match="resident"):
        make_device(dram="4M", wbuf="1M", resident="3M")
    plain = make_device()
    assert plain.stats().resident_entries_total == 0
    assert plain.resident_evict(0, BLK) == 0
    with plain.prefetch(0, 4096, retain=True) as h:  # no region: no effect
        h.wait()
    assert plain.stats().resident_retained == 0
    plain.close()
    with pytest.raises(Cancelled):
        plain.resident_evict(0, BLK)


# ---- the workload: a shared hot prefix beside a one-hit-wonder stream


def _virtual(resident: int) -> chm.Device:
    return chm.Device.open(
        backend="ghost",
        clock="virtual",
        capacity="4G",
        dram=8 * STRIDE + resident + MiB,
        wbuf="1M",
        slot_size=BLK,
        timing="fpga-cxlhm",
        resident=resident,
    )


def _stream_and_prefix(resident: int) -> tuple[list[int], list[int], chm.Stats]:
    """Per request: the 2-block hot prefix, then 16 new blocks (64 requests:
    1024 one-hit blocks, 32x the DRAM). Returns the virtual ns of each
    request's prefix and of its stream, and the final stats."""
    dev = _virtual(resident)
    try:
        st = dev.stats()
        adm = R.make_admission(R.DEFAULT, st.resident_entries_total) if resident else None
        hot = [(0, BLK), (BLK, BLK)]
        nxt = 2 * BLK
        prefix_ns, stream_ns = [], []
        for _ in range(64):
            t0 = dev.stats().clock_now_ns
            R.load_blocks(dev, hot, adm, 8)
            t1 = dev.stats().clock_now_ns
            stream = [(nxt + i * BLK, BLK) for i in range(16)]
            nxt += 16 * BLK
            R.load_blocks(dev, stream, adm, 8)
            t2 = dev.stats().clock_now_ns
            prefix_ns.append(t1 - t0)
            stream_ns.append(t2 - t1)
        return prefix_ns, stream_ns, dev.stats()
    finally:
        dev.close()


def test_hot_prefix_stays_resident_and_the_stream_is_unchanged() -> None:
    p_off, s_off, st_off = _stream_and_prefix(0)
    p_on, s_on, st_on = _stream_and_prefix(2 * STRIDE)
    # the prefix is read from the SSD twice (the second read retains it),
    # then every request finds both blocks resident, through 1024 one-hit
    # blocks that never enter the region
    assert st_on.resident_retained == 2
    assert st_on.resident_hits == 2 * 62
    assert st_on.resident_evictions == 0
    assert st_on.resident_entries_used == 2
    assert st_off.resident_hits == 0
    # the stream takes the same virtual time per request with the region
    # as without it (and the same SSD bytes); the prefix loads faster
    assert s_on == s_off
    assert st_on.bytes_read_ssd == st_off.bytes_read_ssd - 2 * 62 * BLK
    assert sum(p_on[2:]) < sum(p_off[2:])


# ---- the Store, bytes verified


@pytest.fixture
def open_store(tmp_backing: Path) -> Iterator[Callable[..., Store]]:
    made: list[Store] = []

    def make(**kw: Any) -> Store:
        st = Store.open(
            tmp_backing,
            backend="pread",
            capacity="64M",
            dram=8 * STRIDE + 2 * STRIDE + 2 * MiB,
            slot_size=BLK,
            device_options={"wbuf": "2M", "resident": 2 * STRIDE},
            **kw,
        )
        made.append(st)
        return st

    yield make
    for st in made:
        with contextlib.suppress(ChmError):
            st.close()


def _blk(i: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).integers(0, 256, BLK, dtype=np.uint8)


def test_store_keeps_the_hot_prefix_resident(open_store: Callable[..., Store]) -> None:
    st = open_store()
    assert st.admission is not None and st.admission.name == R.DEFAULT
    keys = list(range(2 + 40))  # 2 hot blocks, then 40 one-hit blocks (10 MiB > DRAM)
    for k in keys:
        st.put([k], [_blk(k)])
        st.flush()
    s0 = st.device.stats()
    out = [np.zeros(BLK, np.uint8) for _ in range(6)]
    for r in range(10):
        ks = [0, 1, *keys[2 + 4 * r : 6 + 4 * r]]
        assert st.load_prefix(ks, out) == 6
        for k, o in zip(ks, out, strict=True):
            assert np.array_equal(o, _blk(k))
    d = st.device.stats() - s0
    assert d.resident_retained == 2
    assert d.resident_hits == 2 * 8
    assert d.bytes_read_ssd == (2 * 2 + 40) * BLK


def test_store_without_residency(open_store: Callable[..., Store]) -> None:
    st = open_store(residency=None)
    assert st.admission is None
    st.put([7], [_blk(7)])
    out = [np.zeros(BLK, np.uint8)]
    for _ in range(3):
        assert st.get([7], out) == [True]
    assert st.device.stats().resident_retained == 0
    st.close()
    with pytest.raises(InvalidArgument):
        open_store(residency="sometimes")
