"""The LRU tier against an offline LRU at 64 GiB and 2 TiB of 16 MiB blocks.

The offline side uses LRU's stack property with a Fenwick tree over access
times (Bennett and Kruskal): a block is held at the start of a request iff it
was accessed before and the number of distinct blocks last accessed since
then is below the capacity in blocks. The trace is a synthetic chat workload
written in the Mooncake format and read back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chm.replay import GPUS, MODELS, PrefillModel, SystemSpec, simulate
from chm.workloads import (
    ChatWorkload,
    Request,
    read_mooncake,
    synthetic_trace,
    trace_requests,
    write_mooncake,
)

LLAMA = PrefillModel(MODELS["llama-3.1-8b"], GPUS["a100-80g"])
BLOCK = 16 << 20


class Fenwick:
    def __init__(self, n: int) -> None:
        self.t = [0] * (n + 1)

    def add(self, i: int, v: int) -> None:
        i += 1
        while i < len(self.t):
            self.t[i] += v
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of positions [0, i)."""
        s = 0
        while i > 0:
            s += self.t[i]
            i -= i & -i
        return s


def offline_lru_hits(requests: list[Request], capacity: int) -> list[int]:
    total = sum(len(r.block_keys) for r in requests)
    tree = Fenwick(total)
    last: dict[bytes, int] = {}
    now = 0
    hits = []
    for r in requests:
        n = 0
        for k in r.block_keys:
            p = last.get(k)
            if p is None or tree.prefix(now) - tree.prefix(p + 1) >= capacity:
                break
            n += 1
        hits.append(n)
        for k in r.block_keys:
            p = last.get(k)
            if p is not None:
                tree.add(p, -1)
            tree.add(now, 1)
            last[k] = now
            now += 1
    return hits


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> list[Request]:
    wl = ChatWorkload(
        users=24,
        turns=6,
        system_prompt_tokens=2048,
        user_tokens=(4000, 8000),
        output_tokens=(200, 1000),
        seed=13,
    )
    path = Path(tmp_path_factory.mktemp("trace")) / "chat.jsonl"
    write_mooncake(path, synthetic_trace(wl))
    return trace_requests(read_mooncake(path), block_tokens=128)


@pytest.mark.parametrize("capacity", [64 << 30, 2 << 40])
def test_lru_tier_equals_offline_lru(trace: list[Request], capacity: int) -> None:
    blocks = capacity // BLOCK
    distinct = len({k for r in trace for k in r.block_keys})
    system = SystemSpec("lru-tier", gpu_cache=False, tier_capacity_bytes=capacity)
    got = [r.tier_hit_blocks for r in simulate(trace, system, LLAMA)]
    want = offline_lru_hits(trace, blocks)
    assert got == want
    rate = sum(want) / sum(len(r.block_keys) for r in trace)
    if capacity == 64 << 30:
        assert distinct > blocks  # 64 GiB cannot hold this trace: evictions matter
        assert 0 < rate < offline_rate_unbounded(trace)
    else:
        assert distinct < blocks  # 2 TiB holds everything: every reuse hits
        assert rate == offline_rate_unbounded(trace)


def offline_rate_unbounded(trace: list[Request]) -> float:
    seen: set[bytes] = set()
    hits = 0
    for r in trace:
        for k in r.block_keys:
            if k not in seen:
                break
            hits += 1
        seen.update(r.block_keys)
    return hits / sum(len(r.block_keys) for r in trace)
