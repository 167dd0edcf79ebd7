"""The KV store against a dict model: put, get, remove, pin, eviction, flush, reopen.

The device is small (8 segments of 128 KiB), so puts evict: after every put
the machine learns which keys the store dropped, and checks that none was
pinned. Everything else must match the model exactly, across reopens.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from chm.errors import Busy, InvalidArgument
from chm.kv import PutStatus, Store

KiB = 1 << 10
GEOM: dict[str, Any] = {
    "capacity": "1M",
    "dram": "1M",
    "slot_size": "64K",
    "backend": "pread",
    "segment_bytes": 128 * KiB,
    "device_options": {"wbuf": "256K", "stripe_unit": "64K"},
}
KEYS = st.integers(0, 63)


def data_for(key: int, size: int, salt: int) -> bytes:
    return np.random.default_rng([key, size, salt]).integers(0, 256, size, np.uint8).tobytes()


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="chm-kv-machine-", dir=os.environ.get("CHM_TEST_TMPDIR"))
        self.model: dict[int, bytes] = {}
        self.pins: dict[int, int] = {}
        self.salt = 0
        self.st: Store | None = None

    @initialize(eviction=st.sampled_from(["lru", "fifo"]))
    def open(self, eviction: str) -> None:
        self.eviction = eviction
        self.st = Store.open(self.dir, eviction=eviction, **GEOM)

    @property
    def store(self) -> Store:
        assert self.st is not None
        return self.st

    def _learn_evictions(self) -> None:
        keys = sorted(self.model)
        for k, there in zip(keys, self.store.contains(keys), strict=True):
            if not there:
                assert self.pins.get(k, 0) == 0, f"pinned key {k} was evicted"
                note(f"evicted {k}")
                event("a put evicted blocks")
                del self.model[k]

    def _evicted_in_call(self, k: int, r: PutStatus, new: bytes) -> None:
        """A key there when a put began (or stored earlier in it) and not answered
        EXISTS: the call's own earlier blocks evicted it, and the store either
        saved this call's bytes (STORED) or had no write-buffer room for them
        (SKIPPED), rather than claim EXISTS for a key it no longer holds. Only an
        unpinned key may be evicted."""
        assert r in (PutStatus.STORED, PutStatus.SKIPPED), r
        assert self.pins.get(k, 0) == 0, f"pinned key {k} was evicted by a put"
        note(f"{k} evicted earlier in the call, then {r.name}")
        if r == PutStatus.STORED:
            event("a put stored again a key its own blocks evicted")
            self.model[k] = new
        else:
            event("a put could not store again a key its own blocks evicted")
            self.model.pop(k, None)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=6), sizes=st.data())
    def put(self, keys: list[int], sizes: st.DataObject) -> None:
        self.salt += 1
        blocks = [
            data_for(k, sizes.draw(st.sampled_from([1, 511, 4 * KiB, 40 * KiB, 64 * KiB])),
                     self.salt)
            for k in keys
        ]  # fmt: skip
        res = self.store.put(keys, blocks)
        note(f"put {keys} -> {[r.name for r in res]}")
        seen: set[int] = set()
        for k, b, r in zip(keys, blocks, res, strict=True):
            assert r != PutStatus.ERROR
            if (k in self.model or k in seen) and r != PutStatus.EXISTS:
                self._evicted_in_call(k, r, b)
            elif k in self.model or k in seen:
                assert r == PutStatus.EXISTS
            elif r == PutStatus.STORED:
                self.model[k] = b
                seen.add(k)
            else:
                assert r == PutStatus.SKIPPED
                event("a put was skipped")
        self._learn_evictions()

    @rule(keys=st.lists(KEYS, min_size=4, max_size=8, unique=True), flush=st.booleans())
    def fill(self, keys: list[int], flush: bool) -> None:
        """Big puts, flushed or not: they fill the write buffer and the device."""
        self.salt += 1
        res = self.store.put(keys, [data_for(k, 64 * KiB, self.salt) for k in keys])
        note(f"fill {keys} -> {[r.name for r in res]}")
        for k, r in zip(keys, res, strict=True):
            if k in self.model and r != PutStatus.EXISTS:
                self._evicted_in_call(k, r, data_for(k, 64 * KiB, self.salt))
            elif k in self.model:
                assert r == PutStatus.EXISTS
            elif r == PutStatus.STORED:
                self.model[k] = data_for(k, 64 * KiB, self.salt)
            else:
                assert r == PutStatus.SKIPPED
                event("a put was skipped")
        self._learn_evictions()
        if flush:
            self.store.flush(timeout=30)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=8))
    def get(self, keys: list[int]) -> None:
        dsts = [bytearray(64 * KiB) for _ in keys]
        got = self.store.get(keys, dsts, timeout=30)
        assert got == [k in self.model for k in keys]
        for k, d in zip(keys, dsts, strict=True):
            if k in self.model:
                assert bytes(d[: len(self.model[k])]) == self.model[k]

    @rule(keys=st.lists(KEYS, min_size=1, max_size=8))
    def prefix(self, keys: list[int]) -> None:
        n = 0
        while n < len(keys) and keys[n] in self.model:
            n += 1
        assert self.store.prefix_len(keys) == n

    @rule(keys=st.lists(KEYS, min_size=1, max_size=4))
    def remove(self, keys: list[int]) -> None:
        if any(self.pins.get(k, 0) for k in keys if k in self.model):
            try:
                self.store.remove(keys)
            except Busy:
                return
            raise AssertionError("removing a pinned key did not raise Busy")
        assert self.store.remove(keys) == [k in self.model for k in keys]
        for k in keys:
            self.model.pop(k, None)

    @rule(keys=st.lists(KEYS, min_size=1, max_size=3))
    def pin(self, keys: list[int]) -> None:
        assert self.store.pin(keys) == [k in self.model for k in keys]
        for k in keys:
            if k in self.model:
                self.pins[k] = self.pins.get(k, 0) + 1

    # What is stored depends on timing (a full write buffer skips), so no
    # rule's availability or arguments may depend on the model: unpin draws
    # any key and expects a refusal for one that is not pinned.
    @rule(key=KEYS)
    def unpin(self, key: int) -> None:
        if self.pins.get(key, 0):
            self.store.unpin([key])
            self.pins[key] -= 1
        else:
            with pytest.raises(InvalidArgument):
                self.store.unpin([key])

    @rule()
    def flush(self) -> None:
        self.store.flush(timeout=30)

    @rule()
    def reopen(self) -> None:
        self.store.close()  # flushes: everything stored survives
        self.pins.clear()  # pins belong to the open store
        self.st = Store.open(self.dir, eviction=self.eviction, **GEOM)
        assert self.store.stats().recovered_entries == len(self.model)

    @invariant()
    def accounting(self) -> None:
        if self.st is None:
            return
        s = self.store.stats()
        assert s.entries == len(self.model)
        assert s.live_bytes == sum(len(b) for b in self.model.values())
        assert s.allocated_bytes <= s.capacity_bytes
        assert s.segments_pinned == len({self.store.info(k)["segment"]  # type: ignore[index]
                                         for k, n in self.pins.items() if n})  # fmt: skip

    def teardown(self) -> None:
        try:
            if self.st is not None:
                self.st.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class LongStoreMachine(StoreMachine):
    """The same machine, run for LONG_EXAMPLES examples in the slow tier."""


# the fast tier's examples, and the slow tier's; the nightly profile sets both
EXAMPLES, LONG_EXAMPLES = 20, 200
if os.environ.get("HYPOTHESIS_PROFILE") != "nightly":
    StoreMachine.TestCase.settings = settings(
        settings(), max_examples=EXAMPLES, stateful_step_count=40
    )
    LongStoreMachine.TestCase.settings = settings(
        settings(), max_examples=LONG_EXAMPLES, stateful_step_count=40
    )
TestStoreMachine = StoreMachine.TestCase
TestLongStoreMachine = pytest.mark.slow(LongStoreMachine.TestCase)
