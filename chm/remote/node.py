"""A remote CXL-HM node and the worker side that reads from it.

**Node** (:class:`NodeServer`, one per storage host): a :class:`chm.kv.Store`
on a ``chm.Device`` opened with ``pool="memfd"``. The node maps the device's
DRAM pool and registers it with the Transfer Engine, so workers read staged
blocks straight out of device DRAM with one-sided reads (no node software on
the data path). It registers with the Master (a new epoch), keeps its lease
alive, and publishes every block it stores (a restart re-publishes what the
store recovered, under the new epoch).

**Control channel**: ``multiprocessing.connection`` over TCP, authenticated
by the shared secret (HMAC challenge both ways: a client without the secret
is refused before any command). Commands: ``hello``; ``stage`` (keys and
their checksums -> per block its pool address, length and a token, prefix
semantics: a key the store no longer holds, or holds with another checksum,
ends the answer); ``release`` (tokens); ``commit`` (blocks a client wrote
into its write area -> put into the store: stored / exists / skipped /
error per key, skip-not-stall as in :meth:`Store.put`); ``prefetch`` and
``wait`` (the two halves of ``stage``, so a worker reads one window while
the node stages the next; ``prefetch`` also answers the pool addresses when
every block is staged at once, resident in device DRAM); ``stats``
(:meth:`NodeServer.health`). A node whose epoch was superseded (the same
name registered again elsewhere) refuses to stage or commit. A client's
staged slots, pins and write area are given back when it disconnects or
dies.

**Worker** (:class:`RemoteTier`): looks keys up in the Master (prefix, at
most 32 per round trip), asks the node to stage them, reads them all with
one batched transfer into its registered buffer, releases, verifies each
block's XXH3-64 checksum and copies it out; :meth:`RemoteTier.save` writes
blocks into its write area on a node (placement: one request's blocks on
one node, round-robin over live nodes) and commits them. A node that dies
or stops answering turns its blocks into misses within ``timeout`` seconds,
never a hang or wrong bytes (a late transfer's memory is quarantined, and
a checksum mismatch is a miss).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import mmap
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Client,
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from typing import Any

import numpy as np
import xxhash

from chm.device import Device
from chm.errors import ChmError, InvalidArgument, WouldBlock
from chm.kv.buffers import as_dst, as_src
from chm.kv.keys import KEY_DTYPE
from chm.kv.store import PutStatus, Store
from chm.remote.master import Entry, Lease, RedisMaster, key_bytes
from chm.remote.protocol import read_secret
from chm.remote.transfer import OK, TIMEOUT, Engine, RegisteredBuffer

__all__ = ["NodeGone", "NodeServer", "RemoteTier", "read_secret"]

PIPELINE = 4  # parts a load window is read in, so staging overlaps the reads
PIPELINE_BYTES = 8 << 20  # smaller windows: one part, staged in one round trip
HANDSHAKE = 5.0  # seconds a new control connection has to prove it holds the secret
_WIRE = np.dtype([("hi", ">u8"), ("lo", ">u8")])
_hash = xxhash.xxh3_64_intdigest


class NodeGone(ChmError, ConnectionError):
    """The node's control channel broke or did not answer in time."""


def _done(n: int) -> concurrent.futures.Future[int]:
    f: concurrent.futures.Future[int] = concurrent.futures.Future()
    f.set_result(n)
    return f


def _digests(keys: Sequence[bytes]) -> np.ndarray[Any, Any]:
    return np.frombuffer(b"".join(keys), dtype=_WIRE).astype(KEY_DTYPE)


@dataclass
class _Client:
    conn: Connection
    write_map: mmap.mmap
    write_addr: int
    session: Any
    staged: dict[int, tuple[Any, bytes]] = field(default_factory=dict)


class NodeServer:
    """Serves a store's blocks to workers on other hosts (module docstring).

    ``store`` must be on a device opened with ``pool="memfd"`` in prefetch
    mode; ``listen`` is ``(host, port)`` of the control channel (port 0:
    any); ``write_area`` is each client's write area in bytes; ``quota`` the
    staged slots a client may hold (None: the device's default).
    """

    def __init__(
        self,
        store: Store,
        master: RedisMaster,
        name: str,
        *,
        engine: Engine,
        listen: tuple[str, int],
        secret: bytes,
        write_area: int = 64 << 20,
        quota: int | None = None,
    ) -> None:
        if not secret:
            raise InvalidArgument(None, "NodeServer: an empty secret")
        self.store, self.master, self.name, self.engine = store, master, name, engine
        self.write_area, self.quota = int(write_area), quota
        if not isinstance(store.device, Device):
            raise InvalidArgument(
                None, "NodeServer: the store must be on an embedded chm.Device (pool='memfd')"
            )
        self.device = store.device
        fd = self.device.pool_fd()
        self.pool_len = os.fstat(fd).st_size
        self._pool = mmap.mmap(fd, self.pool_len, mmap.MAP_SHARED, mmap.PROT_READ)
        self._pool_arr = np.frombuffer(self._pool, dtype=np.uint8)
        self.pool_base = int(self._pool_arr.ctypes.data)
        engine.register(self.pool_base, self.pool_len)
        self._secret = secret
        self._listener = Listener(listen)  # the handshake runs on each connection's thread
        host, port = self._listener.address
        self.address = (str(host), int(port))
        self._lock = threading.Lock()
        self._conns: set[Connection] = set()
        self._closing = threading.Event()
        self.stats = {"clients": 0, "staged": 0, "committed": 0, "refused": 0}
        self._endpoints = {
            "data": engine.endpoint,
            "control": f"{host}:{port}",
            "pid": str(os.getpid()),
        }
        self.node, self.epoch = master.register(name, self._endpoints)
        self._lease = Lease(master, self.node, self.epoch, self._master_back)
        self.republish()
        self._thread = threading.Thread(target=self._accept, name="chm-node-accept", daemon=True)
        self._thread.start()

    # ---- the Master

    def _entries(self, ks: np.ndarray[Any, Any]) -> list[Entry]:
        out = []
        for k, e in zip(key_bytes(ks), self.store.entries(ks), strict=True):
            if e is not None:
                out.append(
                    Entry(
                        k, self.node, e["addr"], e["length"], e["checksum"], self.epoch, e["epoch"]
                    )
                )
        return out

    def health(self) -> dict[str, Any]:
        """The node as its operator sees it: id, epoch, lease state, clients,
        blocks staged and committed, refused connections, the store's stats."""
        with self._lock:
            counts = dict(self.stats)
        return {
            "node": self.node,
            "name": self.name,
            "epoch": self.epoch,
            "superseded": self._lease.lost,
            "master_recoveries": self._lease.recoveries,
            **counts,
            "store": self.store.stats().to_dict(),
        }

    def _master_back(self) -> tuple[int, int]:
        """Redis answers again: registers anew when it lost this node, then
        re-publishes every block under the (possibly new) epoch."""
        try:
            info = self.master.node(self.node)
            same = info.name == self.name and info.epoch == self.epoch
        except ChmError:
            same = False
        if not same:
            self.node, self.epoch = self.master.register(self.name, self._endpoints)
        self.republish()
        return self.node, self.epoch

    def _forget(self, key: bytes, held: dict[str, Any] | None) -> None:
        """A worker asked for a block this node no longer holds as published
        (evicted, or replaced): drops the stale entry from the Master when it
        is this node's, or publishes what the node holds now."""
        if held is not None:
            self.master.publish(self._entries(_digests([key])))
            return
        with contextlib.suppress(ChmError):
            (e,) = self.master.get([key])
            if e is not None and e.node == self.node:
                self.master.remove([key])

    def republish(self) -> int:
        """Publishes every block the store holds under this epoch; returns how many."""
        idx = self.store._index  # the store's rows: keys of every block it holds
        live = idx.e[idx.e["state"] != 0]
        ks = np.empty(live.shape[0], dtype=KEY_DTYPE)
        ks["hi"], ks["lo"] = live["hi"], live["lo"]
        n = 0
        for at in range(0, ks.size, 4096):
            ents = self._entries(ks[at : at + 4096])
            if self.master.publish(ents):
                n += len(ents)
        return n

    # ---- serving

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn = self._listener.accept()
            except OSError:
                if self._closing.is_set():
                    return
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _authenticate(self, conn: Connection) -> bool:
        """The shared-secret handshake (HMAC both ways), within HANDSHAKE seconds."""
        timer = threading.Timer(HANDSHAKE, conn.close)  # a silent client is cut off
        timer.start()
        try:
            deliver_challenge(conn, self._secret)
            answer_challenge(conn, self._secret)
            return True
        except (AuthenticationError, OSError, EOFError):
            with self._lock:
                self.stats["refused"] += 1
            with contextlib.suppress(OSError):
                conn.close()
            return False
        finally:
            timer.cancel()

    def _serve(self, conn: Connection) -> None:
        if not self._authenticate(conn):
            return
        wmap = mmap.mmap(-1, self.write_area, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        warr = np.frombuffer(wmap, dtype=np.uint8)
        waddr = int(warr.ctypes.data)
        self.engine.register(waddr, self.write_area)
        cl = _Client(conn, wmap, waddr, self.device.session(self.quota))
        with self._lock:
            self.stats["clients"] += 1
            self._conns.add(conn)
        try:
            while True:
                try:
                    req = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    reply: Any = ("ok", self._handle(cl, warr, req))
                except ChmError as exc:
                    reply = ("err", type(exc).__name__, str(exc.strerror))
                except (IndexError, KeyError, TypeError, ValueError) as exc:  # a malformed request
                    reply = ("err", "InvalidArgument", f"bad request: {exc!r}")
                try:
                    conn.send(reply)
                except OSError:
                    return
        finally:
            self._drop(cl)
            del warr
            self.engine.unregister(waddr)
            with contextlib.suppress(BufferError):
                wmap.close()
            conn.close()
            with self._lock:
                self._conns.discard(conn)  # last: close() waits for all of the above

    def _drop(self, cl: _Client) -> None:
        """Gives back everything a gone client held: slots, pins, the session."""
        for tok in list(cl.staged):
            self._release_one(cl, tok)
        cl.session.close()
        with self._lock:
            self.stats["clients"] -= 1

    def _release_one(self, cl: _Client, tok: int) -> None:
        h, key = cl.staged.pop(tok)
        with contextlib.suppress(ChmError):
            h.release()
        with contextlib.suppress(ChmError):
            self.store.unpin(_digests([key]))

    def _handle(self, cl: _Client, warr: np.ndarray[Any, Any], req: Any) -> Any:
        op = req[0]
        if op == "hello":
            return {
                "node": self.node,
                "epoch": self.epoch,
                "data": self.engine.endpoint,
                "pool": (self.pool_base, self.pool_len),
                "write": (cl.write_addr, self.write_area),
            }
        if op == "stats":
            return self.health()
        if self._lease.lost and op in ("stage", "prefetch", "commit"):
            raise ChmError(
                None, f"node {self.name} epoch {self.epoch} was superseded by a newer one"
            )
        if op == "stage":
            return self._stage(cl, req[1], req[2], float(req[3]))
        if op == "prefetch":
            tokens, why = self._prefetch(cl, req[1], req[2])
            return tokens, why, self._ready(cl, tokens)
        if op == "wait":
            return self._wait(cl, req[1], float(req[2]))
        if op == "release":
            for tok in req[1]:
                if tok in cl.staged:
                    self._release_one(cl, tok)
            return len(req[1])
        if op == "commit":
            return self._commit(warr, req[1])
        raise InvalidArgument(None, f"unknown command {op!r}")

    def _prefetch(
        self, cl: _Client, keys: list[bytes], checksums: list[int]
    ) -> tuple[list[int], str]:
        """Pins and issues the prefetches of a prefix of the keys, without
        waiting: ``(tokens, why)``; ``why`` says what ended the prefix:
        ``"all"``; ``"busy"`` (no free slot now: never waits for one, the
        worker asks again after it released some); ``"miss"`` (the store no
        longer holds the key with that checksum); ``"error"``."""
        if len(keys) != len(checksums):
            raise InvalidArgument(None, "prefetch: keys and checksums differ in length")
        ks = _digests(keys)
        pinned = self.store.pin(ks)
        ents = self.store.entries(ks)
        n, why = 0, "all"
        while n < len(keys):
            e = ents[n]
            if not pinned[n] or e is None or e["checksum"] != checksums[n]:
                why = "miss"  # gone (evicted), or the key now names other bytes
                self._forget(keys[n], e)
                break
            n += 1
        for j, p in enumerate(pinned):
            if p and j >= n:
                self.store.unpin(ks[j : j + 1])
        tokens: list[int] = []
        # the store's admission picks the blocks the device keeps resident in
        # its DRAM after release (a device with a resident region), as for a local load
        retain = self.store._retain_mask([e["addr"] for e in ents[:n] if e is not None])
        for j in range(n):
            e = ents[j]
            assert e is not None
            try:
                h = cl.session.prefetch(
                    e["addr"], e["length"], noqueue=True, retain=bool(retain and retain[j])
                )
            except ChmError as exc:  # no free slot (or over the quota): the prefix ends
                why = "busy" if isinstance(exc, WouldBlock) else "error"
                for jj in range(j, n):
                    self.store.unpin(ks[jj : jj + 1])
                break
            cl.staged[h.token] = (h, keys[j])
            tokens.append(h.token)
        return tokens, why

    def _ready(self, cl: _Client, tokens: list[int]) -> list[tuple[int, int, int]] | None:
        """Every token's ``(pool addr, length, token)`` when all are staged
        already (resident in device DRAM), else None; never waits."""
        out = []
        for tok in tokens:
            try:
                _, length, off = self.device.view_info(cl.staged[tok][0], 0)
            except ChmError:  # WaitTimeout: still staging
                return None
            out.append((self.pool_base + off, length, tok))
        return out

    def _wait(self, cl: _Client, tokens: list[int], timeout: float) -> list[tuple[int, int, int]]:
        """Waits for prefetched tokens in order: ``[(pool addr, length, token)]``
        of the leading ones staged within ``timeout``; the rest are released."""
        out: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + timeout
        for tok in tokens:
            got = cl.staged.get(tok)
            if got is None:
                break
            try:
                _, length, off = self.device.view_info(
                    got[0], max(0.0, deadline - time.monotonic())
                )
            except ChmError:  # not staged in time, or a read error: the prefix ends here
                break
            out.append((self.pool_base + off, length, tok))
        for tok in tokens[len(out) :]:
            if tok in cl.staged:
                self._release_one(cl, tok)
        with self._lock:
            self.stats["staged"] += len(out)
        return out

    def _stage(
        self, cl: _Client, keys: list[bytes], checksums: list[int], timeout: float
    ) -> tuple[list[tuple[int, int, int]], str]:
        """:meth:`_prefetch` then :meth:`_wait`: ``([(pool addr, length, token)], why)``."""
        tokens, why = self._prefetch(cl, keys, checksums)
        out = self._wait(cl, tokens, timeout)
        return out, why if len(out) == len(tokens) else "error"

    def _commit(self, warr: np.ndarray[Any, Any], items: list[tuple[bytes, int, int]]) -> list[int]:
        for _, off, ln in items:
            if off < 0 or ln <= 0 or off + ln > self.write_area:
                raise InvalidArgument(None, f"commit: [{off}, +{ln}) is outside the write area")
        ks = _digests([k for k, _, _ in items])
        status = self.store.put(ks, [warr[off : off + ln] for _, off, ln in items])
        done = [j for j, s in enumerate(status) if s in (PutStatus.STORED, PutStatus.EXISTS)]
        if done:
            self.master.publish(self._entries(ks[done]))
        with self._lock:
            self.stats["committed"] += sum(s == PutStatus.STORED for s in status)
        return [int(s) for s in status]

    def close(self) -> None:
        """Stops serving: ends the lease (the node's entries stop being hits)
        and every client's connection (their slots, pins and write areas are
        given back)."""
        self._closing.set()
        self._lease.stop(deregister=True)
        with contextlib.suppress(OSError):  # wakes the accept loop, which then sees _closing
            socket.create_connection(self.address, timeout=1.0).close()
        self._thread.join(5)
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # ends each client's thread, which gives back what it held
            with contextlib.suppress(OSError):
                socket.socket(fileno=os.dup(conn.fileno())).shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with self._lock:
                if not self._conns:
                    break
            time.sleep(0.01)
        self.engine.unregister(self.pool_base)

    def __enter__(self) -> NodeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _NodeLink:
    """A worker's control connection to one node (request, then reply)."""

    def __init__(self, address: tuple[str, int], secret: bytes, timeout: float) -> None:
        self.timeout = timeout
        try:
            self.conn = Client(address, authkey=secret)
        except (OSError, EOFError) as exc:
            raise NodeGone(None, f"node at {address[0]}:{address[1]}: {exc}") from None
        except AuthenticationError as exc:  # the secret differs
            raise NodeGone(None, f"node at {address[0]}:{address[1]} refused: {exc}") from None
        self.lock = threading.Lock()
        self.broken = False
        self.info: dict[str, Any] = self.call(("hello",))

    def call(self, req: Any, timeout: float | None = None) -> Any:
        t = self.timeout if timeout is None else timeout
        with self.lock:
            if self.broken:
                raise NodeGone(None, "the node's control channel is closed")
            try:
                self.conn.send(req)
                if not self.conn.poll(t):
                    raise NodeGone(None, f"the node did not answer {req[0]!r} in {t:.3f} s")
                reply = self.conn.recv()
            except (OSError, EOFError) as exc:
                self.broken = True
                raise NodeGone(None, f"the node's control channel broke: {exc}") from None
            except NodeGone:
                self.broken = True  # a late reply would answer the next request
                raise
        if reply[0] == "err":
            raise ChmError(None, f"node: {reply[1]}: {reply[2]}")
        return reply[1]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()


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
        self.master, self.engine, self.secret, self.timeout = master, engine, secret, timeout
        self.buf = RegisteredBuffer(engine, buffer)
        self._links: dict[int, tuple[int, _NodeLink]] = {}
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
            "saved": 0,
            "skipped": 0,
        }

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    def _link(self, node: int, epoch: int | None = None) -> _NodeLink:
        with self._lock:
            got = self._links.get(node)
        if got is not None and not got[1].broken and (epoch is None or got[0] == epoch):
            return got[1]
        info = self.master.node(node)
        if epoch is not None and info.epoch != epoch:
            raise NodeGone(None, f"node {node} is at epoch {info.epoch}, not {epoch}")
        host, _, port = info.endpoints["control"].rpartition(":")
        link = _NodeLink((host, int(port)), self.secret, self.timeout)
        with self._lock:
            old = self._links.get(node)
            self._links[node] = (int(link.info["epoch"]), link)
        if old is not None:
            old[1].close()
        return link

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
        Never waits much past ``timeout``.
        """
        t = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + t
        ks = key_bytes(keys)
        if len(dsts) < len(ks):
            raise InvalidArgument(None, f"load: {len(ks)} keys but {len(dsts)} buffers")
        outs = [as_dst(d, f"buffer {j}") for j, d in enumerate(dsts[: len(ks)])]
        self._count("loads")
        hits = self.master.lookup(ks)
        if node is not None:
            mine = [h.node == node for h in hits]
            hits = hits[: mine.index(False)] if False in mine else hits
        self._count("hits", len(hits))
        done = 0
        while done < len(hits):
            node, epoch = hits[done].node, hits[done].epoch
            end = done
            while end < len(hits) and hits[end].node == node and hits[end].epoch == epoch:
                end += 1
            got = self._load_run(hits[done:end], outs[done:end], deadline)
            done += got
            if done < end:
                break
        self._count("loaded", done)
        return done

    def _load_run(self, ents: list[Entry], outs: list[Any], deadline: float) -> int:
        """Loads one node's run of entries: windows that fit the buffer and
        the node's free slots, each staged, read in one batch and released."""
        done = 0
        while done < len(ents):
            win, total = 0, 0
            while done + win < len(ents) and total + ents[done + win].length <= self.buf.nbytes:
                total += (ents[done + win].length + 63) & ~63
                win += 1
            if win == 0:
                return done  # a block larger than the whole buffer
            got, more = self._load_window(
                ents[done : done + win], outs[done : done + win], deadline
            )
            done += got
            if not more:
                break
        return done

    def _load_window(self, ents: list[Entry], outs: list[Any], deadline: float) -> tuple[int, bool]:
        """Loads a leading part of ``ents``: ``(how many, whether to go on)``.

        One round trip issues the node's prefetches for all of them (as many
        as it has free slots for); then in ``PIPELINE`` parts, each waited
        for, read in one batched transfer, released, verified and copied,
        while the node's device stages the parts after it (when the node
        answers that all are staged already, resident, the parts need no
        waits). A window under ``PIPELINE_BYTES`` is staged and waited for in one
        round trip and read in one part: two round trips to the node in all.
        """
        small = sum(e.length for e in ents) < PIPELINE_BYTES
        staged: list[tuple[int, int, int]] | None = None
        keys, sums = [e.key for e in ents], [e.checksum for e in ents]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._count("timeouts")
                return 0, False
            try:
                link = self._link(ents[0].node, ents[0].epoch)
                if small:
                    staged, why = link.call(("stage", keys, sums, left), timeout=left)
                    tokens = [t for _, _, t in staged]
                else:
                    tokens, why, staged = link.call(("prefetch", keys, sums), timeout=left)
            except (NodeGone, ChmError):
                self._count("node_errors")
                return 0, False
            if tokens or why != "busy":
                break
            self._count("busy")
            time.sleep(0.001)  # every slot is held (by other workers): ask again
        k = len(tokens)
        # parts, so each part's checksums and copies overlap the next part's
        # read; staged already (small, or all resident in the node's DRAM):
        # no wait round trips
        step = max(1, k) if small else max(1, -(-k // PIPELINE))
        parts: list[tuple[int, concurrent.futures.Future[int]]] = []
        whole = True  # every part so far was read in full
        for at in range(0, k, step):
            part = tokens[at : at + step]
            n_read, fut = self._load_part(
                link,
                part,
                ents[at : at + step],
                outs[at : at + step],
                deadline,
                None if staged is None else staged[at : at + step],
            )
            parts.append((len(part), fut))
            if n_read < len(part):
                whole = False
                rest = tokens[at + len(part) :]
                if rest:
                    with contextlib.suppress(NodeGone, ChmError):
                        link.call(("release", rest), timeout=max(0.05, deadline - time.monotonic()))
                break
        loaded = 0
        for want, fut in parts:  # every part's verify-and-copy ends before the load returns
            got = fut.result()
            if whole:
                loaded += got
                whole = got == want
        if not whole or loaded < k:
            return loaded, False
        return loaded, loaded > 0 and (k == len(ents) or why in ("all", "busy"))

    def _load_part(
        self,
        link: _NodeLink,
        tokens: list[int],
        ents: list[Entry],
        outs: list[Any],
        deadline: float,
        staged: list[tuple[int, int, int]] | None = None,
    ) -> tuple[int, concurrent.futures.Future[int]]:
        """Waits for, reads and releases one part; its checksums and copies run
        on a helper thread (while the next part is read). Returns how many
        blocks were read and the future of how many were loaded (``staged``:
        the part was staged and waited for already)."""
        if staged is None:
            try:
                left = max(0.001, deadline - time.monotonic())
                staged = link.call(("wait", tokens, left), timeout=left)
            except (NodeGone, ChmError):
                self._count("node_errors")
                return 0, _done(0)
        n = len(staged)
        offs: list[int] = []
        try:
            for (_, ln, _), e in zip(staged, ents, strict=False):
                if ln != e.length:
                    break
                offs.append(self.buf.take(ln))
        except ChmError:
            pass
        n = len(offs)
        ok = False
        if n:
            status = self.engine.read(
                link.info["data"],
                [self.buf.addr + o for o in offs],
                [a for a, _, _ in staged[:n]],
                [e.length for e in ents[:n]],
                timeout=max(deadline - time.monotonic(), 0.001),
                on_late=self._late(offs, ents[:n]),
            )
            ok = status == OK
            if status == TIMEOUT:
                self._count("timeouts")
                offs = []  # the late transfer gives its regions back
            elif not ok:
                self._count("node_errors")
        with contextlib.suppress(NodeGone, ChmError):
            link.call(("release", tokens), timeout=max(0.05, deadline - time.monotonic()))
        if not ok:
            for o, e in zip(offs, ents, strict=False):
                self.buf.give(o, e.length)
            return 0, _done(0)
        return n, self._post.submit(self._verify_copy, offs, ents[:n], outs[:n])

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
        self, request: object, keys: Any, srcs: Sequence[Any], *, node: int | None = None
    ) -> list[PutStatus]:
        """Writes blocks to the request's node (or to ``node``) and commits them:
        a status per key.

        Blocks that do not fit the write area in one go are committed in
        several; a node that fails makes the rest ERROR (never a hang).
        """
        ks = key_bytes(keys)
        if len(srcs) != len(ks):
            raise InvalidArgument(None, f"save: {len(ks)} keys but {len(srcs)} buffers")
        bufs = [as_src(s, f"buffer {j}") for j, s in enumerate(srcs)]
        out: list[PutStatus] = []
        try:
            link = self._link(self.place(request) if node is None else node)
        except (NodeGone, ChmError):
            self._count("node_errors")
            return [PutStatus.ERROR] * len(ks)
        waddr, wlen = link.info["write"]
        at = 0
        deadline = time.monotonic() + self.timeout
        while at < len(ks):
            win, total = 0, 0
            while at + win < len(ks) and total + bufs[at + win].size <= min(wlen, self.buf.nbytes):
                total += (bufs[at + win].size + 63) & ~63
                win += 1
            if win == 0:
                out.append(PutStatus.ERROR)  # larger than the write area
                at += 1
                continue
            st = self._save_window(link, waddr, ks[at : at + win], bufs[at : at + win], deadline)
            out.extend(st)
            at += win
            if PutStatus.ERROR in st:
                out.extend([PutStatus.ERROR] * (len(ks) - at))
                break
        self._count("saved", sum(s == PutStatus.STORED for s in out))
        self._count("skipped", sum(s == PutStatus.SKIPPED for s in out))
        return out

    def _save_window(
        self, link: _NodeLink, waddr: int, ks: list[bytes], bufs: list[Any], deadline: float
    ) -> list[PutStatus]:
        err = [PutStatus.ERROR] * len(ks)
        total = sum((b.size + 63) & ~63 for b in bufs)
        base = self.buf.take(total)
        offs, o = [], 0
        for b in bufs:
            self.buf.view(base + o, b.size)[:] = b
            offs.append(o)
            o += (b.size + 63) & ~63
        left = max(0.001, deadline - time.monotonic())
        status = self.engine.write(
            link.info["data"],
            [self.buf.addr + base + x for x in offs],
            [waddr + x for x in offs],
            [b.size for b in bufs],
            timeout=left,
            on_late=lambda: self.buf.quarantine(base, total),
        )
        if status == TIMEOUT:
            self._count("timeouts")
            return err
        self.buf.give(base, total)
        if status != OK:
            self._count("node_errors")
            return err
        try:
            st = link.call(
                ("commit", [(k, x, b.size) for k, x, b in zip(ks, offs, bufs, strict=True)]),
                timeout=max(0.001, deadline - time.monotonic()),
            )
        except (NodeGone, ChmError):
            self._count("node_errors")
            return err
        return [PutStatus(s) for s in st]

    def close(self) -> None:
        with self._lock:
            links = [lk for _, lk in self._links.values()]
            self._links.clear()
        for lk in links:
            lk.close()
        self._post.shutdown(wait=True)
        self.buf.close()

    def __enter__(self) -> RemoteTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m chm.remote.node``: one storage node, until SIGTERM or SIGINT.

    Prints one line ``ready {json}`` (node id, epoch, control address, data
    endpoint) on stdout once it serves.
    """
    import argparse
    import json
    import signal

    ap = argparse.ArgumentParser(prog="python -m chm.remote.node", description=main.__doc__)
    ap.add_argument("--master", required=True, help="redis://HOST:PORT/DB")
    ap.add_argument("--name", required=True, help="the node's name (stable across restarts)")
    ap.add_argument("--dir", required=True, help="the store's directory (kv.img, its journal)")
    ap.add_argument("--listen", default="127.0.0.1:0", help="control channel HOST:PORT")
    ap.add_argument("--secret-file", required=True, help="the shared secret (mode 0600)")
    ap.add_argument("--capacity", default="256M")
    ap.add_argument("--dram", default="64M")
    ap.add_argument("--slot-size", default="1M")
    ap.add_argument("--wbuf", default="4M", help="the device's write buffer (part of --dram)")
    ap.add_argument(
        "--resident",
        default="0",
        help="the device's resident region (part of --dram; 0: none): hot blocks stay in DRAM",
    )
    ap.add_argument("--backend", default="pread")
    ap.add_argument("--write-area", type=int, default=64 << 20)
    ap.add_argument("--lease", type=float, default=3.0)
    a = ap.parse_args(argv)
    host, _, port = a.listen.rpartition(":")
    try:
        secret = read_secret(a.secret_file)
        master = RedisMaster(a.master, lease=a.lease)
    except (ChmError, OSError) as exc:  # a clear error at start, not a traceback
        print(f"chm.remote.node: {exc.strerror or exc}", file=sys.stderr)
        return 1
    engine = Engine.get(host)
    store = Store.open(
        a.dir,
        capacity=a.capacity,
        dram=a.dram,
        slot_size=a.slot_size,
        backend=a.backend,
        device_options={
            "pool": "memfd",
            "wbuf": a.wbuf,
            **({"resident": a.resident} if a.resident not in ("0", "") else {}),
        },
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with NodeServer(
        store,
        master,
        a.name,
        engine=engine,
        listen=(host, int(port)),
        secret=secret,
        write_area=a.write_area,
    ) as node:
        ready = {
            "node": node.node,
            "epoch": node.epoch,
            "control": f"{node.address[0]}:{node.address[1]}",
            "data": engine.endpoint,
            "pid": os.getpid(),
        }
        print("ready", json.dumps(ready), flush=True)
        while not stop.wait(0.2):
            store.flush()
    store.close()
    master.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
