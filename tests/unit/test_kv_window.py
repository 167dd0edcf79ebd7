"""Prefetch windows: eq. 2, fair sharing, and the sliding window on a device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import chm
from chm.errors import InvalidArgument
from chm.kv.window import WINDOW_BYTES, KVManager, SlidingWindow, fair_shares, w_max

MiB = 1 << 20


def test_w_max_is_eq_2() -> None:
    assert 128 * MiB == WINDOW_BYTES
    assert w_max(16 * MiB, 100) == 8
    assert w_max(32 * MiB, 100) == 4
    assert w_max(16 * MiB, 3) == 3  # bounded by the hits
    assert w_max(256 * MiB, 10) == 1  # a block larger than the window still gets one
    assert w_max(16 * MiB, 0) == 0
    assert w_max(1 * MiB, 1000, window_bytes=4 * MiB) == 4


@pytest.mark.parametrize(
    ("args", "words"),
    [((0, 1), "block_bytes=0"), ((1, -1), "n_hits=-1"), ((True, 1), "block_bytes=True")],
)
def test_w_max_bad_input(args: tuple[Any, Any], words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        w_max(*args)


@given(st.lists(st.integers(0, 20), max_size=12), st.integers(0, 64))
def test_fair_shares(demands: list[int], capacity: int) -> None:
    out = fair_shares(demands, capacity)
    assert len(out) == len(demands)
    for d, o in zip(demands, out, strict=True):
        assert (o == 0) == (d == 0)
        assert o <= max(d, 0)
    active = [i for i, d in enumerate(demands) if d > 0]
    if sum(demands) <= capacity:
        assert out == demands  # everyone fits: everyone gets w_max
    elif len(active) <= capacity:
        assert sum(out) == capacity  # nothing wasted
        # max-min fair: an unsatisfied request has at least everyone else's share - 1
        for i in active:
            if out[i] < demands[i]:
                assert all(out[i] >= out[j] - 1 for j in active)
    else:
        assert all(out[i] == 1 for i in active)  # more requests than slots: one each


def test_fair_shares_examples() -> None:
    assert fair_shares([8, 8], 16) == [8, 8]
    assert fair_shares([8, 8, 8], 16) == [6, 5, 5]
    assert fair_shares([2, 8, 8], 16) == [2, 7, 7]
    with pytest.raises(InvalidArgument, match="capacity"):
        fair_shares([1], -1)
    with pytest.raises(InvalidArgument, match="demands"):
        fair_shares([-1], 4)


def test_manager_shares_and_regrows() -> None:
    m = KVManager(16)
    assert m.admit("a", 8) == 8
    assert m.admit("b", 8) == 8
    assert m.admit("c", 8) == 5 and m.window("a") == 6
    m.leave("c")
    assert m.window("a") == 8 and m.window("c") == 0
    with pytest.raises(InvalidArgument, match="slots"):
        KVManager(0)


def _in_flight(dev: chm.Device) -> int:
    s = dev.stats()
    return int(s.prefetch_issued - s.prefetch_released)


def test_sliding_window_order_and_depth(make_device: Callable[..., chm.Device]) -> None:
    dev = make_device("pread")
    block = MiB
    for i in range(12):
        assert dev.write(i * block, bytes([i]) * block)
        dev.flush()  # the write buffer (4 MiB) holds few blocks
    sizes = iter([3, 3, 3, 1, 1, 1, 5, 5, 5, 5, 5, 5, 5])
    seen = []
    with SlidingWindow(dev, [(i * block, block) for i in range(12)], lambda: next(sizes)) as win:
        for _, h in win:
            # never more prefetches than the current window (plus none queued beyond it)
            assert win.in_flight <= 5
            assert _in_flight(dev) == win.in_flight
            v = h.wait(10)
            seen.append(v[0])
            del v
    assert seen == list(range(12))
    assert _in_flight(dev) == 0


def test_sliding_window_close_releases_everything(
    make_device: Callable[..., chm.Device],
) -> None:
    dev = make_device("pread")
    win = SlidingWindow(dev, [(i * MiB, MiB) for i in range(10)], 4)
    assert _in_flight(dev) == 4
    i, h = win.pop()
    assert i == 0
    win.close()
    assert _in_flight(dev) == 0 and h.released
    with pytest.raises(IndexError):
        win.pop()
