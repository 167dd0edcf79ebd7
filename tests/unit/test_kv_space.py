"""AddressSpace: request-level placement over several devices; a failed device is taken out."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import ChmError, InvalidArgument
from chm.kv import AddressSpace, PutStatus, Store

KiB = 1 << 10
BLOCK = 64 * KiB


def kv(i: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).integers(0, 256, BLOCK, dtype=np.uint8)


@pytest.fixture
def stores(tmp_backing: Path) -> Iterator[list[Store]]:
    out = [
        Store.open(
            tmp_backing / f"d{i}",
            capacity="64M",
            dram="16M",
            slot_size="1M",
            backend="pread",
            device_options={"wbuf": "4M"},
            device_id=i,
        )
        for i in range(3)
    ]
    yield out
    for st in out:
        with contextlib.suppress(ChmError):
            st.device.inject_fault("none")  # type: ignore[attr-defined]
            st.close()


def dev(st: Store) -> chm.Device:
    d: chm.Device = st.device  # type: ignore[assignment]
    return d


def test_round_robin_keeps_a_request_on_one_device(stores: list[Store]) -> None:
    sp = AddressSpace(stores)
    for r in range(3):
        assert sp.save(f"r{r}", [r * 10], [kv(r * 10)]) == [PutStatus.STORED]
    assert sp.save("r0", [1, 2], [kv(1), kv(2)]) == [PutStatus.STORED] * 2
    assert [s.contains([0, 1, 2, 10, 20]) for s in stores] == [
        [True, True, True, False, False],
        [False, False, False, True, False],
        [False, False, False, False, True],
    ]
    sp.flush()
    out = [np.zeros(BLOCK, np.uint8) for _ in range(4)]
    assert sp.load("x", [0, 1, 2, 10], out, timeout=10) == 4  # across devices, in order
    assert all(np.array_equal(o, kv(k)) for o, k in zip(out, [0, 1, 2, 10], strict=True))
    assert sp.prefix_len([0, 10, 20, 99, 1]) == 3
    sp.finish("r0")
    assert sp.place("r0") == 0  # round robin goes on: 3 requests placed before
    with pytest.raises(InvalidArgument, match="placement='random'"):
        AddressSpace(stores, placement="random")


def test_least_outstanding_avoids_a_busy_device(stores: list[Store]) -> None:
    sp = AddressSpace(stores, placement="least-outstanding")
    assert sp.place("a") == 0
    sp.save("a", list(range(8)), [kv(i) for i in range(8)])
    sp.flush()
    dev(stores[0]).inject_fault("slow", arg=1_000_000_000)
    out = [np.zeros(BLOCK, np.uint8) for _ in range(8)]
    t = threading.Thread(target=sp.load, args=("a", list(range(8)), out, 30))
    t.start()
    try:
        deadline = time.monotonic() + 10
        while sp._outstanding[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sp._outstanding[0] == 8 * BLOCK
        assert sp.place("b") == 1  # device 0 has bytes in flight
    finally:
        dev(stores[0]).inject_fault("none")
        t.join()
    assert sp._outstanding == [0, 0, 0]


def test_a_failed_device_is_taken_out(stores: list[Store]) -> None:
    sp = AddressSpace(stores)
    for r in range(3):
        sp.save(f"r{r}", [r * 10, r * 10 + 1], [kv(r * 10), kv(r * 10 + 1)])
    sp.flush()
    dev(stores[1]).inject_fault("eio_read", nth=1)
    out = [np.zeros(BLOCK, np.uint8) for _ in range(2)]
    got = sp.load("r1", [10, 11], out, timeout=10)  # the first read to complete fails
    assert got < 2
    assert all(np.array_equal(out[i], kv(10 + i)) for i in range(got))
    assert sp.live == [0, 2] and "read" in sp.failures[1]
    assert sp.contains([0, 10, 11, 20]) == [True, False, False, True]  # its blocks: misses
    assert {sp.place(f"n{i}") for i in range(4)} == {0, 2}  # nothing placed on it
    assert sp.load("r0", [0, 1], out, timeout=10) == 2
