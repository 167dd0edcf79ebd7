"""The index: batched contains/get/put/delete against a dict, and its size."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chm.errors import InvalidArgument
from chm.kv.index import ENTRY_DTYPE, Index, bytes_at
from chm.kv.keys import KEY_DTYPE


def keys_of(ints: list[int], spread: int = 7) -> np.ndarray[Any, Any]:
    """Keys that share low words in groups (``spread`` distinct ones), so that
    their probe runs collide; the low words are scattered over the table."""
    k = np.zeros(len(ints), dtype=KEY_DTYPE)
    k["hi"] = np.asarray(ints, dtype=np.uint64)
    k["lo"] = np.asarray([(i % spread) * 0x9E3779B97F4A7C15 % 2**64 for i in ints], np.uint64)
    return k


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "delete", "find"]),
        st.lists(st.integers(0, 200), min_size=0, max_size=40),
    ),
    max_size=60,
)


@settings(max_examples=60)
@given(ops)
def test_matches_a_dict(program: list[tuple[str, list[int]]]) -> None:
    ix = Index(16)
    model: dict[int, int] = {}
    for op, ints in program:
        k = keys_of(ints)
        if op == "put":
            rows = ix.put(k, addr=np.asarray(ints, dtype=np.uint64) * 4096, length=1,
                          checksum=7, epoch=1, segment=0)  # fmt: skip
            seen = set()
            for i, r in zip(ints, rows.tolist(), strict=True):
                fresh = i not in model and i not in seen
                assert (r >= 0) == fresh
                if fresh:
                    model[i] = i * 4096
                    seen.add(i)
        elif op == "delete":
            gone = ix.delete(k)
            for i, g in zip(ints, gone.tolist(), strict=True):
                assert g == (i in model)
            for i in ints:
                model.pop(i, None)
        found, ent = ix.get(keys_of(list(range(201))))
        assert found.tolist() == [i in model for i in range(201)]
        assert ent["addr"][found].tolist() == [model[i] for i in range(201) if i in model]
        assert len(ix) == len(model)


def test_entries_and_memory_at_ten_terabytes() -> None:
    assert ENTRY_DTYPE.itemsize <= 64
    n = (10 << 40) // (16 << 20)  # 10 TiB of 16 MiB blocks: eq. 1's 6.5e5 entries
    assert n == 655_360
    assert bytes_at(n) / n <= 64
    assert bytes_at(n) <= 41 << 20  # ~40 MB
    ix = Index(n)
    rng = np.random.default_rng(0)
    k = np.zeros(n, dtype=KEY_DTYPE)
    k["hi"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    k["lo"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    rows = ix.put(k, addr=0, length=16 << 20, checksum=0, epoch=0, segment=0)
    assert (rows >= 0).all() and len(ix) == n
    assert ix.nbytes == bytes_at(n)
    assert ix.nbytes / n <= 64
    assert ix.contains(k[:1000]).all()
    other = k[:1000].copy()
    other["lo"] ^= np.uint64(1)
    assert not ix.contains(other).any()


def test_growth_and_tombstones_keep_every_key() -> None:
    ix = Index(16)
    ints = list(range(5000))

    def keys(xs: list[int]) -> np.ndarray[Any, Any]:
        return keys_of(xs, spread=1000)  # groups of 5 keys share a low word

    ix.put(keys(ints), addr=0, length=1, checksum=0, epoch=0, segment=3)
    assert ix.delete(keys(ints[::2])).all()
    ix.put(keys(ints[::4]), addr=1, length=1, checksum=0, epoch=0, segment=4)
    want = [i % 2 == 1 or i % 4 == 0 for i in ints]
    assert ix.contains(keys(ints)).tolist() == want
    assert len(ix.rows_in_segment(4)) == len(ints[::4])
    ix.delete_rows(ix.rows_in_segment(4))
    assert ix.contains(keys(ints)).tolist() == [i % 2 == 1 for i in ints]


def test_bad_keys_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="KEY_DTYPE"):
        Index().find(np.zeros(3, dtype=np.uint64))
