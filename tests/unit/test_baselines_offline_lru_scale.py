"""The LRU tier against an offline LRU at 64 GiB and 2 TiB of 16 MiB blocks.

The offline side is :mod:`chm.testing.offline_lru` (LRU's stack property
over access times, no cache of its own). The trace is a synthetic chat workload
written in the Mooncake format and read back.
"""

from __future__ import annotations

import pytest

from chm.sim.replay import GPUS, MODELS, PrefillModel, SystemSpec, simulate
from chm.sim.workloads import Request
from chm.testing.offline_lru import chat_trace, offline_lru_hits, unbounded_hit_rate

LLAMA = PrefillModel(MODELS["llama-3.1-8b"], GPUS["a100-80g"])
BLOCK = 16 << 20


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> list[Request]:
    return chat_trace(tmp_path_factory.mktemp("trace"))


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
        assert 0 < rate < unbounded_hit_rate(trace)
    else:
        assert distinct < blocks  # 2 TiB holds everything: every reuse hits
        assert rate == unbounded_hit_rate(trace)
