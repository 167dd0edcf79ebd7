"""LruBlocks against an obviously-correct list model, on random access sequences."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chm.sim.replay import LruBlocks

keys = st.lists(st.sampled_from([bytes([i]) for i in range(12)]), max_size=8, unique=True)


@given(capacity=st.integers(0, 6), steps=st.lists(keys, max_size=40))
def test_lru_blocks_matches_a_list(capacity: int, steps: list[list[bytes]]) -> None:
    c = LruBlocks(capacity)
    model: list[bytes] = []  # least recent first
    evictions = 0
    for step in steps:
        # prefix_len: how many leading keys the model holds
        held = 0
        for k in step:
            if k not in model:
                break
            held += 1
        assert c.prefix_len(step) == held
        c.access(step)
        for k in step:
            if capacity == 0:
                break
            if k in model:
                model.remove(k)
            model.append(k)
            if len(model) > capacity:
                model.pop(0)
                evictions += 1
        assert len(c) == len(model)
        assert all(k in c for k in model)
        assert c.evictions == evictions
