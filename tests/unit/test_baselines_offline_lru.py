"""An LRU KV tier's hit rate equals an independent offline LRU simulation.

The offline simulation does not keep a cache at all: it uses LRU's stack
property. A block is held at the start of a request iff it was accessed
before and fewer than C other distinct blocks were accessed since (each
request accesses all of its blocks, in order). A request's hits are the
leading blocks that are held. Run on a Mooncake-format fixture, re-blocked
to 128-token serving blocks.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest

from chm.sim.replay import GPUS, MODELS, PrefillModel, SystemSpec, simulate
from chm.sim.workloads import Request, read_mooncake, trace_requests

TRACE = Path(__file__).resolve().parent.parent / "data" / "mooncake_chat.jsonl"
LLAMA = PrefillModel(MODELS["llama-3.1-8b"], GPUS["a100-80g"])
BLOCK = 128 * 128 * 1024  # 16 MiB per 128-token block


def offline_lru_hits(requests: list[Request], capacity: int) -> list[int]:
    history: list[bytes] = []
    hits = []
    for r in requests:
        n = 0
        for k in r.block_keys:
            if k not in history:
                break
            last = len(history) - 1 - history[::-1].index(k)
            if len(set(history[last + 1 :])) >= capacity:
                break
            n += 1
        hits.append(n)
        history.extend(r.block_keys)
    return hits


def offline_fifo_hits(requests: list[Request], capacity: int) -> list[int]:
    """A FIFO of the same capacity: shows the fixture tells LRU from FIFO."""
    q: deque[bytes] = deque()
    hits = []
    for r in requests:
        n = 0
        for k in r.block_keys:
            if k not in q:
                break
            n += 1
        hits.append(n)
        for k in r.block_keys:
            if k not in q:
                q.append(k)
                if len(q) > capacity:
                    q.popleft()
    return hits


@pytest.fixture(scope="module")
def trace() -> list[Request]:
    return trace_requests(read_mooncake(TRACE))


CAPACITIES = [0, 1, 4, 16, 40, 100, 200, 400, 10_000]


def test_lru_tier_equals_offline_lru(trace: list[Request]) -> None:
    blocks = sum(len(r.block_keys) for r in trace)
    assert blocks == 841
    rates = []
    for c in CAPACITIES:
        system = SystemSpec("lru-tier", gpu_cache=False, tier_capacity_bytes=c * BLOCK)
        got = [r.tier_hit_blocks for r in simulate(trace, system, LLAMA)]
        want = offline_lru_hits(trace, c)
        assert got == want, f"capacity {c} blocks"
        rates.append(sum(want) / blocks)
    # the capacities span the whole range: nothing held ... everything reusable held
    assert rates[0] == 0.0
    assert rates == sorted(rates)
    assert len(set(rates)) >= 5
    assert rates[-1] == rates[-2]  # 400 blocks hold this trace's reuse


def test_the_fixture_tells_lru_from_fifo(trace: list[Request]) -> None:
    assert any(offline_fifo_hits(trace, c) != offline_lru_hits(trace, c) for c in CAPACITIES)
