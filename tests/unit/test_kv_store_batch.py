"""The store's additions for replays: payload-less batched puts on ghost,
``touch``, a capacity below the device's, ``block_bytes``, close without a
flush, and the allocator's heaps against the scans they replace."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import InvalidArgument
from chm.kv import PutStatus, Store
from chm.kv.alloc import FREE, SEALED, SegmentLog

MiB = 1 << 20
S, E, K = PutStatus.STORED, PutStatus.EXISTS, PutStatus.SKIPPED


def _ghost(mode: str = "prefetch", **kw: Any) -> chm.Device:
    opts: dict[str, Any] = dict(
        backend="ghost", clock="virtual", capacity="64M", mode=mode, timing="fpga-cxlhm"
    )
    if mode == "prefetch":
        opts.update(dram="32M", slot_size="1M", wbuf="16M")
    else:
        opts.update(dram="8M")
    opts.update(kw)
    return chm.Device.open(**opts)


def _lru_store(dev: chm.Device, tmp: Path, blocks: int, **kw: Any) -> Store:
    # one 1 MiB block per segment over ``blocks`` places: exact block LRU (a
    # block that has bytes takes 4 KiB more: its header)
    seg = MiB if dev.config.backend == "ghost" else MiB + 4096
    return Store(
        dev,
        journal=tmp / "j.kvjournal",
        segment_bytes=seg,
        block_bytes=MiB,
        capacity=blocks * seg,
        residency=None,
        **kw,
    )


def test_put_lengths_statuses_and_loads_by_hand(tmp_path: Path) -> None:
    with _ghost() as dev, _lru_store(dev, tmp_path, 4) as st:
        assert st.put_lengths([1, 2, 1], MiB) == [S, S, E]  # the repeat is EXISTS
        assert st.put_lengths([2, 3], [MiB, 4096]) == [E, S]
        assert st.contains([1, 2, 3, 4]) == [True, True, True, False]
        e = st.info(3)
        assert e is not None and e["length"] == 4096 and e["checksum"] == 0
        dst = np.zeros(MiB, np.uint8)
        assert st.load_prefix([1, 2, 3, 4], [dst] * 4) == 3
        s = st.stats()
        assert (s.puts_stored, s.puts_exists, s.entries, s.pending_entries) == (3, 2, 3, 3)
        assert s.live_bytes == 2 * MiB + 4096


def test_put_lengths_evicts_in_lru_order_with_touch(tmp_path: Path) -> None:
    # 3 places: 10 11 12 stored; 10 touched by a later put, so 13 evicts 11
    # (order 12 10 13); 12 put again without touch keeps its recency, so 14
    # evicts it.
    with _ghost() as dev, _lru_store(dev, tmp_path, 3) as st:
        assert st.put_lengths([10, 11, 12], MiB) == [S, S, S]
        assert st.put_lengths([10, 13], MiB, touch=True) == [E, S]
        assert st.contains([10, 11, 12, 13]) == [True, False, True, True]
        assert st.put_lengths([12, 14], MiB) == [E, S]  # 12 not touched: it goes
        assert st.contains([10, 12, 13, 14]) == [True, False, True, True]
        assert st.stats().evicted_blocks == 2


def test_put_lengths_matches_an_lru_model_and_recovers(tmp_path: Path) -> None:
    # random batches (with repeats, and keys evicted by earlier puts of the
    # same batch) against an OrderedDict LRU; then the journal reopens to
    # the same contents
    rng = random.Random(7)
    places = 8
    model: OrderedDict[int, None] = OrderedDict()
    with _ghost() as dev:
        st = _lru_store(dev, tmp_path, places)
        for _ in range(300):
            batch = [rng.randrange(30) for _ in range(rng.randrange(1, 12))]
            want = []
            for k in batch:
                if k in model:
                    model.move_to_end(k)
                    want.append(E)
                else:
                    if len(model) == places:
                        model.popitem(last=False)
                    model[k] = None
                    want.append(S)
            dev.advance_clock(dev.clock_ns() + 10**9)  # the write buffer drains
            assert st.put_lengths(batch, MiB, touch=True) == want
            assert st.contains(list(range(30))) == [k in model for k in range(30)]
            assert len(st) == len(model)
            assert st.stats().live_bytes == len(model) * MiB
            if rng.random() < 0.1:
                st.flush()
        st.flush()
        st.close(flush=False)
    with _ghost() as dev, _lru_store(dev, tmp_path, places) as st2:
        assert st2.stats().recovered_entries == len(model)
        assert st2.contains(list(range(30))) == [k in model for k in range(30)]


def test_a_skipped_put_length_is_not_indexed(tmp_path: Path) -> None:
    # a 2 MiB write buffer holds two 1 MiB blocks at once: the third is
    # skipped (the modeled SSD has not drained it at a standing clock)
    with _ghost(wbuf="2M") as dev, _lru_store(dev, tmp_path, 16) as st:
        out = st.put_lengths([1, 2, 3, 4], MiB)
        assert out[:2] == [S, S] and K in out
        assert st.contains([1, 2, 3, 4]) == [s == S for s in out]
        assert st.stats().puts_skipped == out.count(K)


def test_put_lengths_bad_input(tmp_path: Path, make_device: Callable[..., chm.Device]) -> None:
    with _ghost() as dev, _lru_store(dev, tmp_path, 4) as st:
        with pytest.raises(InvalidArgument, match="2 keys but 3 lengths"):
            st.put_lengths([1, 2], [MiB, MiB, MiB])
        with pytest.raises(InvalidArgument, match=r"1\.\.1048576 bytes"):
            st.put_lengths([1], 2 * MiB)
        with pytest.raises(InvalidArgument, match=r"1\.\.1048576 bytes"):
            st.put_lengths([1], 0)
    with (
        make_device("pread") as dev,
        Store(dev) as st,
        pytest.raises(InvalidArgument, match="moves data"),
    ):
        st.put_lengths([1], MiB)


def test_lru_mode_ghost_loads_run_without_verifying(tmp_path: Path) -> None:
    with _ghost("lru") as dev, _lru_store(dev, tmp_path, 8) as st:
        assert st.read_path == "direct"
        assert st.put_lengths([1, 2], MiB) == [S, S]
        dst = np.zeros(MiB, np.uint8)
        assert st.load_prefix([1, 2], [dst, dst]) == 2  # checksum 0, never checked
        assert st.stats().checksum_errors == 0
        assert dev.stats().lru_hits + dev.stats().lru_misses > 0


def test_data_put_with_touch_orders_eviction(
    tmp_path: Path, make_device: Callable[..., chm.Device]
) -> None:
    with (
        make_device("pread", wbuf="8M") as dev,
        _lru_store(dev, tmp_path, 3) as st,
    ):
        b = np.ones(MiB, np.uint8)
        assert st.put([1, 2, 3], [b, b, b]) == [S, S, S]
        assert st.put([1, 4], [b, b], touch=True) == [E, S]
        assert st.contains([1, 2, 3, 4]) == [True, False, True, True]


def test_capacity_and_block_bytes_options(tmp_path: Path) -> None:
    with _ghost() as dev:
        with pytest.raises(InvalidArgument, match="capacity="):
            Store(dev, journal=tmp_path / "a", capacity=128 * MiB)
        with pytest.raises(InvalidArgument, match="block_bytes="):
            Store(dev, journal=tmp_path / "b", block_bytes=2 * MiB)
        with pytest.raises(InvalidArgument, match="smaller than block_bytes"):
            Store(dev, journal=tmp_path / "c", block_bytes=MiB // 2, segment_bytes=MiB // 4)
        with Store(
            dev, journal=tmp_path / "d", capacity=8 * MiB, segment_bytes=MiB, block_bytes=MiB
        ) as st:
            assert st.stats().capacity_bytes == 8 * MiB and st.stats().segments == 8
            for i in range(0, 20, 4):
                dev.advance_clock(dev.clock_ns() + 10**9)
                assert st.put_lengths(list(range(i, i + 4)), MiB) == [S] * 4
            assert len(st) == 8
            assert all(
                e is not None and e["addr"] < 8 * MiB for e in st.entries(list(range(12, 20)))
            )


def test_close_without_flush_journals_nothing_pending(tmp_path: Path) -> None:
    with _ghost() as dev:
        st = _lru_store(dev, tmp_path, 8)
        st.put_lengths([1, 2], MiB)
        st.flush()
        st.put_lengths([3], MiB)
        st.close(flush=False)
        assert st.closed
        st.close()  # idempotent
        with _lru_store(dev, tmp_path, 8) as st2:
            assert st2.contains([1, 2, 3]) == [True, True, False]


@pytest.mark.parametrize("eviction", ["lru", "fifo"])
def test_allocator_heaps_pick_what_the_scans_did(eviction: str) -> None:
    # the free segment and the victim from the heaps, against the scans over
    # every segment that they replace (lowest free number; argmin of the key
    # over sealed unpinned segments), through random allocs, touches, pins,
    # skips and reclaims
    rng = random.Random(3)
    log = SegmentLog(16 * 4096, 2 * 4096, eviction)
    live: list[tuple[int, int]] = []

    def scan() -> int | None:
        cand = (log.state == SEALED) & (log.pins == 0)
        key = log.last_use if eviction == "lru" else log.sealed_at
        return int(np.where(cand, key, np.iinfo(np.int64).max).argmin()) if cand.any() else None

    for _ in range(3000):
        op = rng.random()
        if op < 0.5:
            free = np.flatnonzero(log.state == FREE)
            opened = log._open
            got = log.alloc(4096)
            if got is None:  # (it may have sealed the open segment first)
                v = log.victim()
                assert v == scan()
                if v is not None:
                    log.reuse(v)
                continue
            if opened < 0 or got[0] != opened:
                assert free.size and got[0] == int(free[0])
            live.append(got)
            if rng.random() < 0.2:  # a skipped write gives it back
                log.unalloc(got[0], got[1], 4096)
        elif op < 0.7:
            segs = [rng.randrange(log.n) for _ in range(rng.randrange(1, 4))]
            if rng.random() < 0.5:
                log.touch(segs)
            else:
                log.touch_one(segs[0])
        elif op < 0.85:
            s = rng.randrange(log.n)
            if log.pins[s] and rng.random() < 0.6:
                log.pin([s], -1)
            else:
                log.pin([s])
        else:
            assert log.victim() == scan()


def test_data_put_stores_again_a_key_evicted_earlier_in_the_call(
    tmp_path: Path, make_device: Callable[..., chm.Device]
) -> None:
    # 3 places, no touch: a key the call's own puts evicted is absent, so
    # its later put stores it (an EXISTS would leave it out of the store)
    blocks = {k: np.full(MiB, k, np.uint8) for k in range(1, 5)}
    with make_device("pread", wbuf="8M") as dev:
        with _lru_store(dev, tmp_path, 3) as st:
            # 4 evicts 1, then the repeated 1 evicts 2
            assert st.put([1, 2, 3, 4, 1], [blocks[k] for k in (1, 2, 3, 4, 1)]) == [S] * 5
            assert st.contains([1, 2, 3, 4]) == [True, False, True, True]
            st.flush()
            # 3 was present when the call began; 5 evicts it, then 3 evicts 4
            assert st.put([5, 3], [blocks[1], blocks[3]]) == [S, S]
            assert st.contains([1, 3, 4, 5]) == [True, True, False, True]
            s = st.stats()
            assert (s.entries, s.evicted_blocks, s.live_bytes) == (3, 4, 3 * MiB)
            dst = [np.zeros(MiB, np.uint8) for _ in range(3)]
            assert st.get([1, 3, 5], dst) == [True] * 3
            assert [int(d[0]) for d in dst] == [1, 3, 1] and all((d == d[0]).all() for d in dst)
        with _lru_store(dev, tmp_path, 3) as st2:
            assert st2.contains([1, 2, 3, 4, 5]) == [True, False, True, False, True]


def test_reclaims_journal_only_segments_with_journaled_blocks(
    tmp_path: Path, make_device: Callable[..., chm.Device]
) -> None:
    # evicting blocks never flushed writes no RECLAIM record (replay has no
    # PUT of them to drop); evicting flushed ones does, and a reopen finds
    # exactly the blocks that were in the store
    b = np.ones(MiB, np.uint8)
    with make_device("pread", wbuf="8M") as dev:
        with _lru_store(dev, tmp_path, 3) as st:
            assert st.put(list(range(6)), [b] * 6) == [S] * 6
            assert st.stats().evicted_blocks == 3
            assert st.stats().journal_records == 0
            st.flush()
            assert st.stats().journal_records == 3  # the PUTs of 3 4 5
            assert st.put([6, 7], [b, b]) == [S, S]  # evicts 3 and 4: two RECLAIMs
            assert st.stats().journal_records == 5
            st.flush()
            assert st.stats().journal_records == 7
            st.close(flush=False)
        with _lru_store(dev, tmp_path, 3) as st2:
            assert st2.stats().recovered_entries == 3
            assert st2.contains(list(range(8))) == [False] * 5 + [True] * 3
