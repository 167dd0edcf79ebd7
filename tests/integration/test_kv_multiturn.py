"""Multi-turn end to end: 8 users x 6 turns of growing prefixes, saved and reloaded
through the connector with byte-exact KV, on uring and pread, on one and two devices."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from chm.errors import ChmError
from chm.kv import AddressSpace, Connector, Namespace, PutStatus, Store

BPT = 512  # bytes per token
TPB = 128  # tokens per block: 64 KiB blocks
USERS, TURNS, SYSTEM, GROWTH = 8, 6, 2, 2


def chain(prev: bytes, tokens: str) -> bytes:
    """A block's key: the hash of its parent's key and its tokens (as engines chain them)."""
    return xxhash.xxh3_128_digest(prev + tokens.encode())


def content(key: bytes) -> np.ndarray[Any, Any]:
    seed = int.from_bytes(key[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, BPT * TPB, dtype=np.uint8)


@pytest.mark.parametrize("devices", [1, 2])
def test_eight_users_six_turns(tmp_backing: Path, data_backend: str, devices: int) -> None:
    stores = [
        Store.open(
            tmp_backing / f"d{i}", capacity="256M", dram="16M", slot_size="1M",
            backend=data_backend, device_options={"wbuf": "4M"}, device_id=i,
            namespace=Namespace(model="llama-3.1-8b", tp_rank=0),
        )
        for i in range(devices)
    ]  # fmt: skip
    space = AddressSpace(stores)
    conn = Connector(space, bytes_per_token=BPT, tokens_per_block=TPB)
    try:
        system: list[bytes] = []
        prev = b""
        for j in range(SYSTEM):
            prev = chain(prev, f"system {j}")
            system.append(prev)
        history: list[list[bytes]] = [list(system) for _ in range(USERS)]
        loaded_tokens = 0
        for turn in range(TURNS):
            for u in range(USERS):
                req = f"u{u}-t{turn}"
                keys = history[u]
                dsts = [np.zeros(BPT * TPB, np.uint8) for _ in keys]
                cached = len(keys) if turn > 0 or u > 0 else 0  # the very first turn is cold
                got = conn.load(req, keys, dsts, timeout=30)
                assert got == cached * TPB, f"{req}: {got} tokens, expected {cached * TPB}"
                for k, d in zip(keys[:cached], dsts, strict=False):
                    assert np.array_equal(d, content(k)), f"{req}: wrong KV bytes"
                loaded_tokens += got
                # the turn's prompt and answer: new blocks chained to the history
                new = []
                prev = keys[-1]
                for j in range(GROWTH):
                    prev = chain(prev, f"user {u} turn {turn} block {j}")
                    new.append(prev)
                to_save = (system if turn == 0 else []) + new
                res = conn.save(req, to_save, [content(k) for k in to_save])
                assert set(res) <= {PutStatus.STORED, PutStatus.EXISTS}
                space.flush()
                conn.finish(req)
                history[u] = keys + new
        want = sum(len(system) + GROWTH * t for t in range(TURNS)) * USERS - len(system)
        assert loaded_tokens == want * TPB
        s = conn.stats()
        assert s.loads == USERS * TURNS and s.load_timeouts == 0
        assert s.saved_skipped == 0 and s.saved_error == 0
        if devices == 2:  # request-level placement used both devices
            assert all(len(st) > 0 for st in stores)
    finally:
        for st in stores:
            with contextlib.suppress(ChmError):
                st.close()
