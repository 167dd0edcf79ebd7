"""CXL-HM replays (chm.sim.replay.cxlhm) on hand-computed examples, in virtual time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import chm
from chm.sim.replay.cxlhm import CxlhmReplay, replay_cxlhm
from chm.sim.replay.prefill import GPUS, MODELS, PrefillModel
from chm.sim.workloads.records import Request

MiB = 1 << 20
PREFILL = PrefillModel(MODELS["llama-3.1-8b"], GPUS["a100-80g"])  # 16 MiB per 128 tokens


def _req(i: int, keys: str, turn: int = 0) -> Request:
    ks = tuple(k.encode() for k in keys)
    return Request(i, 0.0, 128 * len(ks) + 5, 1, 128, ks, session=0, turn=turn)


def _dev(mode: str, capacity: str = "1G") -> chm.Device:
    kw: dict[str, Any] = dict(
        backend="ghost", clock="virtual", capacity=capacity, mode=mode, timing="fpga-cxlhm"
    )
    if mode == "prefetch":
        kw.update(dram="256M", slot_size="1M", wbuf="64M")
    else:
        kw.update(dram="64M")
    return chm.Device.open(**kw)


@pytest.mark.parametrize("system,mode", [("cxlhm-lru", "lru"), ("cxlhm-prefetch", "prefetch")])
def test_hits_loads_and_writes_by_hand(system: str, mode: str) -> None:
    # Turn 0 "abc" finds nothing and writes a, b, c. Turn 1 "abcd" hits a, b, c
    # (3 blocks loaded) and writes d. Turn 2 "xbcd" misses at x: nothing loaded,
    # x written. No G1, so every hit is a tier hit.
    with _dev(mode) as dev:
        rp = CxlhmReplay(dev, system, PREFILL, gpu_cache=False, device_block_bytes=MiB)
        res = replay_cxlhm([_req(0, "abc"), _req(1, "abcd", 1), _req(2, "xbcd", 2)], rp)
    assert [r.result.tier_hit_blocks for r in res] == [0, 3, 0]
    assert [r.writes_offered for r in res] == [3, 1, 1]
    assert [r.writes_skipped for r in res] == [0, 0, 0]
    assert [r.device_load_bytes for r in res] == [0, 3 * MiB, 0]
    assert res[1].result.tier_bytes == 3 * 16 * MiB  # the model's bytes
    assert res[1].device_load_s > 0 and res[1].load_bw_Bps > 0
    # 16 MiB model blocks on 1 MiB device blocks: load time scaled by 16
    assert res[1].result.load_s == pytest.approx(16 * res[1].device_load_s)
    assert res[1].result.hit_rate == pytest.approx(3 * 128 / (4 * 128 + 5))
    assert res[0].device_load_s == 0 and res[2].result.load_s == 0


def test_lru_mode_serves_recent_writes_from_dram() -> None:
    with _dev("lru") as dev:
        rp = CxlhmReplay(dev, "cxlhm-lru", PREFILL, gpu_cache=False, device_block_bytes=MiB)
        res = replay_cxlhm([_req(0, "ab"), _req(1, "ab", 1)], rp)
    # the two written blocks fit the 64 MiB cache: the reload is all DRAM
    assert res[1].dram_bytes == 2 * MiB and res[1].ssd_bytes == 0


@pytest.mark.parametrize("system,mode", [("cxlhm-lru", "lru"), ("cxlhm-prefetch", "prefetch")])
def test_the_tier_is_a_store_with_block_lru_in_key_order(system: str, mode: str) -> None:
    # A tier of 3 blocks (tier_bytes), no G1. "ab", "c": a b c. "a" hits a
    # (order b c a). "d" evicts b (c a d). "ab" hits a, writes b evicting c
    # (d a b). "cd": c's put evicts d, which the request then writes again,
    # evicting a (b c d): the store takes a request's blocks in key order, as
    # an LRU accessed in order does. (The tier before the store touched the
    # request's blocks it held first, so "cd" wrote only c.) "d" hits.
    reqs = [_req(i, k, i) for i, k in enumerate(["ab", "c", "a", "d", "ab", "cd", "d"])]
    with _dev(mode) as dev:
        rp = CxlhmReplay(
            dev, system, PREFILL, gpu_cache=False, device_block_bytes=MiB, tier_bytes=3 * MiB
        )
        res = replay_cxlhm(reqs, rp)
        tier = rp._tier
        assert tier is not None and tier.closed
        st = tier.stats()
    assert [r.result.tier_hit_blocks for r in res] == [0, 0, 1, 0, 1, 0, 1]
    assert [r.writes_offered for r in res] == [2, 1, 0, 1, 1, 2, 0]
    assert st.segments == 3 and st.evicted_blocks == 4 and st.entries == 3
    # eq. 2 counts model blocks: 128 MiB // 16 MiB = 8 device blocks of 1 MiB
    assert tier.window_bytes == 8 * MiB
    assert not Path(tier.stats().journal_path).parent.exists()  # the journal went with it
    with pytest.raises(ValueError, match="closed"):
        rp.step(_req(9, "a"))


def test_a_tier_smaller_than_two_blocks_is_an_error() -> None:
    with _dev("prefetch") as dev:
        rp = CxlhmReplay(
            dev, "cxlhm-prefetch", PREFILL, gpu_cache=False, device_block_bytes=MiB, tier_bytes=MiB
        )
        with pytest.raises(ValueError, match="fewer than 2 blocks"):
            rp.step(_req(0, "a"))


def test_wrong_mode_and_block_size_are_errors() -> None:
    with _dev("lru") as dev:
        with pytest.raises(ValueError, match="prefetch mode"):
            CxlhmReplay(dev, "cxlhm-prefetch", PREFILL)
        with pytest.raises(ValueError, match="unknown CXL-HM system"):
            CxlhmReplay(dev, "cxlhm", PREFILL)
    with _dev("prefetch") as dev:
        rp = CxlhmReplay(dev, "cxlhm-prefetch", PREFILL, device_block_bytes=2 * MiB)
        with pytest.raises(ValueError, match="slots"):
            rp.step(_req(0, "a"))


def _chat_run(mode: str, wbuf: str = "4M") -> list[tuple[Any, ...]]:
    # a multi-turn chat with writes in flight and a small write buffer, open
    # loop: the flusher runs on the simulated clock, so everything repeats
    from chm.sim.workloads import ChatWorkload, generate_chat

    reqs = generate_chat(
        ChatWorkload(users=6, turns=4, user_tokens=(512, 2048), think_time_s=0.01, seed=3)
    )
    kw: dict[str, Any] = dict(
        backend="ghost", clock="virtual", capacity="1G", mode=mode, timing="fpga-cxlhm"
    )
    kw.update(dram="64M", slot_size="1M", wbuf=wbuf) if mode == "prefetch" else kw.update(
        dram="16M"
    )
    with chm.Device.open(**kw) as dev:
        rp = CxlhmReplay(
            dev, f"cxlhm-{mode}", PREFILL, gpu_cache=False, device_block_bytes=MiB, open_loop=True
        )
        res = replay_cxlhm(reqs, rp)
        st = dev.stats()
    out: list[tuple[Any, ...]] = [
        (r.result.tier_hit_blocks, r.writes_skipped, r.device_load_s, r.ssd_bytes, r.clock_end_s)
        for r in res
    ]
    out.append((st.wr_skipped, st.flush_batches, st.read_hits, st.lru_refills, st.clock_now_ns))
    return out


@pytest.mark.parametrize("mode", ["lru", "prefetch"])
def test_virtual_time_replay_is_identical_between_runs(mode: str) -> None:
    a, b = _chat_run(mode), _chat_run(mode)
    assert a == b
    assert sum(r[0] for r in a[:-1]) > 0  # it reused blocks
    if mode == "prefetch":
        assert a[-1][0] > 0 and a[-1][1] > 0  # writes were skipped and flushed


def test_a_larger_write_buffer_skips_fewer_writes() -> None:
    small, big = _chat_run("prefetch", "2M"), _chat_run("prefetch", "32M")
    assert small[-1][0] > big[-1][0]


def test_open_loop_moves_the_clock_to_arrivals_and_needs_virtual_time() -> None:
    reqs = [Request(0, 0.0, 133, 1, 128, (b"a",)), Request(1, 5.0, 261, 1, 128, (b"a", b"b"))]
    with _dev("prefetch") as dev:
        rp = CxlhmReplay(
            dev, "cxlhm-prefetch", PREFILL, gpu_cache=False, device_block_bytes=MiB, open_loop=True
        )
        res = replay_cxlhm(reqs, rp)
        # 16 MiB model blocks on 1 MiB device blocks: the device clock runs
        # 16 times faster than the model's, arrivals included
        assert res[1].clock_end_s >= 5.0 / 16 > res[0].clock_end_s
        assert res[1].first_token_s > 5.0 and res[1].result.arrival_s == 5.0
    with (
        chm.Device.open(backend="ghost", capacity="1G", dram="64M", wbuf="8M", slot_size="1M") as d,
        pytest.raises(ValueError, match="virtual time"),
    ):
        CxlhmReplay(d, "cxlhm-prefetch", PREFILL, open_loop=True)
    with _dev("prefetch") as dev, pytest.raises(ValueError, match="exclude"):
        CxlhmReplay(dev, "cxlhm-prefetch", PREFILL, open_loop=True, closed_loop=True)


def test_host_prefix_buffer_serves_the_pinned_blocks_by_hand() -> None:
    # "s" is the shared prompt block. Pinned 1: turn 1 loads s from the
    # device and keeps it; turn 2 takes s from the host and loads only b.
    reqs = [_req(0, "sa"), _req(1, "sa", 1), _req(2, "sab", 2)]
    with _dev("prefetch") as dev:
        rp = CxlhmReplay(
            dev, "cxlhm-prefetch", PREFILL, gpu_cache=False, device_block_bytes=MiB, pinned_prefix=1
        )
        res = replay_cxlhm(reqs, rp)
    assert [r.result.tier_hit_blocks for r in res] == [0, 2, 2]
    assert [r.host_prefix_blocks for r in res] == [0, 0, 1]
    assert [r.device_load_bytes for r in res] == [0, 2 * MiB, 1 * MiB]
    with pytest.raises(ValueError, match="pinned_prefix"), _dev("prefetch") as dev:
        CxlhmReplay(dev, "cxlhm-prefetch", PREFILL, pinned_prefix=-1)
