"""The connector: model presets, save/load by request, and the timeout fallback."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import ChmError, InvalidArgument
from chm.kv import Connector, PutStatus, Store, block_bytes

MiB = 1 << 20
BPT = 512  # bytes per token: 128-token blocks of 64 KiB


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Iterator[Store]:
    st = make_store()
    yield st
    with contextlib.suppress(ChmError):  # a fault a test left armed must not fail the close
        st.device.inject_fault("none")  # type: ignore[attr-defined]


def kv(i: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).integers(0, 256, 128 * BPT, dtype=np.uint8)


def test_model_presets() -> None:
    assert block_bytes("llama-3.1-8b") == 16 * MiB  # 128 KiB/token x 128 tokens
    assert block_bytes("Qwen2.5-32B") == 32 * MiB  # 256 KiB/token x 128 tokens
    assert block_bytes("llama-3.1-8b", tokens_per_block=256) == 32 * MiB  # LMCache's chunk
    assert block_bytes(bytes_per_token=1000, tokens_per_block=16) == 16000
    with pytest.raises(InvalidArgument, match=r"unknown model .gpt.; presets: llama-3\.1-8b"):
        block_bytes("gpt")
    with pytest.raises(InvalidArgument, match="tokens_per_block=0"):
        block_bytes("llama-3.1-8b", tokens_per_block=0)
    with pytest.raises(InvalidArgument, match="bytes_per_token=-1"):
        block_bytes(bytes_per_token=-1)


def test_blocks_must_fit_a_slot(store: Store) -> None:
    with pytest.raises(InvalidArgument, match="open it with slot_size >= 16777216"):
        Connector(store, "llama-3.1-8b")


def test_save_then_load(store: Store) -> None:
    conn = Connector(store, bytes_per_token=BPT)
    keys = [f"{i:04x}" for i in range(6)]
    assert conn.save("r1", keys[:3], [kv(i) for i in range(3)]) == [PutStatus.STORED] * 3
    store.flush()
    out = [np.zeros(128 * BPT, np.uint8) for _ in keys]
    assert conn.load("r1", keys, out) == 3 * 128  # the cached prefix; recompute the rest
    assert all(np.array_equal(out[i], kv(i)) for i in range(3))
    s = conn.stats()
    assert (s.loads, s.blocks_loaded, s.tokens_loaded, s.saved_stored) == (1, 3, 384, 3)
    with pytest.raises(InvalidArgument, match="source 0 has 65537 bytes, a block has 65536"):
        conn.save("r1", ["ff"], [np.zeros(128 * BPT + 1, np.uint8)])


def test_skips_are_counted(store: Store) -> None:
    conn = Connector(store, bytes_per_token=BPT, tokens_per_block=2048)  # 1 MiB blocks
    dev: chm.Device = store.device  # type: ignore[assignment]
    dev.inject_fault("slow", arg=500_000_000)  # the flusher cannot drain the buffer meanwhile
    res = conn.save("r", list(range(8)), [np.zeros(MiB, np.uint8)] * 8)  # 4 MiB buffer
    dev.inject_fault("none")
    assert PutStatus.SKIPPED in res
    assert conn.stats().saved_skipped == res.count(PutStatus.SKIPPED)
    assert store.contains(list(range(8))) == [r == PutStatus.STORED for r in res]


def test_a_slow_load_falls_back_instead_of_hanging(store: Store) -> None:
    conn = Connector(store, bytes_per_token=BPT, timeout=0.3)
    keys = list(range(8))
    for k in keys:
        conn.save("r", [k], [kv(k)])
        store.flush()
    dev: chm.Device = store.device  # type: ignore[assignment]
    dev.inject_fault("slow", arg=3_000_000_000)  # every backend read completes 3 s late
    out = [np.zeros(128 * BPT, np.uint8) for _ in keys]
    t0 = time.monotonic()
    got = conn.load("r", keys, out)  # the connector's default timeout: 0.3 s
    elapsed = time.monotonic() - t0
    assert got < len(keys) * 128  # fewer tokens: the caller recomputes the rest
    assert elapsed < 2.0, f"load took {elapsed:.2f} s with a 0.3 s timeout"
    s = conn.stats()
    assert s.load_timeouts == 1 and s.loads_short == 1
    assert store.stats().segments_pinned == 0  # nothing left held
    dev.inject_fault("none")
    assert conn.load("r", keys, out, timeout=30) == len(keys) * 128
    assert all(np.array_equal(out[k], kv(k)) for k in keys)
