"""Prefix lookup: stop at the first miss, at most 32 keys, prefetches issued at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from chm.errors import InvalidArgument
from chm.kv import LOOKUP_BATCH, KVManager, Store, fair_shares
from chm.kv.lookup import prefix_hits

KiB = 1 << 10
BLOCK = 256 * KiB


def blk(i: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    st = make_store(window_bytes=1 << 20)
    for i in range(40):
        st.put([i], [blk(i)])
        st.flush()
    return st


def issued(st: Store) -> int:
    return int(st.device.stats().prefetch_issued)


def test_prefix_hits() -> None:
    assert prefix_hits(np.array([True, True, False, True])) == 2
    assert prefix_hits(np.array([False, True])) == 0
    assert prefix_hits(np.array([True] * 3)) == 3
    assert prefix_hits(np.zeros(0, dtype=bool)) == 0


def test_stops_at_the_first_miss(store: Store) -> None:
    assert store.prefix_len([0, 1, 2, 999, 3, 4]) == 3
    assert store.prefix_len([999, 0]) == 0
    assert store.prefix_len(list(range(40))) == 40  # more than one batch of 32
    assert store.prefix_len([*range(35), 999, 36]) == 35
    with store.lookup([5, 6, 7, 998, 8]) as lk:
        assert lk.hits == 3


def test_at_most_32_keys_per_lookup(store: Store) -> None:
    with pytest.raises(InvalidArgument, match="33 keys; at most 32 per call"):
        store.lookup(list(range(LOOKUP_BATCH + 1)))
    assert store.device.stats().slots_held == 0


def test_prefetches_are_issued_with_the_answer(store: Store) -> None:
    before = issued(store)
    lk = store.lookup(list(range(10)))
    # 1 MiB window / 256 KiB blocks: w_max = 4, issued before anything is loaded
    assert lk.hits == 10 and len(lk.tokens) == 4
    assert issued(store) - before == 4
    out = [np.zeros(BLOCK, np.uint8) for _ in range(10)]
    ok = lk.load(out, timeout=10)
    assert ok == [True] * 10
    assert all(np.array_equal(o, blk(i)) for i, o in enumerate(out))
    assert issued(store) - before == 10
    s = store.device.stats()
    assert s.prefetch_issued == s.prefetch_released  # everything given back


def test_a_closed_lookup_unpins(store: Store) -> None:
    lk = store.lookup([1, 2, 3])
    assert store.stats().segments_pinned == 1
    lk.close()
    lk.close()
    assert store.stats().segments_pinned == 0
    assert store.remove([1]) == [True]


def test_load_prefix_into_buffers(store: Store) -> None:
    out = [bytearray(BLOCK) for _ in range(6)]
    assert store.load_prefix([0, 1, 2, 999, 4, 5], out, timeout=10) == 3
    assert [bytes(o) == blk(i).tobytes() for i, o in enumerate(out[:3])] == [True] * 3
    assert not any(out[3]) and not any(out[4])  # nothing past the first miss


def test_concurrent_requests_share_the_window(store: Store) -> None:
    slots = store.manager.slots  # the device's staging slots (11 of 1 MiB)
    lk1 = store.lookup(list(range(0, 8)), request="a")
    assert len(lk1.tokens) == 4  # w_max = 1 MiB window / 256 KiB blocks
    lk2 = store.lookup(list(range(8, 16)), request="b")
    lk3 = store.lookup(list(range(16, 24)), request="c")
    shares = [store.manager.window(r) for r in ("a", "b", "c")]
    assert shares == fair_shares([4, 4, 4], slots) and sum(shares) <= slots
    assert len(lk3.tokens) == shares[2]
    small = KVManager(6)  # fewer slots than the three windows want: shared fairly
    assert [small.admit(r, 4) for r in "abc"][-1] == 2
    assert [small.window(r) for r in "abc"] == [2, 2, 2]
    outs = [[np.zeros(BLOCK, np.uint8) for _ in range(8)] for _ in range(3)]
    assert lk2.load(outs[1], timeout=10) == [True] * 8
    lk1.close()
    assert lk3.load(outs[2], timeout=10) == [True] * 8
    assert store.manager.active == 0
    assert all(np.array_equal(o, blk(16 + i)) for i, o in enumerate(outs[2]))
