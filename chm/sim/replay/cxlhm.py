"""Replay of the two CXL-HM systems through a device: lru mode and prefetch mode.

``cxlhm-lru`` is the commercial device: a transparent LRU over its DRAM, and
the serving runtime reads each KV block with a plain load
(``read_into``). ``cxlhm-prefetch`` is HyMCache: the hits of a request are
prefetched in order through a :class:`~chm.kv.window.SlidingWindow` of
``w_max(block, hits)`` blocks (eq. 2), each waited on and released.

Both sit behind a GPU prefix cache per worker (G1, as the baselines) and keep
one shared tier on the device: a :class:`chm.kv.Store` (the KV layer a
serving engine uses: its index, allocator, prefix lookup, load path and
journal), with one block per segment, so that its eviction is exact block
LRU over ``tier_bytes // stride`` block places. Per request the G1 prefix is
found first, then the store's prefix from there on, and the tier hits are
loaded through the store, both in one pass over its index
(``Store.lookup_load``; in prefetch mode through its sliding window of
``w_max`` blocks of the model's size, in lru mode by direct reads through
the device's cache), timed on the device's clock
(``clock_ns()``, in real time too; wall time for a device without one), then
every block of the request is saved (``Store.put`` with ``touch``: a block
the store has counts as used, in key order, and one it lacks is written; a
full write buffer gives SKIPPED, and a skipped block is not indexed, so a
later turn misses it). On the ghost backend the puts carry no payload
(``Store.put_lengths``, the device's ``write_length``), so a write costs
the model's time and no host time or memory. The store's journal lives in a
temporary directory and goes with the replay (:meth:`CxlhmReplay.close`):
the tier starts empty on every replay.

In virtual time the device clock also moves by each request's modeled
prefill compute between its load and its writes (the new blocks exist only
once computed; the device is idle meanwhile and its write buffer drains).

Concurrent workers (virtual time, ``open_loop`` or ``closed_loop``). Each
worker -- a prefill instance, with its own G1 -- has its own timeline and
serves one request at a time; a request goes to worker ``session % workers``
(its conversation's G1 stays with it) and queues there in arrival order. The
replay is an event queue in simulated time over the one device clock
(``advance_clock``): events are a request's arrival, its start on a free
worker (lookup and load), and the end of its prefill compute (its saves).
Events run in timestamp order; each moves the device clock to its time
before issuing its device calls, so the loads and saves of different
workers interleave on the device in the order of their issue times, and a
worker computing leaves the device to the others. One device call (one
request's load, one request's saves) runs to its end on the clock before
the next event: a call issued while the clock is past its issue time (the
device still busy with an earlier call) starts when the clock is, and that
wait counts in the request's ``device_wait_s``. So the device serves the
calls one after another in issue order (a load issued during another
worker's saves waits for their end, though the link is full duplex: an
upper bound on that interference, visible in ``device_wait_s``); within a
call the timing model overlaps the blocks over the SSD's channels as it
always does. A request with nothing to load does not wait: its lookup is the
host's index. (The alternative, per-operation issue times in the C core,
would let calls overlap on the timing model's resources; the device clock
is one monotonic counter, so the event queue cannot rewind it.)

``open_loop``: requests arrive at their trace times (``arrival_s``) whatever
the service time; the trace's gaps are idle time in which the write buffer
drains. ``closed_loop``: each session's first turn arrives at its trace
time, each later turn ``think_s`` after its previous turn's first token.
Without either (the default) requests run back to back in trace order, one
at a time, as an offline LRU sees them. A request's ``queue_s`` is the time
from its arrival to its start on the worker, ``device_wait_s`` and
``save_wait_s`` the times its load and its saves waited for the device, and
``first_token_s`` = start + device wait + load + compute; its TTFT
(``ttft_s``) is ``first_token_s - arrival_s``. Times are model seconds:
the device clock runs in device time, ``1 / scale`` of it (see
``device_block_bytes``), and arrivals, think and compute times are divided
by the scale on the way to it.

Decode instances (``decode``, a :class:`~chm.sim.replay.decode.DecodeModel`
with ``workers > 0``; open or closed loop only) are timelines of the same
event queue: when a request's prefill ends its KV crosses the PD path (its
prefill worker's PD link, then the decode node's one NIC, FIFO; see
:mod:`chm.sim.replay.decode`), an event at its arrival queues it on its
decode worker (``session % decode workers``), and an event at the end of its
``tokens`` decode steps frees that worker for the next. The waits are the
request's ``pd_transfer_s`` (prefill end to KV on the decode node, the
link's queues included) and ``decode_queue_s`` (KV there to its decode
start); its first token is then the end of its first decode step:
``first_token_s`` = prefill end + ``pd_transfer_s`` + ``decode_queue_s`` +
``decode_step_s``, which the TTFT counts and a closed loop's next turn
follows. The saves to the tier still go at the prefill's end, over the
storage path. With no decode workers (the default) nothing of this runs.

``tier_bytes`` (0: the whole device) bounds the address range the tier
places blocks in, so one workload can be replayed unchanged on devices of
different sizes.

``pinned_prefix`` keeps the first that many blocks of every request's prefix
-- the shared system prompt, which opens every conversation -- in a host
buffer of the serving node once loaded (:class:`HostPrefixCache`): hits on
them cost neither the device nor the link. 0 (the paper's design) reloads
them from the device like any other block.

Blocks on the device may be smaller than the model's (``device_block_bytes``,
so a real-time run fits a small disk): the load time of the model's bytes is
then the measured time scaled by ``model block / device block``, which keeps
the measured bandwidth. TTFT = prefill compute of the uncached tokens + that
load time.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chm.kv.protocol import DeviceLike
from chm.kv.store import PutStatus, Store
from chm.kv.window import WINDOW_BYTES
from chm.sim.replay.decode import DecodeModel
from chm.sim.replay.lru import LruBlocks
from chm.sim.replay.prefill import PrefillModel
from chm.sim.replay.results import RequestResult
from chm.sim.workloads.records import Request

__all__ = [
    "CXLHM_SYSTEMS",
    "CxlhmReplay",
    "CxlhmRequest",
    "HostPrefixCache",
    "replay_cxlhm",
]

CXLHM_SYSTEMS = {"cxlhm-lru": "lru", "cxlhm-prefetch": "prefetch"}

_ALIGN = 4096


class HostPrefixCache:
    """The connector's host buffer holding the first ``blocks`` blocks of a prefix.

    A policy of the serving side, not the device: once a request has loaded
    (or found in G1) its first ``blocks`` prefix blocks, the buffer keeps
    them, keyed by block key, and later requests whose prefix starts with the
    same keys take them from host memory. With one shared system prompt this
    holds the prompt's blocks once for every conversation; ``blocks=0`` keeps
    nothing (the paper's design).
    """

    def __init__(self, blocks: int) -> None:
        self.blocks = blocks
        self._keys: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._keys)

    def held(self, keys: tuple[bytes, ...], start: int, run: int) -> int:
        """How many of ``keys[start:start+run]`` (tier hits) the buffer serves:
        the leading ones within the first ``blocks`` that it holds."""
        n = 0
        end = min(start + run, self.blocks)
        for i in range(start, end):
            if keys[i] not in self._keys:
                break
            n += 1
        return n

    def keep(self, loaded: tuple[bytes, ...]) -> None:
        """Keeps the first ``blocks`` of a prefix the request now has."""
        self._keys.update(loaded[: self.blocks])


@dataclass(frozen=True, slots=True)
class CxlhmRequest:
    """One request's result plus what the device did for it."""

    result: RequestResult
    device_load_bytes: int  # bytes loaded from the device (device-sized blocks)
    host_prefix_blocks: int  # tier hits served from the host prefix buffer instead
    device_load_s: float  # time of that load on the device's clock
    dram_bytes: int  # of them served from device DRAM
    ssd_bytes: int  # of them read from the SSD
    writes_offered: int
    writes_skipped: int
    clock_end_s: float  # device clock after the request
    queue_s: float = 0.0  # model s from arrival to the start on its worker
    device_wait_s: float = 0.0  # model s its load waited for the device
    save_wait_s: float = 0.0  # model s its saves waited for the device
    first_token_s: float = 0.0  # model s: start + device wait + load + compute (+ decode)
    decode_worker: int = -1  # its decode worker (-1: decode not modeled)
    pd_transfer_s: float = 0.0  # model s from prefill end to its KV on the decode node
    decode_queue_s: float = 0.0  # model s from there to its start on the decode worker
    decode_step_s: float = 0.0  # model s of one decode step (the first token's)
    decode_end_s: float = 0.0  # model s: the end of its last decode step

    @property
    def ttft_s(self) -> float:
        """Time to first token including the waits: queue + device wait + load +
        compute (+ PD transfer + decode queue + first decode step, when modeled)."""
        r = self.result
        return (
            self.queue_s
            + self.device_wait_s
            + r.load_s
            + r.compute_s
            + self.pd_transfer_s
            + self.decode_queue_s
            + self.decode_step_s
        )

    @property
    def load_bw_Bps(self) -> float:
        """Effective load bandwidth: device bytes / device load time (0 without a load)."""
        return self.device_load_bytes / self.device_load_s if self.device_load_s > 0 else 0.0

    def row(self) -> dict[str, Any]:
        d = self.result.row()
        d.update(
            device_load_bytes=self.device_load_bytes,
            host_prefix_blocks=self.host_prefix_blocks,
            device_load_s=self.device_load_s,
            load_bw_Bps=self.load_bw_Bps,
            dram_bytes=self.dram_bytes,
            ssd_bytes=self.ssd_bytes,
            writes_offered=self.writes_offered,
            writes_skipped=self.writes_skipped,
            clock_end_s=self.clock_end_s,
            queue_s=self.queue_s,
            device_wait_s=self.device_wait_s,
            save_wait_s=self.save_wait_s,
            first_token_s=self.first_token_s,
            ttft_queued_s=self.ttft_s,
        )
        if self.decode_worker >= 0:
            d.update(
                decode_worker=self.decode_worker,
                pd_transfer_s=self.pd_transfer_s,
                decode_queue_s=self.decode_queue_s,
                decode_step_s=self.decode_step_s,
                decode_end_s=self.decode_end_s,
            )
        return d


@dataclass(slots=True)
class _Started:
    """A request between its load and its saves (see :meth:`CxlhmReplay._begin`)."""

    r: Request
    worker: int
    arrival_s: float  # model s (re-timed in a closed loop)
    arrival_ns: int  # device ns
    start_ns: int  # device ns: free worker and arrival
    t0_s: float  # device clock at the load's start (s)
    t1_s: float  # and at its end
    p1: int
    p2: int
    n_load: int
    host: int
    dram_bytes: int
    ssd_bytes: int
    compute_s: float  # model s


class CxlhmReplay:
    """One CXL-HM system over an open device, fed one request at a time.

    ``system`` is ``"cxlhm-lru"`` (the device must be in lru mode) or
    ``"cxlhm-prefetch"`` (prefetch mode). ``device_block_bytes`` 0 stores
    blocks at the model's size. The tier's store opens with the first
    request; :meth:`close` (or the context manager, or :func:`replay_cxlhm`
    at its end) closes it, leaving the device open.
    """

    def __init__(
        self,
        dev: DeviceLike,
        system: str,
        prefill: PrefillModel,
        *,
        workers: int = 1,
        gpu_cache: bool = True,
        hbm_kv_bytes: int = 0,
        device_block_bytes: int = 0,
        window_bytes: int = WINDOW_BYTES,
        wait_timeout_s: float = 30.0,
        open_loop: bool = False,
        closed_loop: bool = False,
        pinned_prefix: int = 0,
        tier_bytes: int = 0,
        decode: DecodeModel | None = None,
    ) -> None:
        if system not in CXLHM_SYSTEMS:
            raise ValueError(
                f"unknown CXL-HM system {system!r} (known: {', '.join(CXLHM_SYSTEMS)})"
            )
        mode = CXLHM_SYSTEMS[system]
        if dev.config.mode != mode:
            raise ValueError(f"{system} needs a device in {mode} mode, not {dev.config.mode!r}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if device_block_bytes < 0 or device_block_bytes % 512:
            raise ValueError(
                f"device_block_bytes must be a multiple of 512, got {device_block_bytes}"
            )
        self.dev = dev
        self.system = system
        self.mode = mode
        self.prefill = prefill
        self.workers = workers
        self.gpu_cache = gpu_cache
        self.window_bytes = window_bytes
        self.wait_timeout_s = wait_timeout_s
        self.results: list[CxlhmRequest] = []
        self._hbm = hbm_kv_bytes or prefill.hbm_kv_bytes()
        self._dev_block = device_block_bytes
        self._virtual = dev.config["clock"] == "virtual"
        if (open_loop or closed_loop) and not self._virtual:
            raise ValueError(
                "open_loop and closed_loop need a device in virtual time (clock='virtual')"
            )
        if open_loop and closed_loop:
            raise ValueError("open_loop and closed_loop exclude each other")
        if pinned_prefix < 0:
            raise ValueError(f"pinned_prefix must be >= 0, got {pinned_prefix}")
        if tier_bytes < 0 or tier_bytes > int(dev.capacity):
            raise ValueError(
                f"tier_bytes must be in 0..{int(dev.capacity)} (the device), got {tier_bytes}"
            )
        self.tier_bytes = tier_bytes or int(dev.capacity)
        self.open_loop = open_loop
        self.closed_loop = closed_loop
        self.decode = decode if decode is not None and decode.workers > 0 else None
        if self.decode is not None and not (open_loop or closed_loop):
            raise ValueError("decode workers need open_loop or closed_loop (the event queue)")
        self.pinned = HostPrefixCache(pinned_prefix)
        self._moves_data = dev.config.backend != "ghost"
        # a chm.Device reads its clock without a stats snapshot; other devices
        # (the daemon's client) through stats
        self._clock_ns = getattr(dev, "clock_ns", None)
        self._advance = getattr(dev, "advance_clock", None) if self._virtual else None
        if (open_loop or closed_loop) and self._advance is None:
            raise ValueError("open_loop and closed_loop need a device whose clock advances")
        self._g1: list[LruBlocks] = []
        self._tier: Store | None = None
        self._closed = False
        self._block_bytes = 0
        self._payload: np.ndarray[Any, Any] | None = None
        self._dst: np.ndarray[Any, Any] | None = None

    # ---- clock

    def _now_s(self) -> float:
        # the device's own clock in real time too (the time the device
        # reports, which pacing follows)
        if self._clock_ns is not None:
            return float(self._clock_ns()) / 1e9
        if self._virtual:
            return self.dev.stats().clock_now_ns / 1e9
        return time.perf_counter()

    def _setup(self, r: Request) -> int:
        bb = self.prefill.model.block_bytes(r.block_tokens)
        if not self._block_bytes:
            self._block_bytes = bb
            db = self._dev_block or bb
            if db > bb:
                raise ValueError(
                    f"device_block_bytes {db} is larger than the model's block ({bb} bytes)"
                )
            if self.mode == "prefetch" and db > self.dev.slot_bytes:
                raise ValueError(
                    f"a {db}-byte block does not fit the device's {self.dev.slot_bytes}-byte slots"
                )
            self._dev_block = db
            self._tier = self._open_store(db, bb)
            if self.gpu_cache:
                self._g1 = [LruBlocks(self._hbm // bb) for _ in range(self.workers)]
            self._payload = np.zeros(db, dtype=np.uint8)
            self._dst = np.empty(db, dtype=np.uint8)
        elif bb != self._block_bytes:
            raise ValueError(
                f"request {r.index} has {r.block_tokens}-token blocks; earlier requests "
                "had another block size (one replay, one block size)"
            )
        return bb

    def _open_store(self, db: int, bb: int) -> Store:
        """The tier: a store over the first ``tier_bytes`` of the device, one
        ``db``-byte block per segment, its journal in a temporary directory."""
        stride = -(-db // _ALIGN) * _ALIGN
        if self.tier_bytes // stride < 2:
            raise ValueError(
                f"tier_bytes {self.tier_bytes} holds fewer than 2 blocks of {stride} bytes"
            )
        tmp = tempfile.TemporaryDirectory(prefix="chm-replay-tier-")
        try:
            store = Store(
                self.dev,
                journal=Path(tmp.name) / "tier.kvjournal",
                segment_bytes=stride,
                block_bytes=db,
                capacity=self.tier_bytes,
                # eq. 2 counts the model's blocks: the same window of
                # smaller device blocks (window_bytes // bb of them)
                window_bytes=self.window_bytes // bb * db,
                residency=None,
            )
        except BaseException:
            tmp.cleanup()
            raise
        # a replay dropped unclosed still gives its journal's files back
        self._finalizer = weakref.finalize(self, _close_tier, store, tmp)
        return store

    def close(self) -> None:
        """Closes the tier's store (no flush: its contents go with the replay). Idempotent."""
        self._closed = True
        if self._tier is not None:
            self._finalizer()

    def __enter__(self) -> CxlhmReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def scale(self) -> float:
        """Model block bytes per device block byte (1 at full scale)."""
        return self._block_bytes / self._dev_block if self._dev_block else 1.0

    # ---- loads

    def _lookup_load(self, keys: np.ndarray[Any, Any], skip: int, r: Request) -> tuple[int, int]:
        """The store's prefix of ``keys`` and the load of its hits after the
        first ``skip`` (held by the host buffer): (prefix, blocks loaded)."""
        tier, dst = self._tier, self._dst
        assert tier is not None and dst is not None
        n = int(keys.size)
        # in virtual time a wait never blocks: no deadline to keep
        timeout = None if self._virtual else self.wait_timeout_s * max(1, n - skip)
        p2, got = tier.lookup_load(keys, [dst] * max(0, n - skip), timeout, skip=skip)
        if got != max(0, p2 - skip):
            st = tier.stats()
            raise RuntimeError(
                f"request {r.index}: the store loaded {got} of its {p2 - skip} tier hits "
                f"(timeouts {st.timeouts}, read errors {st.io_errors}, "
                f"checksum errors {st.checksum_errors})"
            )
        return p2, got

    def _save(self, keys: np.ndarray[Any, Any]) -> tuple[int, int]:
        """Every block of the request into the store: (writes offered, skipped)."""
        tier = self._tier
        assert tier is not None and self._payload is not None
        n = int(keys.size)
        if self._moves_data:
            out = tier.put(keys, [self._payload] * n, touch=True)
        else:
            out = tier.put_lengths(keys, self._dev_block, touch=True)
        if PutStatus.ERROR in out:
            raise RuntimeError("the device failed a write of the tier (see the device's stats)")
        exists = out.count(PutStatus.EXISTS)
        return n - exists, out.count(PutStatus.SKIPPED)

    def worker_of(self, r: Request) -> int:
        """The worker serving ``r``: its session's (or its index's) modulo ``workers``."""
        return (r.session if r.session is not None else r.index) % self.workers

    def _begin(
        self, r: Request, w: int, arrival_s: float, arrival_ns: int, start_ns: int
    ) -> _Started:
        """The request's lookup and load, from the device clock's present."""
        tier = self._tier
        assert tier is not None
        keys = r.block_keys
        ks = tier.namespace.keys(keys)
        gpu = self._g1[w] if self._g1 else None
        p1 = gpu.prefix_len(keys) if gpu is not None else 0
        # the leading blocks the host buffer holds are not loaded (but are
        # tier hits only as far as the tier's prefix goes)
        held = self.pinned.held(keys, p1, len(keys) - p1)
        before = self.dev.stats()
        t0 = self._now_s()
        p2, n_load = self._lookup_load(ks[p1:], held, r)
        t1 = self._now_s()
        if not n_load:
            # a lookup is the host's index: without a load the request
            # does not wait for the device, however far its clock has run
            t0 = t1 = start_ns / 1e9
        mid = self.dev.stats()
        cached = (p1 + p2) * r.block_tokens
        return _Started(
            r=r,
            worker=w,
            arrival_s=arrival_s,
            arrival_ns=arrival_ns,
            start_ns=start_ns,
            t0_s=t0,
            t1_s=t1,
            p1=p1,
            p2=p2,
            n_load=n_load,
            host=min(held, p2),
            dram_bytes=mid.bytes_from_dram - before.bytes_from_dram,
            ssd_bytes=mid.bytes_read_ssd - before.bytes_read_ssd,
            compute_s=self.prefill.compute_s(r.input_tokens - cached, cached),
        )

    def _finish(self, st: _Started, issue_ns: int = -1) -> CxlhmRequest:
        """The request's saves, from the device clock's present; its result.
        ``issue_ns``: when the saves were due (device ns; -1: now)."""
        tier = self._tier
        assert tier is not None
        r, w, sc = st.r, st.worker, self.scale
        keys = r.block_keys
        gpu = self._g1[w] if self._g1 else None
        if gpu is not None:
            gpu.access(keys)
        self.pinned.keep(keys[: st.p1 + st.p2])
        begin = self._now_s()
        offered, skipped = self._save(tier.namespace.keys(keys))
        end = self._now_s()
        device_load_s = st.t1_s - st.t0_s if st.n_load else 0.0
        bb = self._block_bytes
        result = RequestResult(
            system=self.system,
            index=r.index,
            session=r.session,
            turn=r.turn,
            worker=w,
            arrival_s=st.arrival_s,
            input_tokens=r.input_tokens,
            blocks=len(keys),
            gpu_hit_blocks=st.p1,
            tier_hit_blocks=st.p2,
            block_tokens=r.block_tokens,
            gpu_bytes=st.p1 * bb,
            tier_name=self.system,
            tier_bytes=st.p2 * bb,
            compute_s=st.compute_s,
            load_s=device_load_s * sc,
        )
        out = CxlhmRequest(
            result=result,
            device_load_bytes=st.n_load * self._dev_block,
            host_prefix_blocks=st.host,
            device_load_s=device_load_s,
            dram_bytes=st.dram_bytes,
            ssd_bytes=st.ssd_bytes,
            writes_offered=offered,
            writes_skipped=skipped,
            clock_end_s=end,
            queue_s=(st.start_ns - st.arrival_ns) / 1e9 * sc,
            device_wait_s=max(0.0, st.t0_s - st.start_ns / 1e9) * sc,
            save_wait_s=max(0.0, begin - issue_ns / 1e9) * sc if issue_ns >= 0 else 0.0,
            first_token_s=st.t1_s * sc + st.compute_s,
        )
        self.results.append(out)
        return out

    def step(self, r: Request) -> CxlhmRequest:
        """Serves one request now, alone: looks it up, loads its tier hits,
        lets its prefill compute pass (virtual time), saves its blocks.

        With ``open_loop`` the clock first moves to the request's arrival.
        :func:`replay_cxlhm` runs the concurrent workers of ``open_loop`` /
        ``closed_loop``; this is the back-to-back path.
        """
        if self._closed:
            raise ValueError("CxlhmReplay.step: the replay is closed")
        self._setup(r)
        sc = self.scale
        if self.open_loop:
            self.dev.advance_clock(int(r.arrival_s / sc * 1e9))  # type: ignore[attr-defined]
        now_ns = int(self._now_s() * 1e9)
        st = self._begin(r, self.worker_of(r), r.arrival_s, int(r.arrival_s / sc * 1e9), now_ns)
        if not self.open_loop:  # back to back: no queue
            st.arrival_ns = st.start_ns = now_ns
        if self._advance is not None:
            # the new blocks exist once the prefill computed them: that time
            # passes on the device too (scaled like the device's bytes), and
            # its flusher drains the write buffer meanwhile
            self._advance(int((st.t1_s + st.compute_s / sc) * 1e9))
        return self._finish(st)

    def run(
        self, requests: Iterable[Request], progress: Callable[[int], None] | None = None
    ) -> list[CxlhmRequest]:
        """Serves ``requests``: back to back (:meth:`step`), or with
        ``open_loop`` / ``closed_loop`` on concurrent workers in simulated
        time (see the module doc). Results in completion order."""
        if not (self.open_loop or self.closed_loop):
            for r in requests:
                self.step(r)
                if progress is not None:
                    progress(1)
            return self.results
        return self._run_events(list(requests), progress)

    def _run_events(
        self, reqs: list[Request], progress: Callable[[int], None] | None
    ) -> list[CxlhmRequest]:
        if self._closed:
            raise ValueError("CxlhmReplay.run: the replay is closed")
        if not reqs:
            return self.results
        self._setup(reqs[0])
        for r in reqs[1:]:
            self._setup(r)  # one block size, checked before any device work
        advance = self._advance
        assert advance is not None  # checked at construction
        sc = self.scale

        def dev_ns(model_s: float) -> int:
            return round(model_s / sc * 1e9)

        # (device ns, kind, sequence, payload); at one time saves run before
        # arrivals and arrivals before starts, each kind in push order; then
        # decode ends, then KV arriving at a decode worker
        save_k, arrive_k, start_k, dec_end_k, kv_k = 0, 1, 2, 3, 4
        heap: list[tuple[int, int, int, Any]] = []
        seq = itertools.count()

        def push(t: int, kind: int, item: Any) -> None:
            heapq.heappush(heap, (t, kind, next(seq), item))

        dec = self.decode
        nd = dec.workers if dec is not None else 0
        pd_free = [0] * self.workers  # device ns: each prefill worker's PD link
        nic_free = 0  # and the decode node's NIC
        # per decode worker: (result position, prefill end, KV arrival) waiting
        dq: list[collections.deque[tuple[int, int, int]]] = [collections.deque() for _ in range(nd)]
        dbusy = [False] * nd
        kv_per_token = self.prefill.model.kv_bytes_per_token

        def decode_start(d: int, t: int) -> None:
            assert dec is not None
            pos, ready, kv_at = dq[d].popleft()
            out = self.results[pos]
            res = out.result
            step = dec.step_time_s(self.prefill, res.input_tokens)
            step_ns = dev_ns(step)
            pd_s = (kv_at - ready) / 1e9 * sc
            wait_s = (t - kv_at) / 1e9 * sc
            end = t + dec.tokens * step_ns
            out = self.results[pos] = dataclasses.replace(
                out,
                decode_worker=d,
                pd_transfer_s=pd_s,
                decode_queue_s=wait_s,
                decode_step_s=step,
                decode_end_s=end / 1e9 * sc,
                first_token_s=out.first_token_s + pd_s + wait_s + step,
            )
            push(end, dec_end_k, d)
            following = nxt.get(res.index)
            if following is not None:
                push(dev_ns(out.first_token_s + following.think_s), arrive_k, following)

        nxt: dict[int, Request] = {}  # closed loop: a turn -> its session's next
        if self.closed_loop:
            by_session: dict[int, list[Request]] = {}
            for r in reqs:
                if r.session is None or r.turn is None:
                    raise ValueError(
                        f"request {r.index} has no session/turn: cannot close the loop"
                    )
                by_session.setdefault(r.session, []).append(r)
            for turns in by_session.values():
                turns.sort(key=lambda q: (q.turn, q.index))
                for a, b in itertools.pairwise(turns):
                    nxt[a.index] = b
                push(dev_ns(turns[0].arrival_s), arrive_k, turns[0])
        else:
            for r in reqs:
                push(dev_ns(r.arrival_s), arrive_k, r)
        queues: list[collections.deque[tuple[Request, int]]] = [
            collections.deque() for _ in range(self.workers)
        ]
        busy = [False] * self.workers
        arrival_s: dict[int, float] = {}  # model s, by request index
        while heap:
            t, kind, _, item = heapq.heappop(heap)
            if kind == arrive_k:
                w = self.worker_of(item)
                arrival_s[item.index] = t / 1e9 * sc if self.closed_loop else item.arrival_s
                queues[w].append((item, t))
                if not busy[w]:
                    busy[w] = True
                    push(t, start_k, w)
            elif kind == start_k:
                r, arrived = queues[item].popleft()
                advance(t)
                st = self._begin(r, item, arrival_s.pop(r.index), arrived, t)
                push(int(st.t1_s * 1e9) + dev_ns(st.compute_s), save_k, st)
            elif kind == save_k:
                advance(t)
                out = self._finish(item, t)
                w = item.worker
                end = int(out.clock_end_s * 1e9)
                if queues[w]:
                    push(end, start_k, w)
                else:
                    busy[w] = False
                if dec is not None:
                    # the KV leaves for the decode node at the prefill's end (t)
                    kv = item.r.input_tokens * kv_per_token
                    go = max(t, pd_free[w])
                    nic_start = max(go, nic_free)
                    nic_free = nic_start + dev_ns(kv / dec.decode_nic_Bps)
                    pd_free[w] = max(nic_free, go + dev_ns(kv / dec.pd_link_Bps))
                    push(pd_free[w], kv_k, (len(self.results) - 1, t, pd_free[w]))
                else:
                    following = nxt.get(item.r.index)
                    if following is not None:
                        push(dev_ns(out.first_token_s + following.think_s), arrive_k, following)
                if progress is not None:
                    progress(1)
            elif kind == kv_k:
                res = self.results[item[0]].result
                d = (res.session if res.session is not None else res.index) % nd
                dq[d].append(item)
                if not dbusy[d]:
                    dbusy[d] = True
                    decode_start(d, t)
            elif dq[item]:  # a decode ended: the next in its queue starts
                decode_start(item, t)
            else:
                dbusy[item] = False
        return self.results


def replay_cxlhm(
    requests: Iterable[Request],
    replay: CxlhmReplay,
    *,
    progress: Callable[[int], None] | None = None,
) -> list[CxlhmRequest]:
    """Serves ``requests`` through ``replay`` (:meth:`CxlhmReplay.run`), then
    closes it; its results, in completion order."""
    with replay:
        return replay.run(requests, progress)


def _close_tier(store: Store, tmp: tempfile.TemporaryDirectory[str]) -> None:
    try:
        store.close(flush=False)
    finally:
        tmp.cleanup()
