"""SGLang HiCache storage with chm, loaded as SGLang loads ``--hicache-storage-backend
dynamic``: through ``StorageBackendFactory.create_backend`` with the extra config,
moving pages in and out of SGLang's real ``MHATokenToKVPoolHost`` on CPU tensors.

Covered: the copying calls (set, batch_set, get, batch_get, exists,
batch_exists) byte-exact with prefix semantics and across a restart; a
batch larger than the write buffer (nothing skipped); the zero-copy
``interface_v1`` calls against the real host pool in its ``page_first`` and
``layer_first`` layouts; the hybrid-model ``*_v2`` calls with a second real
host pool registered as SWA sidecar (trailing-page hit policy); another
model, dtype or page size on the same tier (misses); SIGKILL after a set
with only the periodic flusher; a capacity beyond the free space; two ranks
on one path (the second fails loudly), on per-rank directories and on one
``chm-emu serve`` daemon.

Stand-ins, and why: SGLang's engine cannot run on a CPU-only machine (its
package requires CUDA kernels and torch 2.14.1), so ``make integrations
EXTRAS=sglang`` installs the sglang package without its dependencies plus
the few pure-Python modules its memory-pool modules import. Importing the
host pool runs ``sglang.srt.configs``, whose vision-model configs import
``torchvision``, which does not load next to the CPU build of torch; the
test puts an empty ``torchvision`` module in ``sys.modules`` for that import
only (after ``transformers`` has found torchvision absent). No image code
runs. The device-side KV buffers the host pool is sized from are CPU
tensors. Skipped when sglang is not installed; CHM_REQUIRE_SGLANG=1 fails.
"""

from __future__ import annotations

import importlib.machinery
import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CHM_REQUIRE_SGLANG") != "1":
    pytest.importorskip(
        "sglang.srt.mem_cache.storage.backend_factory",
        reason="SGLang is not installed (make integrations EXTRAS=sglang installs its "
        "HiCache classes; the engine needs CUDA)",
    )

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from chm.errors import Busy, InvalidArgument, NoSpace
from chm.integrations.sglang import ChmHiCacheStorage

PAGE = 64 * 1024  # bytes per page (64 tokens x 1 KiB)
EXTRA = {"backend_name": "chm", "module_path": "chm.integrations.sglang",
         "class_name": "ChmHiCacheStorage", "capacity": "64M", "dram": "2M", "wbuf": "1M",
         "slot_size": "64K"}  # fmt: skip
# EXTRA's device settings are an embedded store's: with a daemon or nodes, left out
DEVICE_OWN: dict[str, Any] = {"capacity": None, "dram": None, "wbuf": None, "slot_size": None}


def _stub_attr(module: str) -> Any:
    def attr(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return types.ModuleType(f"{module}.{name}")

    return attr


def _host_pool_class() -> Any:
    """SGLang's MHATokenToKVPoolHost (see the module doc for the torchvision stand-in)."""
    import transformers  # noqa: F401 - decides torchvision is absent before the stub exists

    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.functional")
    added = []
    for n in names:
        if n not in sys.modules:
            m = types.ModuleType(n)
            m.__path__ = []  # a package, so its submodules import
            m.__spec__ = importlib.machinery.ModuleSpec(n, None)
            m.__getattr__ = _stub_attr(n)  # type: ignore[method-assign]
            sys.modules[n] = m
            added.append(n)
    try:
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    finally:
        for n in added:
            del sys.modules[n]
    return MHATokenToKVPoolHost


def host_pool(
    layout: str = "page_first", *, page: int = 16, layers: int = 4, heads: int = 2,
    head_dim: int = 64, dtype: torch.dtype = torch.bfloat16, tokens: int = 256,
) -> Any:  # fmt: skip
    """A real host pool, sized from CPU "device" KV buffers as SGLang sizes it."""
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo

    cls = _host_pool_class()
    k = tuple(torch.zeros(tokens + page, heads, head_dim, dtype=dtype) for _ in range(layers))
    v = tuple(torch.zeros(tokens + page, heads, head_dim, dtype=dtype) for _ in range(layers))

    def ptrs(ts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(
            k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD
        ),
        page_size=page, head_num=heads, head_dim=head_dim, v_head_dim=head_dim,
        dtype=dtype, device=torch.device("cpu"),
    )  # fmt: skip
    pool = cls(
        info, 2.0, 0, page, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=tokens, start_layer=0, end_layer=layers - 1,
    )  # fmt: skip
    pool._device_buffers = (k, v)  # keep the "device" tensors alive with the pool
    return pool


def fill(pool: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pool.kv_buffer.view(torch.int16).random_(-32768, 32767, generator=g)


def page_bytes(pool: Any, first_token: int) -> list[torch.Tensor]:
    """The bytes of one page as get_page_buffer_meta names them (copies)."""
    ptrs, sizes = pool.get_page_buffer_meta(torch.arange(first_token, first_token + pool.page_size))
    base, buf = pool.kv_buffer.data_ptr(), pool.kv_buffer.view(-1).view(torch.uint8)
    return [buf[p - base : p - base + n].clone() for p, n in zip(ptrs, sizes, strict=True)]


def config(path: Path | None, *, model: str = "test/qwen", tp_rank: int = 0, tp_size: int = 1,
           **extra: Any) -> HiCacheStorageConfig:  # fmt: skip
    e = {**EXTRA, **extra}
    if path is not None:
        e["path"] = str(path)
    for k in [k for k, v in e.items() if v is None]:
        del e[k]
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=model, extra_config=e,
    )  # fmt: skip


def backend(path: Path | None, **kw: Any) -> ChmHiCacheStorage:
    b = StorageBackendFactory.create_backend("dynamic", config(path, **kw), None)
    assert isinstance(b, ChmHiCacheStorage)
    return b


def pages(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(-128, 127, (PAGE // 2,), generator=g).to(torch.bfloat16) for _ in range(n)
    ]


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    got: list[logging.LogRecord] = []

    class H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    h = H(logging.DEBUG)
    lg = logging.getLogger("chm.integrations.sglang")
    lg.addHandler(h)
    yield got
    lg.removeHandler(h)


def test_pages_round_trip_through_sglang_interface(tmp_path: Path) -> None:
    b = backend(tmp_path / "kv")
    keys = [f"{i:064x}" for i in range(24)]  # 24 pages (1.5 MiB) > the 1 MiB write buffer
    data = pages(24, 1)
    assert b.batch_exists(keys) == 0 and not b.exists(keys[0])
    assert b.set(keys[0], data[0])
    assert b.batch_set(keys[1:], data[1:])  # one batch larger than the write buffer
    assert b.store.device.config.wbuf_bytes < 23 * PAGE
    st = b.stats()
    # every page went through the staging queue and was stored; whether the
    # store had to refuse some first (staging_retries) depends on how fast the
    # flusher drained meanwhile, so it is not asserted here (test_kv_staging
    # covers the retries)
    assert st["staging_skipped"] == 0 and st["staging_stored_blocks"] == 24, st
    assert st["entries"] == 24, st
    assert b.batch_exists(keys) == 24 and b.exists(keys[11])
    assert b.batch_exists([*keys[:3], "absent", keys[4]]) == 3  # a prefix, as SGLang asks

    outs = [torch.empty_like(d) for d in data]
    got = b.batch_get(keys, outs)
    assert all(g is o for g, o in zip(got, outs, strict=True))
    assert all(
        torch.equal(o.view(torch.uint8), d.view(torch.uint8))
        for o, d in zip(outs, data, strict=True)
    )
    one = torch.empty_like(data[3])
    assert b.get(keys[3], one) is one and torch.equal(one, data[3])
    assert b.get("absent", torch.empty_like(one)) is None
    assert b.batch_get(["absent", keys[0]], [torch.empty_like(one), one])[0] is None
    b.close()

    b2 = backend(tmp_path / "kv")  # restart: every page is found
    assert b2.stats()["recovered_entries"] == 24
    outs2 = [torch.empty_like(d) for d in data]
    assert all(g is not None for g in b2.batch_get(keys, outs2))
    assert all(torch.equal(o, d) for o, d in zip(outs2, data, strict=True))
    b2.close()


def test_bad_configuration_and_calls_are_refused(tmp_path: Path) -> None:
    cfg = config(tmp_path / "kv")
    del cfg.extra_config["path"]
    with pytest.raises(InvalidArgument, match="'path'"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)
    with pytest.raises(InvalidArgument, match=r"one of extra-config 'path' .* is required"):
        backend(tmp_path / "kv", socket=str(tmp_path / "s"))
    with pytest.raises(InvalidArgument, match=r"one of extra-config 'path' .* is required"):
        backend(tmp_path / "kv", master="redis://127.0.0.1:1/0")
    with pytest.raises(InvalidArgument, match="unknown extra-config"):
        backend(tmp_path / "kv", capcity="1G")
    # an embedded store's settings (EXTRA's capacity, slot_size) with a
    # daemon would be ignored: refused, named, before connecting
    with pytest.raises(InvalidArgument, match=r"'capacity', 'slot_size': setting\(s\) of an emb"):
        backend(None, socket=str(tmp_path / "s"), dram=None, wbuf=None)
    with pytest.raises(InvalidArgument, match="per_rank_dir='maybe' is not a boolean"):
        backend(tmp_path / "kv", per_rank_dir="maybe")
    with pytest.raises(InvalidArgument, match="flush_interval"):
        backend(tmp_path / "kv", flush_interval_s=-1)
    with pytest.raises(InvalidArgument, match="flush_interval_s='x' is no number"):
        backend(tmp_path / "kv", flush_interval_s="x")
    b = backend(tmp_path / "kv")
    with pytest.raises(InvalidArgument, match="one target_location per key"):
        b.batch_get(["a", "b"], [torch.empty(4)])
    with pytest.raises(InvalidArgument, match="non-empty str"):
        b.exists(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="before register_mem_pool_host"):
        b.batch_set_v1(["a"], torch.arange(16))
    b.close()


def test_capacity_beyond_the_free_space_is_refused(
    tmp_path: Path, records: list[logging.LogRecord]
) -> None:
    from chm.kv.capacity import free_bytes

    huge = f"{(free_bytes(tmp_path) >> 30) + 1024}G"
    with pytest.raises(NoSpace, match=r"bytes\) free"):
        backend(tmp_path / "kv", capacity=huge)
    assert any(r.getMessage().startswith("chm: tier not in use") for r in records)
    backend(tmp_path / "kv", capacity=huge, sparse_overcommit=True).close()


_SET_THEN_DIE = """
import os, sys, time, torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
extra = {"backend_name": "chm", "module_path": "chm.integrations.sglang",
         "class_name": "ChmHiCacheStorage", "capacity": "64M", "dram": "2M", "wbuf": "1M",
         "slot_size": "64K", "path": sys.argv[1], "flush_interval_s": 0.2}
cfg = HiCacheStorageConfig(
    tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
    is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
    model_name="test/qwen", extra_config=extra)
b = StorageBackendFactory.create_backend("dynamic", cfg, None)
pages = [torch.full((32768,), i + 1, dtype=torch.bfloat16) for i in range(6)]
assert b.batch_set([f"{i:064x}" for i in range(6)], pages)
print("set", flush=True)
time.sleep(float(sys.argv[2]))
os.kill(os.getpid(), 9)
"""


def test_set_pages_are_durable_within_the_flush_interval(tmp_path: Path) -> None:
    """batch_set returns, nobody flushes (HiCache has no such call), the
    process is killed -9 a second later: a restarted backend finds every page."""
    p = subprocess.run(
        [sys.executable, "-c", _SET_THEN_DIE, str(tmp_path / "kv"), "1.0"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert p.returncode == -9 and p.stdout.strip() == "set", p.stderr[-2000:]
    b = backend(tmp_path / "kv")
    keys = [f"{i:064x}" for i in range(6)]
    assert b.stats()["recovered_entries"] == 6 and b.batch_exists(keys) == 6
    outs = [torch.empty(32768, dtype=torch.bfloat16) for _ in keys]
    assert all(g is not None for g in b.batch_get(keys, outs))
    assert all(bool((o == i + 1).all()) for i, o in enumerate(outs))
    b.close()


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_zero_copy_interface_v1_on_the_real_host_pool(tmp_path: Path, layout: str) -> None:
    b = backend(tmp_path / "kv", interface_v1=1)
    pool = host_pool(layout)
    b.register_mem_pool_host(pool)
    assert b._parts["kv"] == (2 if layout == "page_first" else 2 * 4)  # K, V (per layer)
    fill(pool, 3)
    ps = pool.page_size
    want = [page_bytes(pool, p * ps) for p in range(4)]
    keys = [f"{i:064x}" for i in range(4)]
    assert b.batch_set_v1(keys, torch.arange(4 * ps)) == [True] * 4
    assert b.batch_exists([*keys, "absent"]) == 4 and b.exists(keys[2])
    pool.kv_buffer.zero_()
    # load them into pages 4..7 of the pool, in place
    dst = torch.arange(4 * ps, 8 * ps)
    assert b.batch_get_v1([*keys[:3], "absent"], dst) == [True, True, True, False]
    for i in range(3):
        got = page_bytes(pool, (4 + i) * ps)
        assert all(torch.equal(a, w) for a, w in zip(got, want[i], strict=True))
    assert not any(t.any() for t in page_bytes(pool, 7 * ps))
    assert not any(t.any() for t in page_bytes(pool, 0))
    with pytest.raises(InvalidArgument, match="host indices for 2 pages"):
        b.batch_get_v1(keys[:2], torch.arange(ps))
    b.close()


def test_another_model_dtype_or_page_size_misses(tmp_path: Path) -> None:
    b = backend(tmp_path / "kv", interface_v1=1)
    pool = host_pool()
    b.register_mem_pool_host(pool)
    fill(pool, 4)
    keys = [f"{i:064x}" for i in range(4)]
    assert b.batch_set_v1(keys, torch.arange(4 * pool.page_size)) == [True] * 4
    b.close()
    for kw, pool_kw in (
        ({"model": "test/other"}, {}),
        ({"tp_size": 2}, {}),
        ({}, {"dtype": torch.float16}),
        ({}, {"page": 32}),
        ({}, {"heads": 1, "head_dim": 128}),
    ):
        b2 = backend(tmp_path / "kv", interface_v1=1, **kw)
        b2.register_mem_pool_host(host_pool(**pool_kw))
        assert b2.batch_exists(keys) == 0, (kw, pool_kw)
        b2.close()
    b3 = backend(tmp_path / "kv", interface_v1=1)
    b3.register_mem_pool_host(host_pool())
    assert b3.batch_exists(keys) == 4
    b3.close()


def test_hybrid_v2_calls_with_a_swa_sidecar_pool(tmp_path: Path) -> None:
    b = backend(tmp_path / "kv", interface_v1=1)
    kv, swa = host_pool(), host_pool(layers=2)
    b.register_mem_pool_host(kv)
    b.register_mem_host_pool_v2(swa, PoolName.SWA)
    b.on_host_pools_registered()
    fill(kv, 5)
    fill(swa, 6)
    ps = kv.page_size
    keys = [f"{i:064x}" for i in range(6)]
    want_kv = [page_bytes(kv, p * ps) for p in range(6)]
    want_swa = [page_bytes(swa, p * ps) for p in range(4, 6)]
    # SGLang stores the KV of all pages, the SWA window only for the last two
    got = b.batch_set_v2([
        PoolTransfer(name=PoolName.KV, host_indices=torch.arange(6 * ps), keys=keys),
        PoolTransfer(name=PoolName.SWA, host_indices=torch.arange(4 * ps, 6 * ps),
                     keys=keys[4:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
    ])  # fmt: skip
    assert got == {"kv": [True] * 6, "swa": [True] * 2}
    win = [PoolTransfer(name=PoolName.SWA, keys=keys[4:], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    r = b.batch_exists_v2(keys, win)
    assert r.kv_hit_pages == 6 and r.restorable_prefix_pages == [6]
    assert r.extra_pool_hit_pages == {"kv": 6, "swa": 6}
    # without the SWA window of page 5, only stop points whose window is complete remain
    b.store.remove([b._digest("swa", keys[5], j) for j in range(b._parts["swa"])])
    r2 = b.batch_exists_v2(keys, win)
    assert r2.kv_hit_pages == 0 and r2.restorable_prefix_pages == []
    # ALL_PAGES: a sidecar missing on page 0 leaves nothing
    r3 = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, keys=keys)])
    assert r3.kv_hit_pages == 0
    with pytest.raises(InvalidArgument, match="'mamba' used before it was registered"):
        b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.MAMBA, keys=keys)])
    # load into other pages of both pools, in place
    kv.kv_buffer.zero_()
    swa.kv_buffer.zero_()
    got = b.batch_get_v2([
        PoolTransfer(name=PoolName.KV, host_indices=torch.arange(8 * ps, 14 * ps), keys=keys),
        PoolTransfer(name=PoolName.SWA, host_indices=torch.arange(8 * ps, 10 * ps),
                     keys=keys[4:]),
    ])  # fmt: skip
    assert got == {"kv": [True] * 6, "swa": [True, False]}
    for i in range(6):
        assert all(
            torch.equal(a, w) for a, w in zip(page_bytes(kv, (8 + i) * ps), want_kv[i], strict=True)
        )
    assert all(torch.equal(a, w) for a, w in zip(page_bytes(swa, 8 * ps), want_swa[0], strict=True))
    b.close()


def test_two_ranks_on_one_path_the_second_fails_loudly(
    tmp_path: Path, records: list[logging.LogRecord]
) -> None:
    b0 = backend(tmp_path / "kv", tp_rank=0, tp_size=2)
    try:
        with pytest.raises(Busy):
            backend(tmp_path / "kv", tp_rank=1, tp_size=2)
        msgs = [r.getMessage() for r in records if r.levelno == logging.ERROR]
        assert any(m.startswith("chm: tier not in use") and "socket" in m for m in msgs), msgs
    finally:
        b0.close()
    ranks = [backend(tmp_path / "kv", tp_rank=r, tp_size=2, per_rank_dir=True) for r in (0, 1)]
    for r, b in enumerate(ranks):
        assert b.tier.where == str(tmp_path / "kv" / f"rank{r}")
        assert b.batch_set([f"{r:064x}"], pages(1, r))
    for b in ranks:
        b.close()


def test_two_ranks_share_one_daemon(tmp_path: Path) -> None:
    from chm.testing.daemon_proc import DaemonProcess

    sock = tmp_path / "chm.sock"
    toml = tmp_path / "chm-emu.toml"
    toml.write_text(
        f'[device]\ntargets = ["{tmp_path / "served.img"}"]\ncreate = true\n'
        'capacity = "256M"\ndram = "4M"\nwbuf = "1M"\nslot_size = "64K"\n'
    )
    with DaemonProcess(["--config", str(toml)], sock):
        kw: dict[str, Any] = {"socket": str(sock), **DEVICE_OWN}
        ranks = [backend(None, tp_rank=r, tp_size=2, interface_v1=1, **kw) for r in (0, 1)]
        pools = [host_pool(), host_pool()]
        keys = [f"{i:064x}" for i in range(20)]  # the same page hashes on both ranks
        for r, (b, pool) in enumerate(zip(ranks, pools, strict=True)):
            assert b.tier.remote
            store = b.store
            b.register_mem_pool_host(pool)
            assert b.store is store  # the daemon's write buffer is its own: no reopen
            fill(pool, 10 + r)
            assert b.batch_set_v1(keys, torch.arange(20 * pool.page_size)) == [True] * 20
        for r, (b, pool) in enumerate(zip(ranks, pools, strict=True)):
            want = [page_bytes(pool, p * pool.page_size) for p in range(20)]
            pool.kv_buffer.zero_()
            assert b.batch_get_v1(keys, torch.arange(20 * pool.page_size)) == [True] * 20
            for p in range(20):
                got = page_bytes(pool, p * pool.page_size)
                assert all(torch.equal(a, w) for a, w in zip(got, want[p], strict=True)), (r, p)
        st = ranks[0].stats()
        assert st["entries"] == 2 * 20 * 2 and st["staging_skipped"] == 0, st  # one index
        for b in ranks:
            b.close()


def test_two_workers_share_one_tier_on_a_remote_node(tmp_path: Path) -> None:
    """Two SGLang workers (two replicas of one model and rank) on a real
    redis-server and node process: pages one sets through the zero-copy
    calls the other gets, byte-exact, out of the node."""
    import importlib.util

    from chm.testing.redisd import RedisServer, redis_server_path
    from chm.testing.remote import NodeProcess, write_secret

    if redis_server_path() is None or importlib.util.find_spec("mooncake") is None:
        pytest.skip("redis-server or the 'remote' extra (mooncake) is not installed")
    write_secret(tmp_path / "secret")
    opts = ["--capacity", "64M", "--dram", "24M", "--wbuf", "8M", "--slot-size", "1M"]
    with (
        RedisServer() as srv,
        NodeProcess(srv.url, "node-a", tmp_path / "node-a", tmp_path / "secret", options=opts),
    ):
        kw: dict[str, Any] = {
            "master": srv.url,
            "secret_file": str(tmp_path / "secret"),
            "host": "127.0.0.1",
            **DEVICE_OWN,
        }
        workers = [backend(None, interface_v1=1, **kw) for _ in range(2)]
        pools = [host_pool(), host_pool()]
        for b, pool in zip(workers, pools, strict=True):
            assert b.tier.nodes
            b.register_mem_pool_host(pool)
        keys = [f"{i:064x}" for i in range(20)]
        fill(pools[0], 21)
        want = [page_bytes(pools[0], p * pools[0].page_size) for p in range(20)]
        idx = torch.arange(20 * pools[0].page_size)
        assert workers[0].batch_set_v1(keys, idx) == [True] * 20
        assert workers[1].batch_exists(keys) == 20
        assert workers[1].batch_get_v1(keys, idx) == [True] * 20
        for p in range(20):
            got = page_bytes(pools[1], p * pools[1].page_size)
            assert all(torch.equal(a, w) for a, w in zip(got, want[p], strict=True)), p
        st = workers[1].stats()
        assert st["remote_loaded"] >= 20 and st["remote_bad_checksums"] == 0, st
        for b in workers:
            b.close()


@pytest.mark.parametrize("interface_v1", [1, 0])
def test_write_buffer_sized_from_the_registered_host_pool(
    tmp_path: Path, interface_v1: int
) -> None:
    """SGLang's dynamic factory passes no page size to the constructor: the
    embedded store opens with the device's default write buffer and is
    reopened with one sized for ``batch`` pages when SGLang registers its
    host pool; a backup call of ``batch`` pages then fits it whole (the
    write buffer refuses none of its blocks), and a block stored before the
    reopen is still found byte-exact."""
    batch = 40  # pages of 1 MiB: more than the device's default write buffer
    b = backend(
        tmp_path / "kv", wbuf=None, dram="96M", capacity="256M", slot_size="1M",
        batch=batch, interface_v1=interface_v1,
    )  # fmt: skip
    pool = host_pool(page=64, heads=8, head_dim=128, tokens=batch * 64)
    ps = pool.page_size
    _, sizes = pool.get_page_buffer_meta(torch.arange(ps))
    page = sum(int(n) for n in sizes)
    before = b.store.device.config.wbuf_bytes
    assert before < batch * page
    early = pages(1, 9)[0].view(-1).view(torch.uint8)[:page].clone()
    assert b.batch_set(["e0"], [early])  # stored before the pool is known
    d0 = b._digest("kv", "e0")  # (its key: registering the pool changes the namespace)
    b.register_mem_pool_host(pool)
    assert b.store.device.config.wbuf_bytes >= batch * page
    fill(pool, 5)
    keys = [f"{i:064x}" for i in range(batch)]
    if interface_v1:
        assert b.batch_set_v1(keys, torch.arange(batch * ps)) == [True] * batch
    else:
        flat = [pool.get_data_page(p * ps, flat=True) for p in range(batch)]
        assert b.batch_set(keys, flat)
    st = b.stats()
    assert st["puts_skipped"] == 0 and st["staging_retries"] == 0, st
    assert st["staging_skipped"] == 0
    back = torch.zeros_like(early)
    assert b.store.get([d0], [back]) == [True] and torch.equal(back, early)
    assert b.batch_exists(keys) == batch
    b.close()


def test_an_explicit_write_buffer_is_not_resized(tmp_path: Path) -> None:
    """An explicit ``wbuf`` is kept when the host pool is registered."""
    b = backend(tmp_path / "kv", dram="16M", interface_v1=1)  # EXTRA's wbuf: 1M
    store = b.store
    b.register_mem_pool_host(host_pool(tokens=64 * 16))
    assert b.store is store and store.device.config.wbuf_bytes == 1 << 20
    b.close()
