"""SGLang HiCache storage with chm, loaded as SGLang loads ``--hicache-storage-backend
dynamic``: through ``StorageBackendFactory.create_backend`` with the extra config.

SGLang itself cannot run on a CPU-only machine (its package requires CUDA
kernels and torch 2.14.1), so on one ``make integrations EXTRAS=sglang``
installs the sglang package without its dependencies; its HiCache base
class and backend factory import with two small pure-Python packages. The
test then drives the backend through SGLang's interface (set, batch_set,
get, batch_get, exists, batch_exists) with page tensors as SGLang's host
pool hands them out, byte-exact, with prefix semantics and across a
restart. Skipped when sglang is not installed; CHM_REQUIRE_SGLANG=1 fails.
"""

from __future__ import annotations

import os
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
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from chm.errors import InvalidArgument
from chm.integrations.sglang import ChmHiCacheStorage

PAGE = 64 * 1024  # bytes per page (64 tokens x 1 KiB)
EXTRA = {"backend_name": "chm", "module_path": "chm.integrations.sglang",
         "class_name": "ChmHiCacheStorage", "capacity": "64M", "dram": "2M", "wbuf": "1M",
         "slot_size": "64K"}  # fmt: skip


def config(path: Path, **extra: Any) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="test/qwen", extra_config={**EXTRA, "path": str(path), **extra},
    )  # fmt: skip


def backend(path: Path, **extra: Any) -> ChmHiCacheStorage:
    b = StorageBackendFactory.create_backend("dynamic", config(path, **extra), None)
    assert isinstance(b, ChmHiCacheStorage)
    return b


def pages(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(-128, 127, (PAGE // 2,), generator=g).to(torch.bfloat16) for _ in range(n)
    ]


def test_pages_round_trip_through_sglang_interface(tmp_path: Path) -> None:
    b = backend(tmp_path / "kv")
    keys = [f"{i:064x}" for i in range(12)]  # 12 pages (768 KiB) > the 512 KiB staging DRAM
    data = pages(12, 1)
    assert b.batch_exists(keys) == 0 and not b.exists(keys[0])
    assert b.set(keys[0], data[0])
    assert b.batch_set(keys[1:6], data[1:6])
    b.store.flush()  # drains the 1 MiB write buffer before the next batch
    assert b.batch_set(keys[6:], data[6:])
    assert b.batch_exists(keys) == 12 and b.exists(keys[11])
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

    b2 = backend(tmp_path / "kv")  # restart: every flushed page is found
    assert b2.store.stats().recovered_entries == 12
    outs2 = [torch.empty_like(d) for d in data]
    assert all(g is not None for g in b2.batch_get(keys, outs2))
    assert all(torch.equal(o, d) for o, d in zip(outs2, data, strict=True))
    b2.close()


def test_bad_configuration_and_calls_are_refused(tmp_path: Path) -> None:
    cfg = config(tmp_path / "kv")
    del cfg.extra_config["path"]
    with pytest.raises(InvalidArgument, match="'path'"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)
    with pytest.raises(InvalidArgument, match="unknown extra-config"):
        backend(tmp_path / "kv", capcity="1G")
    b = backend(tmp_path / "kv")
    with pytest.raises(InvalidArgument, match="one target_location per key"):
        b.batch_get(["a", "b"], [torch.empty(4)])
    with pytest.raises(InvalidArgument, match="non-empty str"):
        b.exists(b"bytes")  # type: ignore[arg-type]
    b.close()


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
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-c", _SET_THEN_DIE, str(tmp_path / "kv"), "1.0"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert p.returncode == -9 and p.stdout.strip() == "set", p.stderr[-2000:]
    b = backend(tmp_path / "kv")
    keys = [f"{i:064x}" for i in range(6)]
    assert b.store.stats().recovered_entries == 6 and b.batch_exists(keys) == 6
    outs = [torch.empty(32768, dtype=torch.bfloat16) for _ in keys]
    assert all(g is not None for g in b.batch_get(keys, outs))
    assert all(bool((o == i + 1).all()) for i, o in enumerate(outs))
    b.close()


def test_bad_flush_interval_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="flush_interval"):
        backend(tmp_path / "kv", flush_interval_s=-1)
    with pytest.raises(InvalidArgument, match="flush_interval_s='x' is no number"):
        backend(tmp_path / "kv", flush_interval_s="x")


class FakeMHAHostPool:
    """A fake of SGLang's ``MHATokenToKVPoolHost`` in the ``page_first``
    layout: SGLang's real host pools cannot be imported on this machine (the
    package is installed without its engine dependencies, torchvision and
    CUDA kernels among them), so this stands in for the two members the
    zero-copy interface uses, ``page_size`` and ``get_page_buffer_meta``,
    computed as the real one computes them (K and V of a page, each
    ``layers x page_size x heads x head_dim`` elements, V after all of K)."""

    layout = "page_first"

    def __init__(self, pages: int, page_size: int = 16, layers: int = 4, hd: int = 256) -> None:
        self.page_size, self.size, self.layers, self.hd = page_size, pages * page_size, layers, hd
        self.kv_buffer = torch.zeros((2, self.size, layers, hd), dtype=torch.bfloat16)

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        assert len(indices) % self.page_size == 0
        item = self.kv_buffer.element_size()
        v_offset = self.size * self.layers * self.hd * item
        ptrs = []
        for i in range(0, len(indices), self.page_size):
            k = self.kv_buffer.data_ptr() + int(indices[i]) * self.layers * self.hd * item
            ptrs += [k, k + v_offset]
        n = self.layers * self.page_size * self.hd * item
        return ptrs, [n] * len(ptrs)

    def page(self, p: int) -> torch.Tensor:
        s = slice(p * self.page_size, (p + 1) * self.page_size)
        return self.kv_buffer[:, s].clone()


def test_zero_copy_interface_v1(tmp_path: Path) -> None:
    b = backend(tmp_path / "kv", interface_v1=1)
    pool = FakeMHAHostPool(pages=8)
    b.register_mem_pool_host(pool)
    assert b._parts == 2  # K and V of each page
    g = torch.Generator().manual_seed(3)
    pool.kv_buffer.view(torch.int16).random_(-32768, 32767, generator=g)
    want = [pool.page(p) for p in range(8)]
    keys = [f"{i:064x}" for i in range(4)]
    idx = torch.arange(4 * pool.page_size)  # pages 0..3
    assert b.batch_set_v1(keys, idx) == [True] * 4
    b.store.flush()
    assert b.batch_exists([*keys, "absent"]) == 4 and b.exists(keys[2])
    pool.kv_buffer.zero_()
    # load them into pages 4..7 of the pool, in place
    dst = torch.arange(4 * pool.page_size, 8 * pool.page_size)
    assert b.batch_get_v1([*keys[:3], "absent"], dst) == [True, True, True, False]
    for i in range(3):
        assert torch.equal(pool.page(4 + i).view(torch.int16), want[i].view(torch.int16))
    assert not pool.page(7).any() and not pool.page(0).any()
    with pytest.raises(InvalidArgument, match="host indices for 2 pages"):
        b.batch_get_v1(keys[:2], torch.arange(pool.page_size))
    b.close()


def test_zero_copy_before_registration_is_refused(tmp_path: Path) -> None:
    b = backend(tmp_path / "kv", interface_v1=1)
    with pytest.raises(InvalidArgument, match="before register_mem_pool_host"):
        b.batch_set_v1(["a"], torch.arange(16))
    b.close()
