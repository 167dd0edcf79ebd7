"""The host staging queue: an engine's asynchronous stores, fed to the device's
write buffer as its flusher frees space.

    q = StagingQueue(store, capacity="1G")
    t = q.submit(keys, srcs)          # returns at once; never blocks the engine
    ...
    statuses = t.wait()               # per key: STORED, EXISTS, SKIPPED or ERROR
    q.close()

The device's write buffer is small (a share of its DRAM); an engine stores in
bursts (LMCache: every chunk of a request in one call). :meth:`Store.put`
never blocks, so a burst larger than the free part of the write buffer has
its tail SKIPPED. This queue sits in between (DESIGN.md's host staging
buffer): each submitted call is queued whole, and one worker thread offers
its blocks to the store in order, offering a block the store skipped again
as the flusher drains the write buffer (for up to ``max_wait_s``). A block
is skipped only when

- the queue is full: a call is admitted up to the longest prefix of its
  blocks that fits the queue's ``capacity`` (bytes of blocks not yet
  written); the rest is SKIPPED at once, so the caller never waits; or
- the store still refused it ``max_wait_s`` after it reached the head of
  the queue (the write buffer did not drain: a device far slower than the
  engine, or every segment pinned).

Both are counted (:meth:`stats`: ``skipped_full`` and ``skipped_timeout``)
and logged at WARNING, at most once every ``warn_every_s`` seconds with the
count since the last line. A block larger than ``capacity`` is refused with
InvalidArgument when submitted (the queue could never hold it).

By default the queue keeps references to the callers' sources (``copy=False``):
they must stay unchanged until the ticket is done (LMCache lends its memory
objects for that long). ``copy=True`` copies each block into memory the queue
owns (bounded by ``capacity``), so the caller may reuse its buffers as soon as
:meth:`submit` returns.

The ticket is a :class:`chm.kv.Ticket` (``done``, ``wait``, ``fileno`` for an
event loop). :meth:`put` is submit and wait, for callers that may block
(SGLang's backup thread). Works over anything with ``put(keys, srcs, meta)``
giving :class:`PutStatus` per key: a :class:`Store` or the daemon's
``RemoteStore``.

``flush_interval`` (seconds) runs a flusher thread that calls the store's
``flush()`` that often while anything was stored since the last one, for
stores without a periodic flusher of their own (the daemon's store, through
``chm.connect``); for a local :class:`Store` pass ``flush_interval`` to the
store instead.

``report`` is called with a :class:`StagingStats` from a thread of the
queue's own whenever the counters changed: at most every ``report_every_s``
seconds, and soon (at most five times a second) after a skip; once more at
:meth:`close`. The adapters pass the daemon store's ``report_staging``, so
a daemon's stats and metrics count the skips of every client's queue (the
skips happen here, in the engine's process, where the daemon cannot see
them). A report that fails is logged at DEBUG and tried again next time;
it never touches the puts.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from chm.errors import Cancelled, ChmError, InvalidArgument
from chm.kv.buffers import as_src
from chm.kv.store import PutStatus, check_meta
from chm.kv.tickets import Ticket
from chm.sizes import parse_size

__all__ = ["DEFAULT_STAGING", "PutTarget", "StagingQueue", "StagingStats"]

DEFAULT_STAGING = 1 << 30  # bytes: the default bound of a queue
_log = logging.getLogger("chm.kv.staging")


class PutTarget(Protocol):
    """What the queue writes to: ``Store`` or ``chm.remote.RemoteStore``."""

    def put(
        self, keys: Any, srcs: Sequence[Any], meta: Sequence[bytes | None] | None = None
    ) -> list[PutStatus]: ...

    def flush(self, timeout: float | None = None) -> None: ...


@dataclass(frozen=True)
class StagingStats:
    """A snapshot of a staging queue's counters."""

    capacity_bytes: int
    queued_bytes: int  # blocks submitted and not yet written (or given up)
    queued_calls: int
    peak_queued_bytes: int
    submitted_blocks: int
    stored_blocks: int
    exists_blocks: int
    error_blocks: int
    skipped_full: int  # blocks skipped because the queue was full
    skipped_timeout: int  # blocks the store still refused after max_wait_s
    retries: int  # offers of a block the store had skipped before
    flushes: int
    flush_errors: int

    @property
    def skipped(self) -> int:
        return self.skipped_full + self.skipped_timeout

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["skipped"] = self.skipped
        return d


class _Job:
    __slots__ = ("keys", "left", "metas", "nbytes", "out", "srcs", "ticket")

    def __init__(
        self,
        keys: list[Any],
        srcs: list[Any],
        metas: list[bytes],
        out: list[PutStatus],
        ticket: Ticket,
    ) -> None:
        self.keys, self.srcs, self.metas, self.out, self.ticket = keys, srcs, metas, out, ticket
        self.nbytes = [int(s.size) for s in srcs]
        self.left = sum(self.nbytes)  # bytes still counted in the queue


class StagingQueue:
    """A bounded queue of asynchronous puts in front of a store (see the module doc)."""

    def __init__(
        self,
        store: PutTarget,
        capacity: int | str = DEFAULT_STAGING,
        *,
        max_wait_s: float = 30.0,
        flush_interval: float | None = None,
        warn_every_s: float = 10.0,
        name: str = "chm",
        logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        report: Callable[[StagingStats], object] | None = None,
        report_every_s: float = 1.0,
    ) -> None:
        cap = parse_size(capacity) if isinstance(capacity, str) else capacity
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            raise InvalidArgument(None, f"staging: capacity={capacity!r}: expected bytes > 0")
        max_block = getattr(store, "max_block", None)
        if max_block is not None and cap < int(max_block):
            raise InvalidArgument(
                None,
                f"staging: capacity {cap} bytes is smaller than one block of the store "
                f"({int(max_block)} bytes): raise it",
            )
        if not max_wait_s > 0:
            raise InvalidArgument(None, f"staging: max_wait_s={max_wait_s!r}: expected > 0")
        if not 0 < report_every_s < 1e6:
            raise InvalidArgument(
                None, f"staging: report_every_s={report_every_s!r}: expected seconds > 0"
            )
        if flush_interval is not None and not 0 < flush_interval < 1e6:
            raise InvalidArgument(
                None, f"staging: flush_interval={flush_interval!r}: expected seconds > 0"
            )
        self.store = store
        self.capacity = cap
        self.max_wait_s = float(max_wait_s)
        self.name = name
        self._log = logger if logger is not None else _log
        self._warn_every = float(warn_every_s)
        self._last_warn = -1e18
        self._unwarned = 0
        self._cv = threading.Condition()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._queued = 0
        self._peak = 0
        self._closing = False
        self._dirty = False  # stored since the last flush
        self._abort = False  # close() gave up waiting: skip what is left
        self._c = dict.fromkeys(
            (
                "submitted_blocks",
                "stored_blocks",
                "exists_blocks",
                "error_blocks",
                "skipped_full",
                "skipped_timeout",
                "retries",
                "flushes",
                "flush_errors",
            ),
            0,
        )
        self._worker = threading.Thread(target=self._run, name=f"{name}-staging", daemon=True)
        self._worker.start()
        self._flusher: threading.Thread | None = None
        if flush_interval is not None:
            self._flusher = threading.Thread(
                target=self._autoflush,
                args=(float(flush_interval),),
                name=f"{name}-staging-flush",
                daemon=True,
            )
            self._flusher.start()
        self._report = report
        self._report_now = False  # a skip: report soon
        self._reported: StagingStats | None = None
        self._reporter: threading.Thread | None = None
        if report is not None:
            self._reporter = threading.Thread(
                target=self._reports,
                args=(float(report_every_s),),
                name=f"{name}-staging-report",
                daemon=True,
            )
            self._reporter.start()

    # ---- submitting

    def submit(
        self,
        keys: Sequence[Any],
        srcs: Sequence[Any],
        meta: Sequence[bytes | None] | None = None,
        *,
        copy: bool = False,
    ) -> Ticket:
        """Queues one call's blocks; returns at once with a ticket whose result
        is a :class:`PutStatus` per key. The blocks that do not fit the queue
        (a suffix of the call) are SKIPPED at once. InvalidArgument (nothing
        queued) for mismatched lengths, an empty source or one larger than
        the queue; Cancelled after :meth:`close` began."""
        keys = list(keys)
        if len(srcs) != len(keys):
            raise InvalidArgument(None, f"staging: {len(keys)} keys but {len(srcs)} sources")
        metas = check_meta(meta, len(keys))
        bufs = []
        for j, s in enumerate(srcs):
            b = as_src(s, f"source {j}")
            if b.size == 0 or b.size > self.capacity:
                raise InvalidArgument(
                    None,
                    f"staging: source {j} has {b.size} bytes; a block has 1..{self.capacity} "
                    "bytes (the staging capacity)",
                )
            bufs.append(b)
        ticket = Ticket(f"{self.name}.staging")
        out = [PutStatus.SKIPPED] * len(keys)
        with self._cv:
            if self._closing:
                raise Cancelled(None, "staging: the queue is closing", call="submit")
            room = self.capacity - self._queued
            n = 0
            while n < len(bufs) and bufs[n].size <= room:
                room -= int(bufs[n].size)
                n += 1
            self._c["submitted_blocks"] += len(keys)
            full = len(keys) - n
            if full:
                self._c["skipped_full"] += full
                self._report_now = True
                self._cv.notify_all()
        if full:
            self._warn(full, "the staging queue is full")
        if n == 0:
            ticket._finish(out)
            return ticket
        if copy:
            bufs = [np.array(b, dtype=np.uint8, copy=True) for b in bufs[:n]]
        job = _Job(keys[:n], bufs[:n], metas[:n], out, ticket)
        with self._cv:
            self._jobs.append(job)
            self._queued += sum(job.nbytes)
            self._peak = max(self._peak, self._queued)
            self._cv.notify_all()
        return ticket

    def put(
        self,
        keys: Sequence[Any],
        srcs: Sequence[Any],
        meta: Sequence[bytes | None] | None = None,
    ) -> list[PutStatus]:
        """:meth:`submit` and wait for the result (at most about ``max_wait_s``
        per block the store keeps refusing)."""
        with self.submit(keys, srcs, meta) as t:
            result: list[PutStatus] = t.wait(None)
        return result

    # ---- the worker

    def _warn(self, n: int, why: str) -> None:
        now = time.monotonic()
        with self._cv:
            self._unwarned += n
            if now - self._last_warn < self._warn_every:
                return
            self._last_warn = now
            n, self._unwarned = self._unwarned, 0
            total = self._c["skipped_full"] + self._c["skipped_timeout"]
        self._log.warning(
            "%s: %d block(s) not stored (%s; %d skipped so far): the engine recomputes "
            "them; raise the staging capacity or the device's wbuf",
            self.name,
            n,
            why,
            total,
        )

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closing:
                    self._cv.wait()
                if not self._jobs:
                    return
                job = self._jobs[0]
            try:
                self._write(job)
            except BaseException as exc:  # a bad call fails its own ticket only
                with self._cv:
                    self._jobs.popleft()
                    self._queued -= job.left
                    job.left = 0
                    self._cv.notify_all()
                job.ticket._finish(exc=exc)
                continue
            with self._cv:
                self._jobs.popleft()
                self._queued -= job.left
                job.left = 0
                self._cv.notify_all()
            job.ticket._finish(job.out)

    def _release(self, job: _Job, nbytes: int) -> None:
        with self._cv:
            self._queued -= nbytes
            job.left -= nbytes
            self._cv.notify_all()

    def _write(self, job: _Job) -> None:
        todo = list(range(len(job.keys)))
        deadline: float | None = None
        pause = 0.0005
        first = True
        while todo:
            got = self.store.put(
                [job.keys[i] for i in todo],
                [job.srcs[i] for i in todo],
                [job.metas[i] or None for i in todo],
            )
            if not first:
                self._count("retries", len(todo))
            first = False
            again = []
            done_bytes = 0
            for i, s in zip(todo, got, strict=True):
                if s == PutStatus.SKIPPED:
                    again.append(i)
                    continue
                job.out[i] = PutStatus(s)
                done_bytes += job.nbytes[i]
                self._count(f"{PutStatus(s).name.lower()}_blocks")
                if s == PutStatus.STORED:
                    self._dirty = True
            if done_bytes:
                self._release(job, done_bytes)
                deadline = None  # progress: the wait starts again
                pause = 0.0005
            todo = again
            if not todo:
                break
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.max_wait_s
            elif now >= deadline:
                self._count("skipped_timeout", len(todo))
                self._release(job, sum(job.nbytes[i] for i in todo))
                self._warn(len(todo), f"the store refused them for {self.max_wait_s:g} s")
                return
            if self._abort:  # close() timed out: what is left is skipped
                self._count("skipped_timeout", len(todo))
                self._release(job, sum(job.nbytes[i] for i in todo))
                return
            # the write buffer drains at the device's write bandwidth: poll
            # often at first, then back off (at most 20 ms)
            time.sleep(min(pause, max(0.0, deadline - now)))
            pause = min(pause * 2, 0.02)

    def _count(self, name: str, n: int = 1) -> None:
        with self._cv:
            self._c[name] += n
            if name == "skipped_timeout":
                self._report_now = True
                self._cv.notify_all()

    # ---- reporting

    def _reports(self, every: float) -> None:
        soon = min(0.2, every)
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closing or self._report_now, timeout=every)
                if self._closing:
                    return
            self._send_report()
            if self._report_now:  # more skips while reporting: not more often than this
                with self._cv:
                    self._cv.wait_for(lambda: self._closing, timeout=soon)

    def _send_report(self) -> None:
        if self._report is None:
            return
        with self._cv:
            self._report_now = False
        st = self.stats()
        if st == self._reported:
            return
        try:
            self._report(st)
        except Exception as exc:  # the daemon is gone or busy: the puts go on
            self._log.debug("%s: staging report not sent: %s", self.name, exc)
            return
        self._reported = st

    # ---- flushing, draining, stats

    def _autoflush(self, interval: float) -> None:
        while True:
            with self._cv:
                if self._cv.wait_for(lambda: self._closing, timeout=interval):
                    return
                dirty, self._dirty = self._dirty, False
            if not dirty:
                continue
            try:
                self.store.flush(max(30.0, 10 * interval))
            except ChmError as exc:  # the blocks it covered are misses, never wrong
                self._count("flush_errors")
                self._log.warning("%s: periodic flush failed: %s", self.name, exc)
            self._count("flushes")

    def drain(self, timeout: float | None = None) -> bool:
        """Waits until every queued block is written or given up; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._jobs, timeout=timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Writes what is queued (for up to ``timeout`` seconds; the blocks
        left then are SKIPPED), then stops the threads. Idempotent. The store
        is not closed."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
        if not self.drain(timeout):
            self._abort = True
        self._worker.join()
        if self._flusher is not None:
            self._flusher.join()
        if self._reporter is not None:
            self._reporter.join()
            self._send_report()  # the final counters

    @property
    def closed(self) -> bool:
        return self._closing

    def stats(self) -> StagingStats:
        with self._cv:
            return StagingStats(
                capacity_bytes=self.capacity,
                queued_bytes=self._queued,
                queued_calls=len(self._jobs),
                peak_queued_bytes=self._peak,
                **self._c,
            )

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<chm.kv.StagingQueue {self.name} queued={s.queued_bytes}/{s.capacity_bytes} "
            f"skipped={s.skipped}>"
        )
