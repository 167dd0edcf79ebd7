"""The worker's side of remote storage nodes.

A storage node is a ``chm-emu serve`` daemon started with ``--listen``,
``--secret-file`` and ``--master`` (:mod:`chm.daemon.node`): its KV store,
its DRAM pool registered with Mooncake Transfer Engine, its blocks published
in the Master. Workers speak the daemon's own protocol to it over TCP
(``fw_spec/protocol.md``, "TCP"; authenticated by the shared secret) and
move the bytes with the engine.

**Worker** (:class:`RemoteTier`): looks keys up in the Master (prefix, at
most 32 per round trip; the rounds after the first on a helper thread, each
round's hits staged while the next rounds are asked), asks the node's daemon
to stage them (``KV_LOOKUP``:
pins and prefetches; ``WAIT``: each staged object's pool offset), reads them
all with one batched engine transfer out of the node's pool into its
registered buffer, hands them back (``KV_DONE``), verifies each block's
XXH3-64 checksum (the Master's, which the node's lookup confirmed) and
copies it out. :meth:`RemoteTier.save` writes blocks into its area on a node
with the engine and puts them (``KV_PUT``): the node publishes them.
Placement: one request's blocks on one node, round-robin over live nodes. A
node that dies or stops answering turns its blocks into misses within
``timeout`` seconds, never a hang or wrong bytes (a late transfer's memory
is quarantined, and a checksum mismatch is a miss); each node has its own
connection, so a slow node never holds up another node's loads. A block the
node no longer holds (evicted) is dropped from the Master when it still
names that node and epoch (:meth:`RedisMaster.drop`).

A node is one command: ``chm-emu serve --listen HOST:PORT --secret-file F
--master redis://H:P/N --node-name NAME`` (docs/remote.md).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

import xxhash

from chm.errors import ChmError, InvalidArgument, error_for
from chm.kv.buffers import as_dst, as_src
from chm.kv.store import MAX_META, PutStatus, check_meta
from chm.remote.master import LOOKUP_BATCH, Entry, RedisMaster, key_bytes
from chm.remote.protocol import MAX_BATCH, MAX_FRAME, Op, read_secret
from chm.remote.transfer import OK, TIMEOUT, Engine, RegisteredBuffer

__all__ = ["NodeGone", "RemoteTier", "read_secret"]

WAIT_SLICE = 0.02  # seconds one KV_LOAD or WAIT waits for a run of staged blocks
GROW_SLICE = 0.002  # the same while the Master's later rounds may still grow the window
TELL_TIMEOUT = 0.5  # seconds a request without an answer may take to be sent
FLUSH_SLICE = 1.0  # seconds one KV_FLUSH may wait on the node's device
GRACE = 1.0  # seconds a node has to answer beyond a request's own wait
_WIRE_BUDGET = MAX_FRAME - 8192  # metadata bytes one KV_PUT (or its answer) may carry
_ENTRIES_STEP = _WIRE_BUDGET // (MAX_META + 96)  # keys per KV_ENTRIES: its answer fits a packet
_ENTRY_NAMES = ("addr", "length", "checksum", "epoch", "state", "meta")
PIPELINE = 4  # parts a large staged run is read in, so checks and copies overlap reads
PIPELINE_BYTES = 8 << 20  # smaller runs: one read
ALIGN = 4096  # blocks in a node's area start at page offsets, as RemoteStore puts them
_hash = xxhash.xxh3_64_intdigest
_BUSY = (-errno.EAGAIN, -errno.EBUSY, -errno.ENOSPC)  # no free slot now: ask again


class NodeGone(ChmError, ConnectionError):
    """The node's daemon connection broke or did not answer in time."""


def _pairs(keys: Sequence[bytes]) -> list[list[int]]:
    """16-byte keys as the protocol's ``[hi, lo]`` pairs."""
    return [[int.from_bytes(k[:8], "big"), int.from_bytes(k[8:16], "big")] for k in keys]


class _Link:
    """A worker's daemon connection to one node (a TCP :class:`RemoteDevice`)
    and what its WELCOME said about the engine (``transfer``) and the node."""

    def __init__(self, control: str, secret_file: str, timeout: float) -> None:
        from chm.remote.client import RemoteDevice

        try:
            self.dev = RemoteDevice(
                f"tcp://{control}", timeout, request_timeout=timeout, secret_file=secret_file
            )
        except (ChmError, OSError) as exc:
            raise NodeGone(None, f"node at {control}: {exc}") from None
        w = self.dev.welcome
        if "transfer" not in w or "node" not in w:
            self.dev.close()
            raise NodeGone(
                None, f"the daemon at {control} is not a storage node (started without --master)"
            )
        t, n = w["transfer"], w["node"]
        self.data = str(t["engine"])
        self.pool_addr = int(t["pool_addr"])
        self.area_addr, self.area_bytes = int(t["area_addr"]), int(t["area_bytes"])
        self.node, self.epoch = int(n["id"]), int(n["epoch"])
        self.lock = threading.Lock()  # one request at a time, with its own deadline
        self.area_lock = threading.Lock()  # one save's blocks in the area at a time
        self.told = False  # an unanswered request sent since the last answer

    @property
    def broken(self) -> bool:
        return self.dev.closed or self.dev._broken is not None

    def call(
        self, op: Op, body: Any, deadline: float, wait: float = 0.0, *, refusals: bool = False
    ) -> Any:
        """One request, answered by ``deadline`` (monotonic seconds) or NodeGone
        (the connection is then closed: the daemon gives back what it held).
        ``refusals``: a request the daemon refuses as a whole (a non-fatal
        ERROR, e.g. Busy) raises that error; the connection stays."""
        with self.lock:
            left = deadline - time.monotonic()
            if left <= 0:
                raise NodeGone(None, f"{op.name}: no time left")
            self.dev.request_timeout = max(0.001, left - wait)
            try:
                got = self.dev._call(op, body, wait)
                self.told = False  # the daemon serves a connection in order
                return got
            except (ChmError, OSError) as exc:
                if refusals and isinstance(exc, ChmError) and not self.broken:
                    raise
                raise NodeGone(None, f"{op.name}: {exc}") from None

    def tell(self, op: Op, body: Any) -> None:
        """A request without an answer (KV_DONE_QUIET); a broken connection
        gives everything back anyway, so its failure is not an error."""
        with self.lock, contextlib.suppress(ChmError, OSError):
            self.dev.request_timeout = TELL_TIMEOUT
            self.told = True
            self.dev._tell(op, body)

    def settle(self, deadline: float) -> None:
        """Once this returns, the daemon has taken every unanswered request
        sent before: one answered request that changes nothing (an empty
        RELEASE) when any is outstanding. Another connection's request then
        finds this one's hand-backs done (a remove right after a load is not
        Busy with the load's own pins)."""
        if self.told and not self.broken:
            with contextlib.suppress(NodeGone):
                self.call(Op.RELEASE, [], deadline)

    def abort(self, why: str) -> None:
        self.dev.abort(why)

    def close(self) -> None:
        with contextlib.suppress(ChmError, OSError):
            self.dev.close()


def _settle(parts: list[tuple[int, concurrent.futures.Future[int]]]) -> int:
    """Waits for every part's checks and copies: how many leading blocks of
    them were verified and copied out."""
    loaded, whole = 0, True
    for n, fut in parts:
        got = fut.result()
        if whole:
            loaded += got
            whole = got == n
    return loaded


class _Stopped(Exception):
    """The load no longer wants the lookup's rounds."""


class _Hits:
    """One load's Master lookup (prefix semantics): the first round of
    ``LOOKUP_BATCH`` keys on the caller's thread, the later rounds on the
    tier's lookup thread, which hands each round's hits over as soon as it
    is answered. ``hits`` grows (on the caller's thread, in :meth:`more`);
    ``ended``: no more will come. With ``node``: only the leading hits on
    that node."""

    def __init__(self, tier: RemoteTier, ks: list[bytes], node: int | None) -> None:
        self.hits: list[Entry] = []
        self.ended = False
        self._node = node
        self._stopped = False
        self._q: queue.SimpleQueue[list[Entry] | None] = queue.SimpleQueue()
        first = ks[:LOOKUP_BATCH]
        got = tier.master.lookup(first)
        self._add(got)
        if not self.ended and len(got) == len(first) and len(ks) > len(first):
            tier._lookups.submit(self._rest, tier.master, ks[LOOKUP_BATCH:])
        else:
            self.ended = True

    def _add(self, got: list[Entry]) -> None:
        if self._node is not None:
            mine = [h.node == self._node for h in got]
            if False in mine:
                got = got[: mine.index(False)]
                self.ended = True
        self.hits.extend(got)

    def _rest(self, master: RedisMaster, ks: list[bytes]) -> None:
        try:
            master.lookup(ks, on_hits=self._round)
        except _Stopped:
            pass
        finally:
            self._q.put(None)

    def _round(self, got: list[Entry]) -> None:
        if self._stopped:
            raise _Stopped  # no further round trips for a load that ended
        self._q.put(got)

    def more(self, deadline: float | None) -> bool:
        """Takes the rounds answered so far; with ``deadline``, waits for
        the next one first (False when none came by then)."""
        while not self.ended:
            try:
                if deadline is None:
                    got = self._q.get_nowait()
                else:
                    got = self._q.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                return deadline is None
            deadline = None  # one came: take the rest without waiting
            if got is None:
                self.ended = True
            else:
                self._add(got)
        return True

    def stop(self) -> None:
        """The load is over: the lookup thread asks no further round."""
        self._stopped = True
        self.ended = True


class RemoteTier:
    """A worker's view of the remote tier: the Master plus every node it names.

    ``buffer`` bytes of host memory are registered once for loads and saves;
    ``timeout`` bounds a load or save (seconds) — past it the remaining
    blocks are misses. Counters in ``stats``.
    """

    def __init__(
        self,
        master: RedisMaster,
        engine: Engine,
        secret: bytes,
        *,
        buffer: int = 256 << 20,
        timeout: float = 10.0,
    ) -> None:
        if not secret:
            raise InvalidArgument(None, "RemoteTier: an empty secret")
        self.master, self.engine, self.secret, self.timeout = master, engine, secret, timeout
        # the daemon client reads the secret from a file: a private copy (0600
        # in a 0700 directory), removed at close
        self._secret_dir = tempfile.mkdtemp(prefix="chm-tier-")
        self._secret_file = os.path.join(self._secret_dir, "secret")
        fd = os.open(self._secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secret)
        self.buf = RegisteredBuffer(engine, buffer)
        self._links: dict[int, _Link] = {}
        # a second connection per node for removes and flushes: a flush that
        # waits on the node's device never holds up this tier's loads and saves
        self._ctl: dict[int, _Link] = {}
        # the Master's lookup rounds after the first run here, so a load
        # stages a node's blocks while its later rounds are asked
        self._lookups = concurrent.futures.ThreadPoolExecutor(
            4, thread_name_prefix="chm-remote-lookup"
        )
        self._post = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="chm-remote-verify"
        )
        self._placed: dict[object, int] = {}
        self._rr = 0
        self._lock = threading.Lock()
        self.stats = {
            "loads": 0,
            "hits": 0,
            "loaded": 0,
            "node_errors": 0,
            "timeouts": 0,
            "bad_checksums": 0,
            "busy": 0,
            "dropped": 0,
            "saved": 0,
            "skipped": 0,
            "windows": 0,
            "early_windows": 0,
            "removed": 0,
            "flushes": 0,
        }

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    def _link(
        self,
        node: int,
        epoch: int | None = None,
        deadline: float | None = None,
        *,
        control: bool = False,
    ) -> _Link:
        """The connection to ``node`` (at ``epoch``, if given), made on first
        use; ``control``: the one for removes and flushes."""
        links = self._ctl if control else self._links
        with self._lock:
            got = links.get(node)
        if got is not None and not got.broken and (epoch is None or got.epoch == epoch):
            return got
        info = self.master.node(node)
        if epoch is not None and info.epoch != epoch:
            raise NodeGone(None, f"node {node} is at epoch {info.epoch}, not {epoch}")
        left = self.timeout if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise NodeGone(None, f"node {node}: no time left to connect")
        link = _Link(info.endpoints["control"], self._secret_file, left)
        if epoch is not None and link.epoch != epoch:
            link.close()
            raise NodeGone(None, f"node {node} restarted: epoch {link.epoch}, not {epoch}")
        drop: _Link | None
        with self._lock:
            old = links.get(node)
            if old is not None and old is not got and not old.broken and old.epoch == link.epoch:
                # another thread connected meanwhile: use its link (closing
                # it here would pull the area from under its transfers)
                keep, drop = old, link
            else:
                links[node] = keep = link
                drop = old
        if drop is not None:
            drop.close()
        return keep

    # ---- loads

    def load(
        self,
        keys: Any,
        dsts: Sequence[Any],
        timeout: float | None = None,
        *,
        node: int | None = None,
    ) -> int:
        """Copies the leading hits of ``keys`` into ``dsts`` in order; returns how many.

        Stops at the first key that is not a hit (with ``node``: not a hit on
        that node), cannot be staged or read in time, or fails its checksum.
        Never waits much past ``timeout``. The Master is asked in rounds of
        ``LOOKUP_BATCH`` keys: the first on this thread, the later ones on a
        helper thread, and each round's hits are staged as soon as they are
        known, while the next rounds are asked (``stats["early_windows"]``).
        """
        t = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + t
        ks = key_bytes(keys)
        if len(dsts) < len(ks):
            raise InvalidArgument(None, f"load: {len(ks)} keys but {len(dsts)} buffers")
        outs = [as_dst(d, f"buffer {j}") for j, d in enumerate(dsts[: len(ks)])]
        self._count("loads")
        feed = _Hits(self, ks, node)
        try:
            done = self._load_hits(feed, outs, deadline)
        finally:
            feed.stop()
        self._count("hits", len(feed.hits))
        self._count("loaded", done)
        return done

    def _load_hits(self, feed: _Hits, outs: list[Any], deadline: float) -> int:
        """Loads the hits ``feed`` hands over, in order: each node's run in
        windows of at most MAX_BATCH keys and half the buffer. A window
        starts with the hits known so far and, while the Master's later
        rounds come in, grows by them (their prefetches issued at once), so
        an early start costs no extra window; each part's checksums and
        copies run on a helper thread while the next part is staged and
        read. Returns how many leading hits were loaded and verified."""
        hits = feed.hits
        done = 0  # verified hits of the runs before the current one
        run = read = 0  # the current run starts at ``run``; ``read``: staged and read
        link: _Link | None = None
        parts: list[tuple[int, concurrent.futures.Future[int]]] = []
        half = self.buf.nbytes // 2

        def fit(start: int, n: int, total: int) -> int:
            """How many of the known hits from ``start`` join a window of
            ``n`` hits and ``total`` bytes on the run's node."""
            h = hits[run]
            k = 0
            while (
                start + k < len(hits)
                and n + k < MAX_BATCH
                and hits[start + k].node == h.node
                and hits[start + k].epoch == h.epoch
                and total + hits[start + k].length <= half
            ):
                total += RegisteredBuffer.span(hits[start + k].length)
                k += 1
            return k

        try:
            while True:
                if read == len(hits):
                    if feed.ended:
                        break
                    if not feed.more(deadline):
                        self._count("timeouts")
                        break
                    continue
                feed.more(None)  # what else is known by now: a fuller window
                h = hits[read]
                if link is None or h.node != hits[run].node or h.epoch != hits[run].epoch:
                    if link is not None:  # the run before ends here
                        got, parts = _settle(parts), []
                        done += got
                        if got < read - run:
                            break
                    run = read
                    try:
                        link = self._link(h.node, h.epoch, deadline)
                    except ChmError:
                        self._count("node_errors")
                        break
                win = fit(read, 0, 0)
                if win == 0:
                    break  # a block larger than half the buffer
                self._count("windows")

                def grow(
                    n: int, total: int, block: bool, start: int = read
                ) -> tuple[list[Entry], list[Any]] | None:
                    """The hits the Master answered since that join the window
                    (``block``: waits for the next round first); None when no
                    more can (the lookup ended, or the next hit does not fit)."""
                    if not feed.more(deadline if block else None):
                        return None  # no round came by the deadline
                    k = fit(start + n, n, total)
                    if k == 0 and (feed.ended or start + n < len(hits)):
                        return None
                    return hits[start + n : start + n + k], outs[start + n : start + n + k]

                if not feed.ended:
                    self._count("early_windows")
                n, whole = self._load_window(
                    link,
                    hits[read : read + win],
                    outs[read : read + win],
                    deadline,
                    parts,
                    None if feed.ended else grow,
                )
                read += n
                if not whole:
                    break
        finally:
            done += _settle(parts)  # every part's verify-and-copy ends before the load returns
        return done

    def _issue(
        self, link: _Link, ents: list[Entry], pairs: list[list[int]], deadline: float, wait: float
    ) -> tuple[int, list[Any]]:
        """``KV_LOAD`` of ``ents`` (pins, prefetches, waits up to ``wait``):
        ``(how many leading blocks are held and still the Master's bytes,
        their answers)``; what is held past them is handed back at once.
        Asks again while every slot is held by others."""
        while True:
            step = min(wait, max(0.0, deadline - time.monotonic()))
            try:
                ans = link.call(Op.KV_LOAD, [int(step * 1e9), pairs, False], deadline, wait=step)
            except NodeGone:
                self._count("node_errors")
                return 0, []
            n = 0
            while n < len(ents):
                rc, tok, ln, ck, _off = ans[n]
                if not tok or rc not in (0, -errno.ETIMEDOUT):
                    break
                if ln != ents[n].length or ck != ents[n].checksum:
                    break  # the node holds other bytes under the key now
                n += 1
            extra = [[*pairs[j], int(ans[j][1]), 0] for j in range(n, len(ents)) if ans[j][1]]
            if extra:  # held past the prefix: handed back at once
                link.tell(Op.KV_DONE_QUIET, extra)
            if n < len(ents) and not ans[n][1] and ans[n][0] == -errno.ENOENT:
                # evicted or removed: not a hit while the entry names this node and epoch
                self._count("dropped", self.master.drop([ents[n].key], ents[n].node, ents[n].epoch))
            if n or ans[0][1] or ans[0][0] not in _BUSY or time.monotonic() >= deadline:
                return n, ans
            self._count("busy")
            time.sleep(0.001)  # every slot is held (by other workers): ask again

    def _load_window(
        self,
        link: _Link,
        ents: list[Entry],
        outs: list[Any],
        deadline: float,
        parts: list[tuple[int, concurrent.futures.Future[int]]],
        grow: Any = None,
    ) -> tuple[int, bool]:
        """Stages a window on the node and reads it as it comes out staged.

        ``KV_LOAD`` pins and prefetches the window and waits a short slice
        (one round trip); then, as long as the blocks come out staged in
        order, each staged run is read with batched engine reads (in up to
        ``PIPELINE`` parts when large, so one part's checks and copies
        overlap the next part's read) and handed back (``KV_DONE_QUIET``, no
        round trip), so its slots stage the blocks after it; ``WAIT``, in
        short slices, for the rest. ``grow(n, bytes)`` (while the Master's
        later rounds come in) gives hits that join the window: their
        ``KV_LOAD`` is sent at once, with no wait, and the slices stay short
        (``GROW_SLICE``) while it may give more. Returns ``(how many blocks
        were read, whether that is the whole window)``; their checks and
        copies are in ``parts``."""
        ents, outs = list(ents), list(outs)
        pairs = _pairs([e.key for e in ents])
        n, ans = self._issue(link, ents, pairs, deadline, 0.0 if grow else WAIT_SLICE)
        whole = n == len(ents)
        toks = [int(a[1]) for a in ans[:n]]
        rcs = [int(a[0]) for a in ans[:n]]
        offs = [int(a[4]) for a in ans[:n]]
        del ents[n:], outs[n:], pairs[n:]
        total = sum(RegisteredBuffer.span(e.length) for e in ents)
        at = 0  # tokens [at, n) are still held
        if not whole:
            grow = None
        try:
            while True:
                if grow is not None:  # hits the Master answered since join the window
                    g = grow(n, total, at == n)
                    if g is None:
                        grow = None
                    elif g[0]:
                        more, mouts = g
                        mp = _pairs([e.key for e in more])
                        k, mans = self._issue(link, more, mp, deadline, 0.0)
                        if k < len(more):
                            whole, grow = False, None
                        ents += more[:k]
                        outs += mouts[:k]
                        pairs += mp[:k]
                        toks += [int(x[1]) for x in mans[:k]]
                        rcs += [int(x[0]) for x in mans[:k]]
                        offs += [int(x[4]) for x in mans[:k]]
                        total += sum(RegisteredBuffer.span(e.length) for e in more[:k])
                        n += k
                if at == n:
                    if grow is None:
                        break
                    continue  # all read; the next round is waited for in grow()
                m = 0
                while at + m < n and rcs[at + m] == 0:
                    m += 1
                if m == 0:
                    if rcs[at] != -errno.ETIMEDOUT:
                        self._count("node_errors")  # the node could not read it
                        whole = False
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._count("timeouts")
                        whole = False
                        break
                    step = min(left, GROW_SLICE if grow is not None else WAIT_SLICE)
                    try:
                        res = link.call(Op.WAIT, [int(step * 1e9), toks[at:n]], deadline, wait=step)
                    except NodeGone:
                        self._count("node_errors")
                        whole = False
                        break
                    for j, (rc, off, ln, _addr) in enumerate(res, at):
                        rcs[j] = int(rc) if rc or ln == ents[j].length else -errno.EIO
                        offs[j] = int(off)
                    continue
                got = 0
                nbytes = sum(e.length for e in ents[at : at + m])
                k = PIPELINE if nbytes >= PIPELINE_BYTES else 1
                size = -(-m // k)
                for p in range(at, at + m, size):
                    q = min(p + size, at + m)
                    r = self._read_part(link, ents[p:q], outs[p:q], offs[p:q], deadline, parts)
                    got += r
                    if r < q - p:
                        break
                link.tell(Op.KV_DONE_QUIET, [[*pairs[j], toks[j], 0] for j in range(at, at + m)])
                at += m
                if got < m:
                    return at - m + got, False
        finally:
            if at < n:  # what was staged but not read goes back
                with contextlib.suppress(NodeGone):
                    link.tell(Op.KV_DONE_QUIET, [[*pairs[j], toks[j], 0] for j in range(at, n)])
        return at, whole and at == n

    def _read_part(
        self,
        link: _Link,
        ents: list[Entry],
        outs: list[Any],
        pool_offs: list[int],
        deadline: float,
        parts: list[tuple[int, concurrent.futures.Future[int]]],
    ) -> int:
        """One batched engine read of staged blocks (at ``pool_offs`` in the
        node's pool) into the buffer; queues their checks and copies on
        ``parts``. Returns how many were read (0 on a failed read)."""
        offs: list[int] = []
        for e in ents:
            try:
                offs.append(self.buf.take(e.length))
            except ChmError:
                for _, f in parts:  # the parts before give their regions back
                    f.result()
                try:
                    offs.append(self.buf.take(e.length))
                except ChmError:
                    break
        m = len(offs)
        if m == 0:
            return 0
        status = self.engine.read(
            link.data,
            [self.buf.addr + o for o in offs],
            [link.pool_addr + x for x in pool_offs[:m]],
            [e.length for e in ents[:m]],
            timeout=max(deadline - time.monotonic(), 0.001),
            on_late=self._late(offs, ents[:m]),
        )
        if status != OK:
            if status == TIMEOUT:
                self._count("timeouts")  # the late transfer gives its regions back
            else:
                self._count("node_errors")
                for o, e in zip(offs, ents, strict=False):
                    self.buf.give(o, e.length)
            return 0
        parts.append((m, self._post.submit(self._verify_copy, offs, ents[:m], outs[:m])))
        return m

    def _verify_copy(self, offs: list[int], ents: list[Entry], outs: list[Any]) -> int:
        """Checks each block's XXH3-64 and copies it out, in order; gives the regions back."""
        loaded = 0
        try:
            for o, e, dst in zip(offs, ents, outs, strict=True):
                v = self.buf.view(o, e.length)
                if _hash(v.data) != e.checksum:
                    self._count("bad_checksums")
                    break
                if dst.size < e.length:
                    break
                dst[: e.length] = v
                loaded += 1
        finally:
            for o, e in zip(offs, ents, strict=True):
                self.buf.give(o, e.length)
        return loaded

    def _late(self, offs: list[int], ents: list[Entry]) -> Any:
        def quarantine() -> Any:
            backs = [self.buf.quarantine(o, e.length) for o, e in zip(offs, ents, strict=True)]

            def done() -> None:
                for b in backs:
                    b()

            return done

        return quarantine

    # ---- saves

    def place(self, request: object) -> int:
        """The node of a request: chosen round-robin over live nodes on first use, then kept."""
        with self._lock:
            d = self._placed.get(request)
        if d is not None:
            return d
        live = [n.node for n in self.master.nodes() if n.live]
        if not live:
            raise NodeGone(None, "no live node is registered with the Master")
        with self._lock:
            d = self._placed.setdefault(request, live[self._rr % len(live)])
            self._rr += 1
        return d

    def finish(self, request: object) -> None:
        with self._lock:
            self._placed.pop(request, None)

    def save(
        self,
        request: object,
        keys: Any,
        srcs: Sequence[Any],
        *,
        node: int | None = None,
        meta: Sequence[bytes | None] | None = None,
    ) -> list[PutStatus]:
        """Writes blocks to the request's node (or to ``node``) and puts them
        there (the node publishes them): a status per key. ``meta``: per key
        a small metadata field (at most ``MAX_META`` bytes; None or b"" for
        none) the node's store keeps with the block (``KV_PUT``'s fifth
        element; :meth:`entries` reads it back).

        Blocks that do not fit the node's area in one go are put in several;
        a node that fails makes the rest ERROR (never a hang).
        """
        ks = key_bytes(keys)
        if len(srcs) != len(ks):
            raise InvalidArgument(None, f"save: {len(ks)} keys but {len(srcs)} buffers")
        metas = check_meta(meta, len(ks))
        bufs = [as_src(s, f"buffer {j}") for j, s in enumerate(srcs)]
        out: list[PutStatus] = []
        deadline = time.monotonic() + self.timeout
        try:
            link = self._link(self.place(request) if node is None else node, None, deadline)
        except ChmError:
            self._count("node_errors")
            return [PutStatus.ERROR] * len(ks)
        room = min(link.area_bytes, self.buf.nbytes)
        at = 0
        while at < len(ks):
            win, total, wire = 0, 0, 0
            while (
                at + win < len(ks)
                and win < MAX_BATCH
                and total + bufs[at + win].size <= room
                and wire + len(metas[at + win]) + 64 <= _WIRE_BUDGET
            ):
                total += -(-bufs[at + win].size // ALIGN) * ALIGN
                wire += len(metas[at + win]) + 64
                win += 1
            if win == 0:
                out.append(PutStatus.ERROR)  # larger than the area
                at += 1
                continue
            st = self._save_window(
                link, ks[at : at + win], bufs[at : at + win], metas[at : at + win], deadline
            )
            out.extend(st)
            at += win
            if PutStatus.ERROR in st:
                out.extend([PutStatus.ERROR] * (len(ks) - at))
                break
        self._count("saved", sum(s == PutStatus.STORED for s in out))
        self._count("skipped", sum(s == PutStatus.SKIPPED for s in out))
        return out

    def _save_window(
        self, link: _Link, ks: list[bytes], bufs: list[Any], metas: list[bytes], deadline: float
    ) -> list[PutStatus]:
        err = [PutStatus.ERROR] * len(ks)
        offs, o = [], 0
        for b in bufs:
            offs.append(o)
            o += -(-b.size // ALIGN) * ALIGN
        try:
            base = self.buf.take(o)
        except ChmError:
            self._count("busy")
            return err
        for b, x in zip(bufs, offs, strict=True):
            self.buf.view(base + x, b.size)[:] = b
        with link.area_lock:
            status = self.engine.write(
                link.data,
                [self.buf.addr + base + x for x in offs],
                [link.area_addr + x for x in offs],
                [b.size for b in bufs],
                timeout=max(0.001, deadline - time.monotonic()),
                on_late=lambda: self.buf.quarantine(base, o),
            )
            if status == TIMEOUT:
                # its bytes may still land in the area: the connection (and
                # with it the area) goes, and the next save gets a new one
                self._count("timeouts")
                link.abort("a write into the area outlived its timeout")
                return err
            self.buf.give(base, o)
            if status != OK:
                # the node's engine is gone (a node killed or restarted has
                # a new one): the next save connects anew
                self._count("node_errors")
                link.abort("a write into the area failed")
                return err
            items: list[list[Any]] = [
                [*p, x, b.size, m] if m else [*p, x, b.size]
                for p, x, b, m in zip(_pairs(ks), offs, bufs, metas, strict=True)
            ]
            try:
                st = link.call(Op.KV_PUT, items, deadline)
            except NodeGone:
                self._count("node_errors")
                return err
        if isinstance(st, int):  # the store refused the whole put (-errno)
            self._count("node_errors")
            return err
        return [PutStatus(s) for s in st]

    # ---- removes and flushes (the node's store itself)

    def _ask(
        self,
        node: int,
        epoch: int | None,
        deadline: float,
        op: Op,
        body: Any,
        *,
        wait: float = 0.0,
        grace: float | None = None,
        refusals: bool = False,
    ) -> Any:
        """One request on the node's control connection (at ``epoch``, if
        given), connected by ``deadline`` and answered by then (with
        ``grace``: within ``wait + grace`` seconds of asking). A kept
        connection that turns out dead (the node restarted since, or
        dropped it) is replaced once: a restarted node then says so
        (NodeGone naming the epochs)."""
        with self._lock:
            kept = self._ctl.get(node)
            loads = self._links.get(node)
        if loads is not None:  # this tier's own hand-backs come first
            loads.settle(deadline)
        link = self._link(node, epoch, deadline, control=True)
        by = deadline if grace is None else time.monotonic() + wait + grace
        try:
            return link.call(op, body, by, wait, refusals=refusals)
        except NodeGone:
            if link is not kept or not link.broken:
                raise
        link = self._link(node, epoch, deadline, control=True)
        by = deadline if grace is None else time.monotonic() + wait + grace
        return link.call(op, body, by, wait, refusals=refusals)

    def remove(self, node: int, keys: Any, timeout: float | None = None) -> list[bool]:
        """Removes blocks from ``node``'s store (``KV_REMOVE``, at most
        ``MAX_BATCH`` keys a request): per key whether the node held it.
        The node unpublishes them from the Master. A key another client is
        loading refuses its request as a whole: Busy, that request's keys
        all kept (earlier requests of the call stay done). NodeGone when
        the node does not answer within ``timeout``."""
        ks = key_bytes(keys)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        out: list[bool] = []
        for at in range(0, len(ks), MAX_BATCH):
            body = _pairs(ks[at : at + MAX_BATCH])
            got = self._ask(node, None, deadline, Op.KV_REMOVE, body, refusals=True)
            out += [bool(g) for g in got]
        self._count("removed", sum(out))
        return out

    def entries(
        self, node: int, keys: Any, timeout: float | None = None
    ) -> list[dict[str, Any] | None]:
        """Per key the entry ``node``'s store holds (``KV_ENTRIES``: ``addr``,
        ``length``, ``checksum``, ``epoch``, ``state``, ``meta``) or None;
        NodeGone when the node does not answer within ``timeout``."""
        ks = key_bytes(keys)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        out: list[dict[str, Any] | None] = []
        for at in range(0, len(ks), _ENTRIES_STEP):
            body = _pairs(ks[at : at + _ENTRIES_STEP])
            for e in self._ask(node, None, deadline, Op.KV_ENTRIES, body):
                out.append(None if e is None else dict(zip(_ENTRY_NAMES, e, strict=True)))
        return out

    def epoch_of(self, node: int) -> int | None:
        """The epoch of ``node`` this tier's connection to it was made at
        (None: not connected)."""
        with self._lock:
            lk = self._links.get(node)
        return None if lk is None else lk.epoch

    def flush_node(
        self, node: int, timeout: float | None = None, *, epoch: int | None = None
    ) -> None:
        """Makes every block ``node``'s store holds durable there
        (``KV_FLUSH``, asked in slices of at most ``FLUSH_SLICE`` seconds):
        when it returns, they survive a crash of the node. ``epoch``: the
        node's epoch when the caller put its blocks; NodeGone when the node
        restarted since (what it had not flushed may be lost), does not
        answer, or is gone; WaitTimeout past ``timeout`` (None: no limit
        while the node answers); the node's error (e.g. DeviceIOError) when
        its flush failed."""
        now = time.monotonic()
        end = float("inf") if timeout is None else now + timeout
        connect = min(end, now + self.timeout)
        while True:
            left = max(0.0, end - time.monotonic())
            step = min(left, FLUSH_SLICE)
            rc = int(
                self._ask(
                    node,
                    epoch,
                    connect,
                    Op.KV_FLUSH,
                    int(step * 1e9),
                    wait=step,
                    grace=GRACE,
                )
            )
            if rc == -errno.ETIMEDOUT and step < left:
                continue
            if rc:
                raise error_for(-rc)(
                    -rc, f"flush of node {node}: {os.strerror(-rc)}", call="KV_FLUSH"
                )
            self._count("flushes")
            return

    def close(self) -> None:
        with self._lock:
            links = list(self._links.values()) + list(self._ctl.values())
            self._links.clear()
            self._ctl.clear()
        for lk in links:
            lk.close()
        self._lookups.shutdown(wait=True)
        self._post.shutdown(wait=True)
        self.buf.close()
        shutil.rmtree(self._secret_dir, ignore_errors=True)

    def __enter__(self) -> RemoteTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
