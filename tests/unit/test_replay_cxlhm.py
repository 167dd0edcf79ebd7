"""CXL-HM replays (chm.replay.cxlhm) on hand-computed examples, in virtual time."""

from __future__ import annotations

from typing import Any

import pytest

import chm
from chm.replay.cxlhm import CxlhmReplay, DeviceTier, replay_cxlhm
from chm.replay.prefill import GPUS, MODELS, PrefillModel
from chm.workloads.records import Request

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


def test_device_tier_evicts_the_least_recent_place() -> None:
    t = DeviceTier(3 * 4096, 4096)
    for k in (b"a", b"b", b"c"):
        t.insert(k, t.place())
    t.touch(b"a")
    a = t.place()  # full: b is the least recent
    assert a == t.stride * 1 and b"b" not in t and t.evictions == 1
    t.unplace(a)
    assert t.place() == a


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


def _reads_only_run(mode: str) -> list[tuple[int, float, int]]:
    # reads-only after the first turn's writes are flushed: the flusher runs
    # in wall time on ghost, so a run with writes in flight is not repeatable
    system = f"cxlhm-{mode}"
    with _dev(mode) as dev:
        rp = CxlhmReplay(dev, system, PREFILL, gpu_cache=False, device_block_bytes=MiB)
        rp.step(_req(0, "abcdefghij"))
        dev.flush()
        out = []
        for t in range(1, 5):
            r = rp.step(_req(t, "abcdefghij", t))
            out.append((r.result.tier_hit_blocks, r.device_load_s, r.ssd_bytes))
    return out


@pytest.mark.parametrize("mode", ["lru", "prefetch"])
def test_virtual_time_reads_are_identical_between_runs(mode: str) -> None:
    a, b = _reads_only_run(mode), _reads_only_run(mode)
    assert a == b
    assert all(h == 10 and s > 0 for h, s, _ in a)
