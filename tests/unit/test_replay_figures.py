"""chm.sim.replay.figures and the baselines' policies it uses, on hand-computed
examples, small replays and one real Redis."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chm.sim.replay import figures as F
from chm.sim.replay.baselines import BaselineReplay, SystemSpec
from chm.sim.replay.lru import LruBlocks
from chm.sim.replay.prefill import GPUS, MODELS, PrefillModel
from chm.sim.replay.tiers import TierParams
from chm.sim.workloads.records import Request

MiB = 1 << 20
BB = 16 * MiB  # Llama-3.1-8B, 128-token blocks
PM = PrefillModel(MODELS["llama-3.1-8b"], GPUS["a100-80g"])
TOOL = Path(__file__).resolve().parents[2] / "tools" / "replay" / "figures.py"
# one block loads in 1 s, no latency: times are block counts
ONE_BLOCK_PER_S = TierParams(name="t", bandwidth_Bps=float(BB), latency_s=0.0)


def _req(i: int, keys: str, turn: int = 0, session: int = 0) -> Request:
    ks = tuple(k.encode() for k in keys)
    return Request(i, 0.0, 128 * len(ks) + 5, 1, 128, ks, session=session, turn=turn)


def _run(spec: SystemSpec, reqs: list[Request], workers: int = 1) -> BaselineReplay:
    rp = BaselineReplay(spec, PM, workers=workers)
    for r in reqs:
        rp.step(r)
    return rp


def test_a_store_that_fails_when_full_breaks_later_prefixes() -> None:
    # 2 blocks, no eviction: "ab" stores a, b; "abc" hits a b, c refused;
    # "abcd" hits a b, misses at c (the hole); c and d refused: 3 failures.
    spec = SystemSpec(
        "r",
        gpu_cache=False,
        tier_capacity_bytes=2 * BB,
        tier=ONE_BLOCK_PER_S,
        store_fails_when_full=True,
    )
    rp = _run(spec, [_req(0, "ab"), _req(1, "abc", 1), _req(2, "abcd", 2)])
    assert [r.tier_hit_blocks for r in rp.results] == [0, 2, 2]
    assert rp.store_failures == 3
    # an evicting tier of the same size keeps the latest blocks instead
    lru = _run(
        SystemSpec("l", gpu_cache=False, tier_capacity_bytes=2 * BB, tier=ONE_BLOCK_PER_S),
        [_req(0, "ab"), _req(1, "abc", 1), _req(2, "abcd", 2)],
    )
    assert [r.tier_hit_blocks for r in lru.results] == [0, 2, 0] and lru.store_failures == 0


def test_lru_blocks_without_eviction() -> None:
    c = LruBlocks(2, evict=False)
    c.access([b"a", b"b", b"c", b"a"])
    assert b"a" in c and b"b" in c and b"c" not in c
    assert c.store_failures == 1 and c.evictions == 0


def test_a_second_tier_continues_the_prefix_at_its_own_cost() -> None:
    # tier 1: one block per worker; tier 2 shared, 4 blocks, loads 2 blocks/s.
    # "ab": both stored in both (tier 1 keeps b). "ab" again: tier 1's prefix
    # is 0 (a is gone), tier 2 serves a and b: 2 blocks at 2 blocks/s = 1 s.
    l2 = TierParams(name="l2", bandwidth_Bps=2.0 * BB, latency_s=0.0)
    spec = SystemSpec(
        "two",
        gpu_cache=False,
        tier_capacity_bytes=BB,
        tier=ONE_BLOCK_PER_S,
        l2_capacity_bytes=4 * BB,
        l2_tier=l2,
    )
    rp = _run(spec, [_req(0, "ab"), _req(1, "ab", 1)])
    assert rp.results[1].tier_hit_blocks == 2
    assert rp.results[1].load_s == pytest.approx(1.0)
    # "xab": nothing (the prefix starts at x)
    rp.step(_req(2, "xab", 2))
    assert rp.results[2].tier_hit_blocks == 0


def test_transfer_buffer_traffic_beyond_the_share_waits_to_drain() -> None:
    # 2 workers share a 2-block buffer: 1 block each. Turn 0 "abc" stores 3
    # blocks: 2 wait, draining at 1 block/s: 2 s. Turn 1 "abcd" loads 3 and
    # stores d: 4 blocks of traffic, 3 wait: 3 s + 3 s of load.
    spec = SystemSpec(
        "m",
        gpu_cache=False,
        tier_capacity_bytes=64 * BB,
        tier_shared=True,
        tier=ONE_BLOCK_PER_S,
        transfer_buffer_bytes=2 * BB,
        transfer_drain_Bps=float(BB),
    )
    rp = _run(spec, [_req(0, "abc"), _req(1, "abcd", 1)], workers=2)
    assert rp.results[0].load_s == pytest.approx(2.0)
    assert rp.results[1].load_s == pytest.approx(3.0 + 3.0)
    assert rp.buffer_wait_s == pytest.approx(5.0)


def test_a_load_past_the_timeout_falls_back_to_recomputation() -> None:
    # 3 blocks take 3 s; with a 2.5 s timeout the request waits 2.5 s and
    # recomputes everything; 2 blocks (2 s) make it.
    spec = SystemSpec(
        "n",
        gpu_cache=False,
        tier_capacity_bytes=64 * BB,
        tier=ONE_BLOCK_PER_S,
        load_timeout_s=2.5,
    )
    rp = _run(spec, [_req(0, "abc"), _req(1, "abc", 1), _req(2, "ab", 2)])
    r = rp.results[1]
    assert r.tier_hit_blocks == 0 and r.load_s == 2.5
    assert r.compute_s == pytest.approx(PM.compute_s(r.input_tokens, 0))
    assert rp.results[2].tier_hit_blocks == 2 and rp.results[2].load_s == pytest.approx(2.0)
    assert rp.timeouts == 1


def test_bad_policy_parameters_are_errors() -> None:
    with pytest.raises(ValueError, match="load_timeout_s"):
        SystemSpec("x", load_timeout_s=-1.0)
    with pytest.raises(ValueError, match="transfer_drain_Bps"):
        SystemSpec("x", transfer_drain_Bps=0.0)
    with pytest.raises(ValueError, match="capacities"):
        SystemSpec("x", l2_capacity_bytes=-1)


SMALL = dict(users=3, turns=3, user_tokens_min=1000, user_tokens_max=2000, scale=64)


def test_fig8_small_has_every_system_and_its_claims() -> None:
    p = F.PdParams(late_turn=3, **SMALL)  # type: ignore[arg-type]
    fig = F.fig8_pd(p)
    systems = {r.system for r in fig.results}
    assert systems == {"gpu-prefix", "local-dram-lru", "remote-dram-pool", "hymcache"}
    assert len(fig.results) == 4 * 9
    assert [c.name.split(" (")[0] for c in fig.claims][:1] == [
        "turn 3 hit rate, HyMCache - Mooncake"
    ]
    dram = fig.claims[-1]
    assert dram.value == 16.0 and dram.met
    rows = fig.rows()
    assert len(rows) == len(fig.results) and "queue_s" in rows[-1]
    with pytest.raises(ValueError, match="late_turn"):
        F.PdParams(late_turn=9)


def test_fig8_and_fig10_verdicts_carry_their_sweeps() -> None:
    p = F.PdParams(late_turn=3, **SMALL)  # type: ignore[arg-type]
    fig = F.fig8_pd(p, session_rates=[1.0])
    rates = [r for r, _ in fig.sweeps["hit_gain_points"]]
    assert rates == [100.0, 1.0]
    assert fig.sweeps["hit_gain_points"][0][1] == fig.claims[0].value
    assert "by start rate 100/s:" in fig.claims[0].name and "; 1/s:" in fig.claims[0].name
    q = F.TransferBufferParams(late_turn=3, knee_bytes=1 << 30, **SMALL)  # type: ignore[arg-type]
    f10 = F.fig10_transfer_buffer(q, [256 << 20, 1 << 30, 4 << 30], drains=[1e9, 100e9])
    by = {d["drain_Bps"]: d["ratio"] for d in f10.summary["mooncake_knee_ratio_by_drain"]}
    assert set(by) == {25e9, 1e9, 100e9}
    # a buffer that drains faster makes the knee no worse
    assert by[1e9] >= by[25e9] >= by[100e9] >= 1.0
    assert "by drain 25 GB/s:" in f10.claims[0].name


def test_fig9_shorter_timeouts_fall_back_more() -> None:
    p = F.NvmeofParams(load_timeout_s=0.01, **SMALL)  # type: ignore[arg-type]
    fig = F.fig9_nvmeof(p, [10.0])
    xfs = dict(fig.sweeps["nvmeof-xfs"])
    # a timeout long enough for every load gives the lower TTFT
    assert xfs[10.0] < xfs[0.01]
    assert fig.summary["timeouts"]["nvmeof-xfs"] >= fig.summary["timeouts"]["nvmeof-raw"]
    assert fig.summary["timeouts"]["nvmeof-xfs"] > 0


def test_fig10_needs_the_knee_and_a_larger_buffer() -> None:
    p = F.TransferBufferParams(late_turn=3, knee_bytes=1 << 30, **SMALL)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="knee_bytes"):
        F.fig10_transfer_buffer(p, [1 << 30])
    fig = F.fig10_transfer_buffer(p, [256 << 20, 1 << 30, 4 << 30])
    moon = dict(fig.sweeps["mooncake"])
    # a smaller buffer never makes Mooncake faster
    assert moon[256 << 20] >= moon[1 << 30] >= moon[4 << 30]


def test_fig12_small_redis_fails_stores() -> None:
    p = F.RedisParams(late_turn=3, redis_bytes=64 * MiB, local_dram_bytes=64 * MiB, **SMALL)  # type: ignore[arg-type]
    fig = F.fig12_redis(p)
    assert fig.summary["store_failures"]["redis-only"] > 0
    assert fig.claims[0].met


def test_the_tool_writes_json_csv_and_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    p = subprocess.run(
        [sys.executable, str(TOOL), "fig12", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode in (0, 1), p.stderr
    # a smoke run is judged on producing its figures
    assert p.returncode == 0, p.stdout
    assert p.stdout.strip().splitlines()[-1] == "fig12: all 3 targets met"
    assert "--quick smoke target" in p.stdout
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["parameters"]["users"] == 3 and len(doc["claims"]) == 3
    for f in ("per_request.csv", "per_turn.csv", "fig12.png"):
        assert (tmp_path / f).stat().st_size > 0
    bad = subprocess.run(
        [sys.executable, str(TOOL), "fig12", "--quick", "--set", "nope=1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no parameter 'nope'" in bad.stderr


@pytest.mark.parametrize("fig", ["fig8", "fig9", "fig10"])
def test_every_figure_command_runs_quick(fig: str, tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(TOOL), fig, "--quick", "--no-plots", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith(f"{fig}: all ")
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["figure"] == fig and doc["claims"] and doc["parameters"]["scale"] == 64
    assert (tmp_path / "per_request.csv").stat().st_size > 0


@pytest.mark.parametrize("fig", ["fig8", "fig12"])
def test_quick_json_without_out_holds_the_verdicts(fig: str, tmp_path: Path) -> None:
    out = tmp_path / f"{fig}.json"
    p = subprocess.run(
        [sys.executable, str(TOOL), fig, "--quick", "--no-plots", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith(f"{fig}: all ")
    doc = json.loads(out.read_text())
    assert doc["figure"] == fig and doc["parameters"]["scale"] == 64
    v = doc["verdicts"]
    assert v["quick"] is True and v["all_met"] is True
    assert len(v["targets"]) == len(doc["claims"]) > 0
    assert all("--quick smoke target" in t["name"] for t in v["targets"])
    assert "environment" in doc and doc["summary"]


def test_json_beside_out_is_results_json(tmp_path: Path) -> None:
    js = tmp_path / "r.json"
    args = ["fig9", "--quick", "--no-plots", "--out", str(tmp_path / "o"), "--json", str(js)]
    p = subprocess.run(
        [sys.executable, str(TOOL), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(js.read_text()) == json.loads((tmp_path / "o" / "results.json").read_text())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--quick", "--json", "/nonexistent-chm-dir/r.json"], "does not exist"),
        (["--quick", "--json", "."], "is a directory"),
        ([], "Missing option '--out'"),
    ],
)
def test_bad_json_path_or_no_destination_is_a_usage_error(args: list[str], message: str) -> None:
    p = subprocess.run(
        [sys.executable, str(TOOL), "fig12", *args], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr and "Traceback" not in p.stderr
    assert "parameters:" not in p.stdout  # refused before replaying


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_real_redis_under_noeviction_refuses_stores_when_full(tmp_path: Path) -> None:
    """The store-failure policy (LruBlocks(evict=False)) is Redis's own: a
    real redis-server at its maxmemory with the default noeviction policy
    refuses new keys with OOM and keeps every key it took."""
    redis = pytest.importorskip("redis")
    sock = tmp_path / "redis.sock"
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory",
            "4mb",
            "--maxmemory-policy",
            "noeviction",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.02)
        r = redis.Redis(unix_socket_path=str(sock))
        r.ping()
        value = b"\0" * (64 << 10)
        stored, failed = [], 0
        for i in range(200):
            try:
                r.set(f"blk{i}", value)
                stored.append(i)
            except redis.exceptions.OutOfMemoryError:  # Redis's OOM reply
                failed += 1
        assert stored and failed  # it filled up and refused the rest
        assert stored == list(range(len(stored)))  # refused from the first failure on
        assert all(r.exists(f"blk{i}") for i in stored)  # nothing evicted
    finally:
        proc.kill()
        proc.wait()
