"""The CXL-HM tier (a chm.kv.Store) against an offline LRU at 64 GiB and 2 TiB.

Both CXL-HM systems replay a synthetic chat trace, written in the Mooncake
format and read back, on ghost devices in virtual time with 16 MiB blocks
and no GPU prefix cache, so every hit is a tier hit. The store keeps one
block per segment, so its eviction is block LRU over ``capacity / 16 MiB``
places; per request its hit count must equal :mod:`chm.testing.offline_lru`,
which shares no code with it. No write may be skipped (a skipped block is
not indexed, which an LRU does not model): the requests arrive at the
trace's times (open loop) and the write buffer is 8 GiB, large enough for
the trace's writes. At the paper's 1 GiB, the 64 GiB tier rewrites enough
evicted blocks that prefetch mode skips some, and the hits then differ
from an LRU's, as they should.
"""

from __future__ import annotations

import pytest

from chm.sim.replay.cxlhm_run import GhostSetup, replay_virtual
from chm.sim.replay.prefill import GPUS, MODELS, PrefillModel
from chm.sim.workloads import Request
from chm.testing.offline_lru import chat_trace, offline_lru_hits, unbounded_hit_rate

LLAMA = PrefillModel(MODELS["llama-3.1-8b"], GPUS["a100-80g"])
BLOCK = 16 << 20  # Llama-3.1-8B, 128 tokens


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> list[Request]:
    return chat_trace(tmp_path_factory.mktemp("trace"))


@pytest.mark.parametrize("system", ["cxlhm-lru", "cxlhm-prefetch"])
@pytest.mark.parametrize("capacity", [64 << 30, 2 << 40])
def test_cxlhm_tier_equals_offline_lru(trace: list[Request], capacity: int, system: str) -> None:
    assert LLAMA.model.block_bytes(128) == BLOCK
    blocks = capacity // BLOCK
    setup = GhostSetup(capacity_bytes=capacity, dram_bytes=16 << 30, wbuf_bytes=8 << 30)
    res = replay_virtual(trace, system, LLAMA, setup, gpu_cache=False, open_loop=True)
    assert sum(r.writes_skipped for r in res) == 0
    got = [r.result.tier_hit_blocks for r in res]
    want = offline_lru_hits(trace, blocks)
    assert got == want
    # every hit was loaded from the device (no host prefix buffer here)
    assert [r.device_load_bytes for r in res] == [h * BLOCK for h in want]
    distinct = len({k for r in trace for k in r.block_keys})
    rate = sum(want) / sum(len(r.block_keys) for r in trace)
    if capacity == 64 << 30:
        assert distinct > blocks  # 64 GiB cannot hold this trace: evictions matter
        assert 0 < rate < unbounded_hit_rate(trace)
    else:
        assert distinct < blocks  # 2 TiB holds everything: every reuse hits
        assert rate == unbounded_hit_rate(trace)
