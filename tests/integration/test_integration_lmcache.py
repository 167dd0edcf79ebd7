"""LMCache end to end on CPU: LMCache's engine (``LMCacheEngineBuilder`` with
its own ``LMCacheEngineConfig``) stores and retrieves KV chunks of several
multi-turn conversations through the chm storage plugin.

chm's DRAM (2 MiB: 1 MiB staging, 1 MiB write buffer) is smaller than one
conversation's history (10 chunks of 256 KiB), LMCache's own CPU tier holds
no copies (``local_cpu: false``), so every hit is read from the chm store.
Retrieved KV is compared byte for byte with what was stored. Covered: a
store call larger than the write buffer (nothing skipped), another model
or KV layout on the same tier (misses), ``clear()``, a clean restart with a
stable chunk hash and no ``PYTHONHASHSEED``, the start-up warning for a
per-process hash, SIGKILL right after a put with only the periodic flusher
(every put older than the flush interval plus one flush is found), two
ranks on one ``chm.path`` (the second logs ``chm: tier not in use``), on
per-rank directories, and on one ``chm-emu serve`` daemon; and LMCache's
own storage check harness (``lmcache.v1.basic_check``).

Stand-in: the serving engine's paged KV memory is a CPU tensor, copied by a
small ``GPUConnectorInterface`` (``CpuKV``), because every LMCache GPU
connector moves KV with CUDA kernels and there is no GPU here; everything
between it and the chm store is LMCache's own code.

Set CHM_REQUIRE_LMCACHE=1 (CI does) to fail instead of skip when LMCache is
not installed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CHM_REQUIRE_LMCACHE") != "1":
    pytest.importorskip(
        "lmcache", reason="LMCache is not installed (make integrations installs chm[lmcache])"
    )
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")

import torch
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.metadata import LMCacheMetadata

from chm.errors import InvalidArgument
from chm.integrations.lmcache import ChmStorageBackend, hash_is_per_process, options

LAYERS, HEADS, HEAD_DIM, CHUNK = 2, 2, 64, 256  # bf16: 1 KiB per token, 256 KiB chunks
USERS, TURNS, GROWTH = 3, 5, 2  # each turn adds 2 chunks: 10 chunks (2.5 MiB) per history
CHM = {"chm.capacity": "256M", "chm.dram": "2M", "chm.wbuf": "1M", "chm.slot_size": "256K"}
# CHM's settings are an embedded store's: with a daemon or nodes, left out
_DAEMONS_OWN: dict[str, Any] = dict.fromkeys(CHM)
CHM_DRAM = 2 << 20
CHUNK_BYTES = 2 * LAYERS * CHUNK * HEADS * HEAD_DIM * 2


class CpuKV(GPUConnectorInterface):  # type: ignore[misc]
    """The serving engine's KV memory: ``kv=`` a [2, layers, tokens, hidden] tensor."""

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, HEADS * HEAD_DIM])

    def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kw: Any) -> None:
        memory_obj.tensor.copy_(kw["kv"][:, :, start:end])

    def to_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kw: Any) -> None:
        kw["kv"][:, :, start:end].copy_(memory_obj.tensor)

    def batched_from_gpu(self, objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
        for o, s, e in zip(objs, starts, ends, strict=True):
            self.from_gpu(o, s, e, **kw)

    def batched_to_gpu(
        self, objs: Any = None, starts: Any = None, ends: Any = None, **kw: Any
    ) -> None:
        for o, s, e in zip(objs, starts, ends, strict=True):
            self.to_gpu(o, s, e, **kw)


def config(
    path: Path | None, cpu_gb: float = 0.02, hash_alg: str = "sha256_cbor", **extra: Any
) -> LMCacheEngineConfig:
    base: dict[str, Any] = {"chm.flush_interval_s": 3600.0, **CHM}  # flushes are the test's
    if path is not None:
        base["chm.path"] = str(path)
    base.update(extra)
    for k in [k for k, v in base.items() if v is None]:
        del base[k]
    return LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK,
        local_cpu=False,
        max_local_cpu_size=cpu_gb,  # LMCache's buffers for retrieves
        pre_caching_hash_algorithm=hash_alg,  # sha256_cbor: stable across processes
        storage_plugins=["chm"],
        extra_config={
            "storage_plugin.chm.module_path": "chm.integrations.lmcache",
            "storage_plugin.chm.class_name": "ChmStorageBackend",
            **base,
        },
    )


_engines = iter(range(1 << 30))


def engine_any(
    path: Path | None,
    cpu_gb: float = 0.02,
    *,
    model: str = "test/llama",
    worker: int = 0,
    world: int = 1,
    heads: int = HEADS,
    hash_alg: str = "sha256_cbor",
    chm: dict[str, Any] | None = None,
    **extra: Any,
) -> tuple[LMCacheEngine, ChmStorageBackend | None, str]:
    """An LMCache engine; its chm backend, or None when LMCache could not create it."""
    name = f"chm-test-{os.getpid()}-{next(_engines)}"
    meta = LMCacheMetadata(
        model_name=model,
        world_size=world,
        local_world_size=world,
        worker_id=worker,
        local_worker_id=worker,
        kv_dtype=torch.bfloat16,
        kv_shape=(LAYERS, 2, CHUNK, heads, HEAD_DIM * HEADS // heads),
    )
    eng = LMCacheEngineBuilder.get_or_create(
        name,
        config(path, cpu_gb, hash_alg, **(chm or {}), **extra),
        meta,
        CpuKV(),
        lambda *a: None,
        lambda *a: None,
    )
    eng.post_init()
    backend = eng.storage_manager.storage_backends.get("chm")
    assert backend is None or isinstance(backend, ChmStorageBackend)
    return eng, backend, name


def engine(
    path: Path | None, cpu_gb: float = 0.02, **kw: Any
) -> tuple[LMCacheEngine, ChmStorageBackend, str]:
    eng, backend, name = engine_any(path, cpu_gb, **kw)
    assert backend is not None, eng.storage_manager.storage_backends
    return eng, backend, name


def history(user: int, turns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A user's tokens and KV after ``turns`` turns (deterministic, distinct per user)."""
    n = turns * GROWTH * CHUNK
    g = torch.Generator().manual_seed(1000 + user)
    tokens = torch.randint(0, 32000, (TURNS * GROWTH * CHUNK,), generator=g)[:n]
    tokens[0] = user  # no two users share a first chunk
    kv = torch.randn(2, LAYERS, TURNS * GROWTH * CHUNK, HEADS * HEAD_DIM, generator=g)
    return tokens, kv[:, :, :n].to(torch.bfloat16).contiguous()


def wait_puts(backend: ChmStorageBackend, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while backend._inflight:
        assert time.monotonic() < deadline, f"puts still in flight after {timeout} s"
        time.sleep(0.002)


def retrieve(eng: LMCacheEngine, user: int, turns: int) -> tuple[int, bool]:
    """Retrieves a user's history; (tokens hit, hit part byte-exact)."""
    tokens, kv = history(user, turns)
    out = torch.zeros_like(kv)
    hit = int(eng.retrieve(tokens, kv=out).sum())
    return hit, torch.equal(out[:, :, :hit].view(torch.uint8), kv[:, :, :hit].view(torch.uint8))


def store_turn(
    eng: LMCacheEngine, backend: ChmStorageBackend, user: int, turn: int, flush: bool = True
) -> None:
    """Stores turn ``turn`` (1-based): the new chunks of the user's history."""
    tokens, kv = history(user, turn)
    mask = torch.ones(len(tokens), dtype=torch.bool)
    mask[: (turn - 1) * GROWTH * CHUNK] = False  # the prefix is stored already
    eng.store(tokens, mask=mask, kv=kv)
    wait_puts(backend)
    if flush:
        backend.flush()


def run_conversations(eng: LMCacheEngine, backend: ChmStorageBackend) -> list[tuple[int, int]]:
    """USERS x TURNS: each turn first reloads the history, then stores its new chunks."""
    hits = []
    for turn in range(1, TURNS + 1):
        for user in range(USERS):
            if turn > 1:
                hit, exact = retrieve(eng, user, turn - 1)
                assert exact, f"user {user} turn {turn}: retrieved KV differs"
                hits.append((hit, (turn - 1) * GROWTH * CHUNK))
            store_turn(eng, backend, user, turn)
    return hits


@pytest.fixture
def engines() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for n in names:
        LMCacheEngineBuilder.destroy(n)


class Records(logging.Handler):
    """Collects the plugin's log records (LMCache's loggers do not propagate)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@pytest.fixture
def chm_log() -> Iterator[Records]:
    h = Records()
    lg = logging.getLogger("chm.integrations.lmcache")
    lg.addHandler(h)
    yield h
    lg.removeHandler(h)


def test_multiturn_through_lmcache_engine(tmp_path: Path, engines: list[str]) -> None:
    assert GROWTH * TURNS * CHUNK_BYTES > CHM_DRAM  # one history does not fit chm's DRAM
    eng, backend, name = engine(tmp_path / "kv")
    engines.append(name)
    hits = run_conversations(eng, backend)
    assert hits and all(h == want for h, want in hits), hits
    st = backend.stats()
    assert st["puts_skipped"] == 0 and st["puts_error"] == 0, st
    assert st["staging_skipped"] == 0, st
    assert st["checksum_errors"] == 0 and st["io_errors"] == 0, st
    assert st["entries"] == USERS * TURNS * GROWTH  # one block per chunk, metadata in its index
    assert st["gets_hit"] >= USERS * (TURNS - 1) * GROWTH

    # restart: a new engine and backend on the same directory
    LMCacheEngineBuilder.destroy(name)
    engines.remove(name)
    assert backend.store.closed
    eng2, backend2, name2 = engine(tmp_path / "kv")
    engines.append(name2)
    assert backend2.stats()["recovered_entries"] == st["entries"]
    for user in range(USERS):
        hit, exact = retrieve(eng2, user, TURNS)
        assert hit == TURNS * GROWTH * CHUNK and exact, (user, hit)


def test_store_call_larger_than_the_write_buffer_loses_nothing(
    tmp_path: Path, engines: list[str]
) -> None:
    """One store call of a whole history (10 chunks, 2.5 MiB) into a 1 MiB write
    buffer: every chunk is stored (the store alone kept 4 and skipped the rest)."""
    eng, backend, name = engine(tmp_path / "kv")
    engines.append(name)
    assert backend.store.device.config.wbuf_bytes < TURNS * GROWTH * CHUNK_BYTES
    for user in range(USERS):
        tokens, kv = history(user, TURNS)
        eng.store(tokens, kv=kv)
    for _ in range(USERS):
        wait_puts(backend, 60)
    st = backend.stats()
    assert st["staging_skipped"] == 0 and st["entries"] == USERS * TURNS * GROWTH, st
    # staging_retries is not asserted: whether the device's flusher kept up with
    # the call depends on the disk and the load (tests/unit/test_kv_staging.py
    # checks the retry path itself); the call outgrowing the buffer is what matters
    for user in range(USERS):
        hit, exact = retrieve(eng, user, TURNS)
        assert hit == TURNS * GROWTH * CHUNK and exact, (user, hit)


def test_default_write_buffer_holds_one_store_call(tmp_path: Path, engines: list[str]) -> None:
    _eng, backend, name = engine(
        tmp_path / "kv", chm={"chm.wbuf": None, "chm.dram": "8M", "chm.batch": 10}
    )
    engines.append(name)
    assert backend.store.device.config.wbuf_bytes >= 10 * CHUNK_BYTES


def test_full_staging_queue_skips_counts_and_warns(
    tmp_path: Path, engines: list[str], chm_log: Records
) -> None:
    eng, backend, name = engine(tmp_path / "kv", chm={"chm.staging": "512K"})
    engines.append(name)
    tokens, kv = history(0, TURNS)
    eng.store(tokens, kv=kv)
    wait_puts(backend, 60)
    st = backend.stats()
    assert 0 < st["staging_skipped_full"] == TURNS * GROWTH - st["entries"], st
    warn = [m for m in chm_log.lines(logging.WARNING) if "not stored" in m]
    assert warn and "staging queue is full" in warn[0]
    hit, exact = retrieve(eng, 0, TURNS)
    assert exact and hit == st["entries"] * CHUNK  # the stored prefix, then recompute


def test_another_model_or_layout_on_the_same_tier_misses(
    tmp_path: Path, engines: list[str]
) -> None:
    eng, backend, name = engine(tmp_path / "kv")
    for user in range(USERS):
        store_turn(eng, backend, user, 1)
    LMCacheEngineBuilder.destroy(name)
    for kw in ({"model": "test/other"}, {"heads": 1}, {"world": 2}):
        eng2, _, name2 = engine(tmp_path / "kv", **kw)
        assert [retrieve(eng2, u, 1)[0] for u in range(USERS)] == [0] * USERS, kw
        LMCacheEngineBuilder.destroy(name2)
    eng3, _, name3 = engine(tmp_path / "kv")
    engines.append(name3)
    assert [retrieve(eng3, u, 1) for u in range(USERS)] == [(GROWTH * CHUNK, True)] * USERS


def test_clear_removes_what_the_engine_knows(tmp_path: Path, engines: list[str]) -> None:
    eng, backend, name = engine(tmp_path / "kv")
    engines.append(name)
    for user in range(USERS):
        store_turn(eng, backend, user, 1)
    assert eng.clear() >= USERS * GROWTH * CHUNK  # tokens cleared (chm's, and any other tier's)
    assert backend.stats()["entries"] == 0
    assert [retrieve(eng, u, 1)[0] for u in range(USERS)] == [0] * USERS


def test_history_larger_than_lmcache_cpu_pool_is_partial_not_a_hang(
    tmp_path: Path, engines: list[str]
) -> None:
    eng, backend, name = engine(tmp_path / "kv")
    engines.append(name)
    for turn in range(1, TURNS + 1):
        store_turn(eng, backend, 0, turn)
    LMCacheEngineBuilder.destroy(name)
    engines.remove(name)
    # LMCache's CPU pool (1 MiB) holds 4 of the 10 chunks: the retrieve returns
    # that prefix at once (the rest is recomputed), it does not wait for space
    eng2, _, name2 = engine(tmp_path / "kv", cpu_gb=1 / 1024)
    engines.append(name2)
    t0 = time.monotonic()
    hit, exact = retrieve(eng2, 0, TURNS)
    assert time.monotonic() - t0 < 10
    assert exact and 0 < hit < TURNS * GROWTH * CHUNK, hit


def test_bad_options_are_refused_with_their_name(tmp_path: Path) -> None:
    required = r"one of chm\.path .*, chm\.socket .* and chm\.master .* is required"
    with pytest.raises(InvalidArgument, match=required):
        options({"chm.capacity": "1G"})
    with pytest.raises(InvalidArgument, match=required):
        options({"chm.path": "/x", "chm.socket": "/y"})
    with pytest.raises(InvalidArgument, match=required):
        options({"chm.socket": "/y", "chm.master": "redis://h:6379/0"})
    o = options({"chm.master": "redis://h:6379/0", "chm.nodes": ["a", "b"]})
    assert o["master"] == "redis://h:6379/0" and o["nodes"] == "a,b"  # a YAML list
    with pytest.raises(InvalidArgument, match=r"unknown chm option\(s\) \['chm.capasity'\]"):
        options({"chm.path": "/x", "chm.capasity": "1G"})
    with pytest.raises(InvalidArgument, match=r"chm.get_timeout_s='soon' is not a float"):
        options({"chm.path": "/x", "chm.get_timeout_s": "soon"})
    with pytest.raises(InvalidArgument, match=r"chm.flush_interval_s must be >= 0"):
        options({"chm.path": "/x", "chm.flush_interval_s": -1})
    with pytest.raises(InvalidArgument, match=r"chm.per_rank_dir='maybe' is not a boolean"):
        options({"chm.path": "/x", "chm.per_rank_dir": "maybe"})
    o = options({"chm.path": "/x", "chm.sparse_overcommit": "true"})
    assert o["sparse_overcommit"] is True and o["staging"] == "1G" and "slot_size" not in o


def test_capacity_beyond_the_free_space_is_refused(
    tmp_path: Path, engines: list[str], chm_log: Records
) -> None:
    from chm.kv.capacity import free_bytes

    huge = f"{(free_bytes(tmp_path) >> 30) + 1024}G"
    _, backend, name = engine_any(tmp_path / "kv", chm={"chm.capacity": huge})
    engines.append(name)
    assert backend is None  # LMCache logs the backend's error and runs without it
    errors = [m for m in chm_log.lines(logging.ERROR) if m.startswith("chm: tier not in use")]
    assert errors and "bytes) free" in errors[0] and "chm.sparse_overcommit" in errors[0]
    LMCacheEngineBuilder.destroy(name)
    engines.remove(name)
    _eng, backend, name = engine_any(
        tmp_path / "kv2", chm={"chm.capacity": huge, "chm.sparse_overcommit": True}
    )
    engines.append(name)
    assert backend is not None


def test_chunk_larger_than_a_slot_is_not_stored_and_recomputed(
    tmp_path: Path, engines: list[str], chm_log: Records
) -> None:
    eng, backend, name = engine(
        tmp_path / "kv", 0.02, chm={"chm.slot_size": "64K", "chm.dram": "2M"}
    )
    engines.append(name)
    assert any("no chunk can be stored" in m for m in chm_log.lines(logging.ERROR))
    tokens, kv = history(0, 1)  # 256 KiB chunks > 64 KiB slots
    eng.store(tokens, kv=kv)
    wait_puts(backend)
    assert backend.stats()["entries"] == 0
    assert backend.stats()["lmcache_puts_too_large"] == GROWTH
    out = torch.zeros_like(kv)
    assert int(eng.retrieve(tokens, kv=out).sum()) == 0  # a miss: the engine recomputes


def test_per_process_hash_is_detected() -> None:
    class Cfg:
        pre_caching_hash_algorithm = "builtin"

    seed = os.environ.pop("PYTHONHASHSEED", None)
    try:
        assert hash_is_per_process(Cfg())
        Cfg.pre_caching_hash_algorithm = "sha256_cbor"
        assert not hash_is_per_process(Cfg())
        os.environ["PYTHONHASHSEED"] = "0"
        Cfg.pre_caching_hash_algorithm = "builtin"
        assert not hash_is_per_process(Cfg())
    finally:
        os.environ.pop("PYTHONHASHSEED", None)
        if seed is not None:
            os.environ["PYTHONHASHSEED"] = seed


# ---- two ranks


def test_embedded_settings_with_a_daemon_fail_loudly(
    tmp_path: Path, engines: list[str], chm_log: Records
) -> None:
    """An embedded config (the tests' chm.capacity and chm.slot_size) with
    chm.socket in place of chm.path: those settings would be ignored, so the
    plugin refuses them, naming each (LMCache runs on without it; the log
    line says why)."""
    kw: dict[str, Any] = {"chm.socket": str(tmp_path / "s"), "chm.dram": None, "chm.wbuf": None}
    _, b, n = engine_any(None, **kw)
    engines.append(n)
    assert b is None
    errors = [m for m in chm_log.lines(logging.ERROR) if m.startswith("chm: tier not in use")]
    assert errors and "'chm.capacity', 'chm.slot_size': setting(s) of an embedded" in errors[0]


def test_two_ranks_on_one_path_the_second_fails_loudly(
    tmp_path: Path, engines: list[str], chm_log: Records
) -> None:
    _eng0, _, n0 = engine(tmp_path / "kv", worker=0, world=2)
    engines.append(n0)
    _, b1, n1 = engine_any(tmp_path / "kv", worker=1, world=2)
    engines.append(n1)
    assert b1 is None  # LMCache swallowed the error ...
    errors = [m for m in chm_log.lines(logging.ERROR) if m.startswith("chm: tier not in use")]
    assert errors and str(tmp_path / "kv") in errors[0]  # ... but not the log line


def test_two_ranks_on_per_rank_directories(tmp_path: Path, engines: list[str]) -> None:
    ranks = [
        engine(tmp_path / "kv", worker=w, world=2, chm={"chm.per_rank_dir": True}) for w in (0, 1)
    ]
    engines += [n for _, _, n in ranks]
    for w, (eng, b, _) in enumerate(ranks):
        assert b.tier.where == str(tmp_path / "kv" / f"rank{w}")
        store_turn(eng, b, w, 1)
    for w, (eng, _, _) in enumerate(ranks):
        assert retrieve(eng, w, 1) == (GROWTH * CHUNK, True)


def test_two_ranks_share_one_daemon(tmp_path: Path, engines: list[str]) -> None:
    from chm.testing.daemon_proc import DaemonProcess

    sock = tmp_path / "chm.sock"
    toml = tmp_path / "chm-emu.toml"
    toml.write_text(
        f'[device]\ntargets = ["{tmp_path / "served.img"}"]\ncreate = true\n'
        'capacity = "256M"\ndram = "4M"\nwbuf = "1M"\nslot_size = "256K"\n'
    )
    with DaemonProcess(["--config", str(toml)], sock) as daemon:
        kw: dict[str, Any] = {"chm.socket": str(sock), **_DAEMONS_OWN}
        ranks = [engine(None, worker=w, world=2, **kw) for w in (0, 1)]
        engines += [n for _, _, n in ranks]
        for w, (eng, b, _) in enumerate(ranks):
            assert b.tier.remote
            for turn in range(1, TURNS + 1):
                store_turn(eng, b, w, turn)
        for w, (eng, _, _) in enumerate(ranks):
            assert retrieve(eng, w, TURNS) == (TURNS * GROWTH * CHUNK, True)
        # one index for both ranks: the daemon holds every chunk of both
        st = ranks[0][1].stats()
        assert st["entries"] == 2 * TURNS * GROWTH and st["staging_skipped"] == 0, st
        for _, _, n in ranks:
            LMCacheEngineBuilder.destroy(n)
            engines.remove(n)
        assert daemon.proc is not None and daemon.proc.poll() is None


# ---- remote nodes: a Master on Redis and a node process


_NODE_OPTS = ["--capacity", "64M", "--dram", "24M", "--wbuf", "8M", "--slot-size", "1M"]


def documented_remote_keys() -> dict[str, Any]:
    """The ``chm.*`` keys of the remote-nodes example in docs/integrations.md, as written."""
    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    for m in re.finditer(r"```yaml\n(.*?)```", text, re.S):
        if "chm.master" in m[1]:
            extra = yaml.safe_load(m[1])["extra_config"]
            assert extra["storage_plugin.chm.module_path"] == "chm.integrations.lmcache"
            return {k: v for k, v in extra.items() if k.startswith("chm.")}
    raise AssertionError("docs/integrations.md has no LMCache example with chm.master")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
    """A real redis-server, one node process (``chm-emu serve --master``)
    and the ``chm.*`` keys that put an engine on them."""
    import importlib.util

    from chm.testing.redisd import RedisServer, redis_server_path
    from chm.testing.remote import NodeProcess, write_secret

    if redis_server_path() is None or importlib.util.find_spec("mooncake") is None:
        pytest.skip("redis-server or the 'remote' extra (mooncake) is not installed")
    write_secret(tmp_path / "secret")
    with (
        RedisServer() as srv,
        NodeProcess(
            srv.url,
            "node-a",
            tmp_path / "node-a",
            tmp_path / "secret",
            options=[*_NODE_OPTS, "--lease", "1.0"],
        ) as node,
    ):
        kw = documented_remote_keys()
        assert {"chm.master", "chm.secret_file", "chm.nodes"} <= set(kw), kw
        kw.update(
            {
                "chm.master": srv.url,
                "chm.secret_file": str(tmp_path / "secret"),
                "chm.nodes": "node-a",
                "chm.host": "127.0.0.1",
                "chm.get_timeout_s": 3.0,
                **_DAEMONS_OWN,  # the node's settings
            }
        )
        yield srv, node, kw


def test_two_workers_share_one_tier_on_a_remote_node(
    engines: list[str], fleet: tuple[Any, Any, dict[str, Any]]
) -> None:
    """Two LMCache engines (two workers of one model) on one remote node:
    what one stores the other retrieves, byte-exact, out of the node."""
    _srv, _node, kw = fleet
    eng_a, b_a, name_a = engine(None, **kw)
    eng_b, b_b, name_b = engine(None, **kw)
    engines += [name_a, name_b]
    assert b_a.tier.nodes and b_b.tier.nodes
    for user in range(USERS):
        for turn in range(1, TURNS + 1):
            store_turn(eng_a, b_a, user, turn)
    for user in range(USERS):
        assert retrieve(eng_b, user, TURNS) == (TURNS * GROWTH * CHUNK, True), user
    st_a, st_b = b_a.stats(), b_b.stats()
    assert st_a["staging_stored_blocks"] == USERS * TURNS * GROWTH, st_a
    assert st_a["staging_skipped"] == 0 and st_a["error_blocks"] == 0, st_a
    # worker B read every chunk from the node (its metadata too), none from A
    assert st_b["remote_loaded"] >= USERS * TURNS * GROWTH, st_b
    assert st_b["remote_bad_checksums"] == 0, st_b
    # another model on the same tier misses
    eng_c, _, name_c = engine(None, model="test/other", **kw)
    engines.append(name_c)
    assert retrieve(eng_c, 0, TURNS)[0] == 0


def test_a_killed_node_is_a_miss_not_a_hang(
    engines: list[str], fleet: tuple[Any, Any, dict[str, Any]]
) -> None:
    _srv, node, kw = fleet
    eng, b, name = engine(None, **kw)
    engines.append(name)
    store_turn(eng, b, 0, 1)
    assert retrieve(eng, 0, 1) == (GROWTH * CHUNK, True)
    node.kill()
    t0 = time.monotonic()
    assert retrieve(eng, 0, 1)[0] == 0  # a miss: LMCache recomputes
    store_turn(eng, b, 1, 1)  # puts end (as errors), they do not wait for the node
    took = time.monotonic() - t0
    assert took < 2 * kw["chm.get_timeout_s"], took
    st = b.stats()
    assert st["remote_node_errors"] + st["no_node"] > 0, st
    assert st["staging_error_blocks"] == GROWTH, st


# ---- processes: restart and SIGKILL


def _phase_store(path: str, how: str) -> None:
    """Subprocess: stores every conversation; ``kill`` dies by SIGKILL right
    after the last put, flushing only through chm.flush_interval_s."""
    kill = how == "kill"
    extra: dict[str, Any] = {"chm.flush_interval_s": FLUSH_S} if kill else {}
    if how == "builtin":
        extra["hash_alg"] = "builtin"
    eng, backend, _ = engine(Path(path), **extra)
    acked: list[tuple[int, int, float]] = []
    for turn in range(1, TURNS + 1):
        for user in range(USERS):
            store_turn(eng, backend, user, turn, flush=False)
            acked.append((user, turn, time.monotonic()))
    if kill:  # the interval and one flush later, one more put, and the crash right after
        time.sleep(FLUSH_S + 1.0)
        store_turn(eng, backend, USERS, 1, flush=False)
        acked.append((USERS, 1, time.monotonic()))
    now = time.monotonic()
    print(json.dumps({"acked": [(u, t, now - at) for u, t, at in acked]}), flush=True)
    if kill:
        os.kill(os.getpid(), signal.SIGKILL)
    LMCacheEngineBuilder.destroy(_)
    os._exit(0)


def _phase_rank1(path: str, how: str) -> None:
    """Subprocess: rank 1 of 2 on ``path``; prints whether LMCache got a chm backend."""
    _, b, _ = engine_any(Path(path), worker=1, world=2)
    print(json.dumps({"backend": b is not None}), flush=True)
    os._exit(0)


def _phase_retrieve(path: str, how: str) -> None:
    eng, backend, _ = engine(Path(path))
    res = {f"{u},{t}": retrieve(eng, u, t) for u in range(USERS) for t in range(1, TURNS + 1)}
    res[f"{USERS},1"] = retrieve(eng, USERS, 1)
    rec = backend.stats()["recovered_entries"]
    print(json.dumps({"res": res, "rec": rec}))
    sys.stdout.flush()
    os._exit(0)


FLUSH_S = 0.5


def _run(phase: str, path: Path, how: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LMCACHE_TRACK_USAGE="false")
    env.pop("PYTHONHASHSEED", None)  # the config's hash must be stable on its own
    return subprocess.run(
        [sys.executable, __file__, phase, str(path), how],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )


def _last_json(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
def test_second_process_on_one_path_logs_tier_not_in_use(
    tmp_path: Path, engines: list[str]
) -> None:
    _, _, n0 = engine(tmp_path / "kv", worker=0, world=2)
    engines.append(n0)
    p = _run("rank1", tmp_path / "kv")
    assert p.returncode == 0, p.stderr[-3000:]
    assert _last_json(p) == {"backend": False}  # LMCache runs that rank without chm ...
    lines = [ln for ln in p.stderr.splitlines() if "chm: tier not in use" in ln]
    assert lines and "ERROR" in lines[0] and str(tmp_path / "kv") in lines[0]  # ... loudly


@pytest.mark.slow
def test_restart_finds_every_history_without_hashseed(tmp_path: Path) -> None:
    p1 = _run("store", tmp_path / "kv", "clean")
    assert p1.returncode == 0, p1.stderr[-3000:]
    assert "per-process hash" not in p1.stderr
    p2 = _run("retrieve", tmp_path / "kv")
    assert p2.returncode == 0, p2.stderr[-3000:]
    got = _last_json(p2)
    assert got["rec"] == USERS * TURNS * GROWTH
    for key, (hit, exact) in got["res"].items():
        user, turns = map(int, key.split(","))
        if user < USERS:  # user USERS is only stored by the SIGKILL run
            assert hit == turns * GROWTH * CHUNK and exact, (key, hit)


def test_per_process_hash_warns_at_start(
    tmp_path: Path, engines: list[str], chm_log: Records, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    _, _, name = engine(tmp_path / "kv", hash_alg="builtin")
    engines.append(name)
    warn = chm_log.lines(logging.WARNING)
    assert any("chunk hash is Python's per-process hash()" in m for m in warn), warn
    _, _, name = engine(tmp_path / "kv2")
    engines.append(name)
    assert not any("per-process" in m for m in chm_log.lines(logging.WARNING)[len(warn) :])


def test_flush_interval_starts_the_periodic_flusher(tmp_path: Path, engines: list[str]) -> None:
    eng, backend, name = engine(tmp_path / "kv", chm={"chm.flush_interval_s": 0.2})
    engines.append(name)
    store_turn(eng, backend, 0, 1, flush=False)
    deadline = time.monotonic() + 10
    while backend.stats()["pending_entries"] and time.monotonic() < deadline:
        time.sleep(0.02)
    st = backend.stats()
    assert st["pending_entries"] == 0 and st["durable_entries"] == GROWTH, st
    assert st["autoflushes"] >= 1


@pytest.mark.slow
def test_sigkill_right_after_a_put_keeps_every_older_put(tmp_path: Path) -> None:
    p1 = _run("store", tmp_path / "kv", "kill")
    assert p1.returncode == -signal.SIGKILL, p1.stderr[-3000:]
    acked = _last_json(p1)["acked"]
    p2 = _run("retrieve", tmp_path / "kv")
    assert p2.returncode == 0, p2.stderr[-3000:]
    res = _last_json(p2)["res"]
    bound = FLUSH_S + 1.0  # the interval plus one flush of a turn's chunks
    old = [(u, t) for u, t, age in acked if age > bound]
    assert len(old) == USERS * TURNS, acked  # all but the put right before the crash
    for u, t in old:
        hit, exact = res[f"{u},{t}"]
        assert hit >= t * GROWTH * CHUNK and exact, (u, t, hit, acked)
    for _, exact in res.values():
        assert exact  # whatever else was found is byte-exact too


def test_lmcache_storage_check_harness(tmp_path: Path) -> None:
    cfg = tmp_path / "lmcache.yaml"
    extra = {
        "storage_plugin.chm.module_path": "chm.integrations.lmcache",
        "storage_plugin.chm.class_name": "ChmStorageBackend",
        "chm.path": str(tmp_path / "kv"),
        **CHM,
    }
    cfg.write_text(
        json.dumps(  # JSON is YAML
            {
                "chunk_size": CHUNK,
                "local_cpu": False,
                "max_local_cpu_size": 0.05,
                "storage_plugins": ["chm"],
                "extra_config": extra,
            }
        )
    )
    env = dict(os.environ, LMCACHE_CONFIG_FILE=str(cfg), LMCACHE_TRACK_USAGE="false")
    p = subprocess.run(
        [sys.executable, "-m", "lmcache.v1.basic_check", "--mode", "test_storage_manager",
         "--num-keys", "20"],
        capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    out = p.stdout
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Created dynamic backend: chm" in p.stdout + p.stderr
    assert "Test Failed" not in out, out[-3000:]
    checks = re.findall(r"Validation(?: \(content correct\))?: (\d+)/(\d+) passed", out)
    assert len(checks) >= 3, out[-3000:]  # exists (absent), exists (present), content
    assert all(a == b == "20" for a, b in checks), checks


if __name__ == "__main__":
    phases = {"store": _phase_store, "retrieve": _phase_retrieve, "rank1": _phase_rank1}
    phases[sys.argv[1]](sys.argv[2], sys.argv[3])
