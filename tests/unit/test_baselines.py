"""chm.sim.replay.baselines: each baseline's cache behaviour on hand-worked examples."""

from __future__ import annotations

import pytest

from chm.sim.replay import (
    BaselineReplay,
    GpuPreset,
    LruBlocks,
    ModelPreset,
    PrefillModel,
    SystemSpec,
    TierParams,
    baseline_systems,
    per_turn,
    simulate,
    simulate_closed_loop,
)
from chm.sim.workloads import Request

# 10 bytes of KV per token and 2-token blocks: a block is 20 bytes.
TINY = PrefillModel(
    ModelPreset(name="tiny", params=1e3, layers=1, hidden=1, kv_bytes_per_token=10),
    GpuPreset(name="toy", peak_flops=1e6, mfu=1.0, memory_bytes=1 << 20),
)
BB = 20
SLOW = TierParams(name="slow", bandwidth_Bps=20.0, latency_s=1e-3)


def req(index: int, keys: str, session: int | None = None, extra_tokens: int = 0) -> Request:
    """A request whose full blocks are the letters of ``keys``."""
    ks = tuple(k.encode() for k in keys)
    return Request(index, float(index), 2 * len(ks) + extra_tokens, 1, 2, ks, session, 0)


def test_lru_blocks_by_hand() -> None:
    c = LruBlocks(3)
    c.access([b"A", b"B", b"C", b"D"])  # A is pushed out by D
    assert [k for k in (b"A", b"B", b"C", b"D") if k in c] == [b"B", b"C", b"D"]
    assert c.prefix_len([b"B", b"C", b"X", b"D"]) == 2
    assert c.prefix_len([b"B", b"C", b"X", b"D"], start=3) == 1
    c.access([b"B"])  # B most recent: C is next out
    c.access([b"E"])
    assert b"C" not in c
    assert b"B" in c
    assert c.evictions == 2
    assert len(c) == 3
    zero = LruBlocks(0)
    zero.access([b"A"])
    assert b"A" not in zero
    with pytest.raises(ValueError, match="capacity must be >= 0 blocks, got -1"):
        LruBlocks(-1)


def test_recompute_never_hits() -> None:
    reqs = [req(0, "AB"), req(1, "AB"), req(2, "ABC")]
    res = simulate(reqs, baseline_systems()["recompute"], TINY)
    assert [(r.gpu_hit_blocks, r.tier_hit_blocks) for r in res] == [(0, 0)] * 3
    assert [r.hit_rate for r in res] == [0.0, 0.0, 0.0]
    assert all(r.tier_bytes == 0 and r.load_s == 0.0 and r.tier_name == "" for r in res)


def test_gpu_prefix_cache_by_hand() -> None:
    # G1 of 3 blocks (60 bytes):
    #   r0 ABCD: no hit; A is evicted by D          -> [B C D]
    #   r1 AB:   A missing, no hit; A, B pushed in  -> [D A B]
    #   r2 DABE: D, A, B held -> 3 hits; E evicts D -> [A B E]
    #   r3 ABE:  3 hits (the whole prompt)
    system = SystemSpec("gpu-prefix", hbm_kv_bytes=3 * BB + 7)  # a partial block counts for nothing
    res = simulate([req(0, "ABCD"), req(1, "AB"), req(2, "DABE"), req(3, "ABE")], system, TINY)
    assert [r.gpu_hit_blocks for r in res] == [0, 0, 3, 3]
    assert [r.tier_hit_blocks for r in res] == [0, 0, 0, 0]
    assert [r.gpu_bytes for r in res] == [0, 0, 60, 60]
    assert [r.cached_tokens for r in res] == [0, 0, 6, 6]
    assert res[2].hit_rate == 6 / 8


def test_gpu_capacity_defaults_to_the_gpu_preset() -> None:
    # memory 1 MiB x 0.9 - 1000 params x 2 bytes = 941,718 bytes = 47,085 blocks
    assert TINY.hbm_kv_bytes() == 941_718
    keys = "".join(chr(0x100 + i) for i in range(47_086))
    res = simulate([req(0, keys), req(1, keys[1:])], SystemSpec("gpu-prefix"), TINY)
    # the first key was pushed out by the last one; the rest is all held
    assert res[1].gpu_hit_blocks == 47_085


def _two_workers(system: SystemSpec) -> list[tuple[int, int]]:
    reqs = [
        req(0, "SX", session=0),  # worker 0
        req(1, "SY", session=1),  # worker 1
        req(2, "SXW", session=0),  # worker 0
        req(3, "SZ", session=2),  # worker 0 (2 % 2)
    ]
    res = simulate(reqs, system, TINY, workers=2)
    assert [r.worker for r in res] == [0, 1, 0, 0]
    return [(r.gpu_hit_blocks, r.tier_hit_blocks) for r in res]


def test_local_dram_lru_is_per_worker() -> None:
    # G1 of 1 block, 3 tier blocks per worker:
    #   r0 w0 SX:  nothing; G1_0 [X], tier_0 [S X]
    #   r1 w1 SY:  nothing (tier_1 is empty); tier_1 [S Y]
    #   r2 w0 SXW: G1_0 lacks S; tier_0 has S X -> 2 tier hits; tier_0 [S X W]
    #   r3 w0 SZ:  G1_0 [W] lacks S; tier_0 has S -> 1 hit; Z evicts X
    system = SystemSpec("local-dram-lru", hbm_kv_bytes=BB, tier_capacity_bytes=3 * BB)
    assert _two_workers(system) == [(0, 0), (0, 0), (0, 2), (0, 1)]


def test_remote_dram_pool_is_shared() -> None:
    # the same with one shared pool of 3 blocks: r1 on worker 1 finds S
    # that r0 stored from worker 0
    system = SystemSpec(
        "remote-dram-pool", hbm_kv_bytes=BB, tier_capacity_bytes=3 * BB, tier_shared=True
    )
    assert _two_workers(system) == [(0, 0), (0, 1), (0, 2), (0, 1)]


def test_gpu_hits_first_then_the_tier_from_there() -> None:
    # G1 of 2 blocks, tier of 10: r1 finds A B in G1 (the tail C D was pushed
    # out of G1 but is in the tier), then C D in the tier, then stops at X
    system = SystemSpec("fs-ssd", hbm_kv_bytes=2 * BB, tier_capacity_bytes=10 * BB)
    res = simulate([req(0, "CDAB"), req(1, "ABCDXD")], system, TINY)
    assert [(r.gpu_hit_blocks, r.tier_hit_blocks) for r in res] == [(0, 0), (2, 2)]
    assert res[1].gpu_bytes == 40
    assert res[1].tier_bytes == 40
    assert res[1].tier_name == system.tier.name


def test_fs_ssd_loads_at_its_bandwidth() -> None:
    system = SystemSpec("fs-ssd", gpu_cache=False, tier_capacity_bytes=100 * BB, tier=SLOW)
    res = simulate([req(0, "AB"), req(1, "AB", extra_tokens=1)], system, TINY)
    r = res[1]
    assert (r.gpu_hit_blocks, r.tier_hit_blocks) == (0, 2)
    # 2 blocks = 40 bytes at 20 B/s after 1 ms
    assert r.load_s == pytest.approx(1e-3 + 40 / 20)
    # 1 new token after 4 cached: 2*1000*1 + 4*1*1*(1*4 + 1) = 2020 FLOPs at 1e6 FLOP/s
    assert r.compute_s == pytest.approx(2020 / 1e6)
    assert r.ttft_s == pytest.approx(2.001 + 2.02e-3)
    # the first request computed everything: 4 tokens, nothing loaded
    assert res[0].load_s == 0.0
    assert res[0].compute_s == pytest.approx((2000 * 4 + 4 * 10) / 1e6)


def test_default_baselines_have_the_papers_budgets() -> None:
    s = baseline_systems()
    assert list(s) == ["recompute", "gpu-prefix", "local-dram-lru", "remote-dram-pool", "fs-ssd"]
    assert not s["recompute"].gpu_cache
    assert s["gpu-prefix"].tier_capacity_bytes == 0
    assert s["local-dram-lru"].tier_capacity_bytes == 64 << 30
    assert not s["local-dram-lru"].tier_shared
    assert s["remote-dram-pool"].tier_capacity_bytes == 1 << 40
    assert s["remote-dram-pool"].tier_shared
    assert s["fs-ssd"].tier.bandwidth_Bps == 6.5e9


def test_per_turn_summary_by_hand() -> None:
    reqs = [
        Request(0, 0.0, 5, 1, 2, (b"A", b"B"), 0, 0),
        Request(1, 1.0, 4, 1, 2, (b"A", b"C"), 1, 0),
        Request(2, 2.0, 7, 1, 2, (b"A", b"B", b"D"), 0, 1),
    ]
    res = simulate(reqs, SystemSpec("gpu-prefix", hbm_kv_bytes=100 * BB), TINY)
    turns = per_turn(res)
    assert [(t.turn, t.requests) for t in turns] == [(0, 2), (1, 1)]
    # turn 0: r1 finds A (2 of 9 prompt tokens); turn 1: A B (4 of 7)
    assert turns[0].cached_tokens == 2
    assert turns[0].hit_rate == pytest.approx(2 / 9)
    assert turns[1].hit_rate == pytest.approx(4 / 7)
    assert turns[1].gpu_bytes == 2 * BB
    assert turns[0].mean_ttft_s == pytest.approx((res[0].ttft_s + res[1].ttft_s) / 2)


def test_bad_replays_are_refused() -> None:
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        simulate([], SystemSpec(), TINY, workers=0)
    mixed = [req(0, "A"), Request(1, 1.0, 8, 1, 4, (b"B", b"C"))]
    with pytest.raises(ValueError, match="request 1 has 4-token blocks"):
        simulate(mixed, SystemSpec(hbm_kv_bytes=BB), TINY)
    with pytest.raises(ValueError, match="SystemSpec 'x': capacities must be >= 0"):
        SystemSpec("x", tier_capacity_bytes=-1)


def test_closed_loop_arrivals_follow_the_systems_ttft() -> None:
    # one user at a time, no think time: each turn arrives when the previous
    # one's first token is out, and session 1 starts when session 0 is done
    reqs = [
        Request(0, 0.0, 4, 1, 2, (b"A", b"B"), 0, 0),
        Request(1, 0.0, 6, 1, 2, (b"A", b"B", b"C"), 0, 1),
        Request(2, 0.0, 4, 1, 2, (b"A", b"D"), 1, 0),
    ]
    ticks: list[int] = []
    res = simulate_closed_loop(
        reqs,
        SystemSpec("gpu-prefix", hbm_kv_bytes=100 * BB),
        TINY,
        concurrency=1,
        progress=ticks.append,
    )
    assert [(r.session, r.turn) for r in res] == [(0, 0), (0, 1), (1, 0)]
    assert [r.gpu_hit_blocks for r in res] == [0, 2, 1]
    assert res[0].arrival_s == 0.0
    assert res[1].arrival_s == pytest.approx(res[0].ttft_s)
    assert res[2].arrival_s == pytest.approx(res[0].ttft_s + res[1].ttft_s)
    assert ticks == [1, 1, 1]
    # a slower system (nothing cached) pushes the later arrivals out
    slow = simulate_closed_loop(reqs, baseline_systems()["recompute"], TINY, concurrency=1)
    assert slow[2].arrival_s > res[2].arrival_s


def test_step_by_step_equals_simulate() -> None:
    reqs = [req(0, "AB"), req(1, "ABC"), req(2, "AC")]
    system = SystemSpec("gpu-prefix", hbm_kv_bytes=2 * BB)
    replay = BaselineReplay(system, TINY)
    stepped = [replay.step(r) for r in reqs]
    assert stepped == simulate(reqs, system, TINY)
    assert replay.results == stepped
