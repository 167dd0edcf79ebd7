"""A KV store over remote nodes: :class:`chm.kv.StoreLike` on a :class:`RemoteTier`.

    store = NodesStore.open("redis://10.0.0.1:6379/0", "/etc/chm/secret",
                            namespace=Namespace(model="m"), nodes=["node-a"])
    store.put(keys, blocks, meta)      # skip-not-stall, on one node per call
    store.load_prefix(keys, dsts, timeout=10)
    store.close()

What the serving adapters use of a store, for a worker fleet that shares one
tier (``chm.integrations._tier.open_tier`` with ``master``):

- **keys** are hashed in the store's :class:`~chm.kv.Namespace` (the
  engine's model and KV layout, as for the embedded store), so two models
  on one tier never share a block;
- **lookups** (``contains``, ``prefix_len``, ``entries``) ask the Master:
  a key is present while its node's lease holds the entry's epoch, so the
  blocks of a dead or restarted node are misses;
- **puts** go to one node per call: round-robin over the live nodes the
  configuration names (``nodes``; all live nodes the Master lists when it
  names none). Keys the Master already holds are EXISTS without a transfer;
  a full node write buffer (or this worker's put buffer, busy with
  another put) is SKIPPED, never waited for; puts and loads have a
  transfer buffer each, so neither takes the other's room; a node that fails is ERROR;
- **metadata** (``put(..., meta)``, at most ``MAX_META`` bytes a key) goes
  with the block in the same ``KV_PUT`` and lives in the node's store
  beside its entry (``Store.meta``), so one put is one block; ``meta``
  reads it with ``KV_ENTRIES`` from the node the Master names, and a key
  whose node does not answer, or holds other bytes under it now, answers
  None (a miss);
- **loads** are :meth:`RemoteTier.load`: the leading hits, byte-exact
  (XXH3-64 checked), a node that dies or stops answering turns its blocks
  into misses within the timeout;
- ``remove`` removes the blocks from the nodes that hold them
  (``KV_REMOVE``; each node unpublishes its own), then drops whatever
  entry still names that node and epoch; a key another client is loading
  is Busy, as on one daemon;
- ``flush`` is a barrier: it asks every node that took puts of this store
  (or holds blocks a put found there already: EXISTS) since its last flush
  to flush its own store (``KV_FLUSH``), side by side; when it returns,
  every put acknowledged before the call is durable on its node (found
  after the node is killed and restarted). A node that
  died or restarted since it took them raises NodeGone (the barrier cannot
  vouch for them); ``close`` flushes the same way first; each node also
  flushes on its own (``chm-emu serve --flush-interval``).
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from chm.errors import ChmError, InvalidArgument, NoSpace, NotFound
from chm.kv.buffers import as_dst
from chm.kv.keys import Namespace
from chm.kv.store import PutStatus, check_meta
from chm.remote.master import Entry, MasterUnreachable, RedisMaster, key_bytes
from chm.remote.node import NodeGone, RemoteTier
from chm.remote.protocol import read_secret
from chm.remote.transfer import Engine

__all__ = ["NodesStore", "check_master_url", "local_address", "open_secret"]

_SCHEMES = ("redis", "rediss", "unix")
_PLACE_EVERY = 1.0  # seconds a placement's view of the live nodes is reused


def check_master_url(url: object, option: str = "master") -> str:
    """``url`` when it is a Redis URL (``redis://HOST:PORT/DB``,
    ``rediss://``, ``unix://``), else InvalidArgument naming ``option``."""
    if not isinstance(url, str) or not url:
        raise InvalidArgument(None, f"{option}={url!r}: expected a URL such as redis://HOST:6379/0")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise InvalidArgument(None, f"{option}={url!r}: {exc}") from None
    if parts.scheme not in _SCHEMES:
        raise InvalidArgument(
            None, f"{option}={url!r}: expected a redis:// (or rediss://, unix://) URL"
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise InvalidArgument(None, f"{option}={url!r}: no host")
    return url


def open_secret(path: object, option: str = "secret_file") -> bytes:
    """The shared secret in ``path`` (:func:`chm.remote.protocol.read_secret`):
    NotFound when there is no such file, InvalidArgument when it is readable
    by others, empty or shorter than 16 bytes."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise InvalidArgument(
            None, f"{option}={path!r}: the file with the nodes' shared secret is required"
        )
    try:
        return read_secret(path)
    except FileNotFoundError:
        raise NotFound(None, f"{option}: no such file: {os.fspath(path)!r}") from None
    except PermissionError as exc:
        raise InvalidArgument(None, f"{option}: {os.fspath(path)!r}: {exc.strerror}") from None


def local_address(url: str) -> str:
    """This host's address on the route to the Master (what the nodes reach
    this worker's Transfer Engine at); 127.0.0.1 for a local or Unix Master."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host or parts.scheme == "unix":
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, parts.port or 6379))  # no packet: picks the route
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def _by_node(ents: Sequence[Entry | None], *, epoch: bool = False) -> list[tuple[Any, ...]]:
    """The indexes of the present entries grouped by node (by node and
    epoch with ``epoch``), each group as ``(node, [epoch,] indexes)``:
    the calls of :meth:`NodesStore._side_by_side`."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for j, e in enumerate(ents):
        if e is not None:
            groups.setdefault((e.node, e.epoch) if epoch else (e.node,), []).append(j)
    return [(*where, todo) for where, todo in groups.items()]


class NodesStore:
    """A :class:`chm.kv.StoreLike` over remote nodes and their Master (module doc).

    ``tier`` is the worker's :class:`RemoteTier` for loads, ``save_tier``
    (default: ``tier``) the one for puts: with two, a put's transfer buffer
    is never the one a load needs, so puts (the staging queue's thread) and
    loads (the engine's) do not take each other's room. ``nodes``: the node
    names puts may go to (None: every live node); ``timeout`` bounds each
    load and save. Thread-safe.
    """

    def __init__(
        self,
        tier: RemoteTier,
        master: RedisMaster,
        namespace: Namespace,
        *,
        save_tier: RemoteTier | None = None,
        nodes: Sequence[str] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.tier = tier
        self.save_tier = save_tier if save_tier is not None else tier
        self.master = master
        self.namespace = namespace
        self.nodes = list(nodes) if nodes is not None else None
        self.timeout = float(timeout)
        self.max_block = int(tier.buf.nbytes) // 2
        self._lock = threading.Lock()
        self._rr = 0
        self._live: tuple[float, list[int]] = (-1e18, [])
        self._closed = False
        # node -> the epoch it was at when it first took a put since its last
        # flush; and a count of puts per node, so a flush forgets only nodes
        # that took no put while it ran
        self._dirty: dict[int, int] = {}
        self._puts_to: dict[int, int] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="chm-nodes-get")
        self._c = dict.fromkeys(
            ("puts", "put_blocks", "exists_blocks", "skipped_blocks", "error_blocks", "no_node"),
            0,
        )

    @classmethod
    def open(
        cls,
        url: str,
        secret_file: str | os.PathLike[str],
        *,
        namespace: Namespace,
        nodes: Sequence[str] | None = None,
        host: str | None = None,
        buffer: int = 64 << 20,
        timeout: float = 10.0,
        master_timeout: float = 0.5,
    ) -> NodesStore:
        """Connects to the Master at ``url`` with the secret in ``secret_file``.

        Clear errors at start: InvalidArgument for a bad URL or an insecure
        secret file, NotFound for a missing one, MasterUnreachable (naming
        the URL) when Redis does not answer, NotFound when the Master lists
        no live node (or not every node of ``nodes``). ``host`` is this
        worker's address for the Transfer Engine (default: the local
        address on the route to the Master)."""
        check_master_url(url)
        secret = open_secret(secret_file)
        if nodes is not None:
            if isinstance(nodes, str):
                nodes = [n for n in nodes.split(",") if n]
            nodes = [str(n) for n in nodes]
            if not nodes:
                raise InvalidArgument(None, "nodes: an empty list (leave it out to use every node)")
        master = RedisMaster(url, timeout=master_timeout)
        try:
            known = {n.name: n for n in master.nodes()}
            if nodes is not None:
                gone = [n for n in nodes if n not in known]
                if gone:
                    raise NotFound(
                        None,
                        f"node(s) {gone} are not registered with the Master at {url} "
                        f"(registered: {sorted(known)})",
                    )
                dead = [n for n in nodes if not known[n].live]
                if len(dead) == len(nodes):
                    raise NotFound(None, f"none of the nodes {nodes} is live at the Master {url}")
            elif not any(n.live for n in known.values()):
                raise NotFound(
                    None,
                    f"no live node is registered with the Master at {url} "
                    "(start one: chm-emu serve --listen ... --master ... --node-name ...)",
                )
            engine = Engine.get(host or local_address(url))
            tier = RemoteTier(master, engine, secret, buffer=int(buffer), timeout=timeout)
            try:
                saves = RemoteTier(master, engine, secret, buffer=int(buffer), timeout=timeout)
            except BaseException:
                tier.close()
                raise
        except MasterUnreachable as exc:
            master.close()
            raise MasterUnreachable(
                None, f"the Master's Redis at {url} does not answer: {exc.strerror}"
            ) from None
        except BaseException:
            master.close()
            raise
        return cls(tier, master, namespace, save_tier=saves, nodes=nodes, timeout=timeout)

    # ---- keys

    def _keys(self, keys: Any) -> list[bytes]:
        if isinstance(keys, np.ndarray):
            return key_bytes(keys)  # KEY_DTYPE: digests already
        return key_bytes(self.namespace.keys(list(keys)))

    # ---- lookups

    def _entries(self, ks: list[bytes]) -> list[Entry | None]:
        return self.master.get(ks) if ks else []

    def contains(self, keys: Any) -> list[bool]:
        return [e is not None for e in self._entries(self._keys(keys))]

    def prefix_len(self, keys: Any) -> int:
        ks = self._keys(keys)
        return self.master.prefix_len(ks) if ks else 0

    def entries(self, keys: Any) -> list[dict[str, Any] | None]:
        return [
            None
            if e is None
            else {
                "node": e.node,
                "addr": e.addr,
                "length": e.length,
                "checksum": e.checksum,
                "epoch": e.epoch,
            }
            for e in self._entries(self._keys(keys))
        ]

    def info(self, key: Any) -> dict[str, Any] | None:
        return self.entries([key])[0]

    def pin(self, keys: Any) -> list[bool]:
        """Presence only: a node pins a block for as long as a load reads it."""
        return self.contains(keys)

    def unpin(self, keys: Any) -> None:
        return None

    def meta(self, keys: Any) -> list[bytes | None]:
        """Per key its metadata (b"": put without), None when absent or
        unreadable: asked of the node the Master names (``KV_ENTRIES``), nodes
        side by side; the node's entry must be the block the Master lists
        (same length and checksum)."""
        ks = self._keys(keys)
        if not ks:
            return []
        ents = self._entries(ks)
        out: list[bytes | None] = [None] * len(ks)

        def one(node: int, todo: list[int]) -> None:
            try:
                got = self.tier.entries(node, [ks[j] for j in todo], self.timeout)
            except ChmError:
                return  # the node does not answer: misses
            for j, g in zip(todo, got, strict=True):
                e = ents[j]
                if g is None or e is None or g["length"] != e.length:
                    continue
                if g["checksum"] == e.checksum:  # the very block the Master lists
                    out[j] = bytes(g["meta"] or b"")

        self._side_by_side(one, _by_node(ents))
        return out

    # ---- loads

    def load_prefix(self, keys: Any, dsts: Sequence[Any], timeout: float | None = None) -> int:
        ks = self._keys(keys)
        if len(dsts) < len(ks):
            raise InvalidArgument(None, f"load_prefix: {len(ks)} keys but {len(dsts)} buffers")
        if not ks:
            return 0
        return int(
            self.tier.load(ks, dsts[: len(ks)], self.timeout if timeout is None else timeout)
        )

    def get(self, keys: Any, dsts: Sequence[Any], timeout: float | None = None) -> list[bool]:
        """Per key whether it was loaded (no prefix semantics)."""
        ks = self._keys(keys)
        if len(dsts) != len(ks):
            raise InvalidArgument(None, f"get: {len(ks)} keys but {len(dsts)} buffers")
        return self._get(ks, dsts, self.timeout if timeout is None else timeout)

    def _get(self, ks: list[bytes], dsts: Sequence[Any], timeout: float) -> list[bool]:
        """Loads each hit; the keys of each node in order, the nodes side by
        side (a stopped node costs its own keys the timeout, not the others')."""
        out = [False] * len(ks)
        outs = [as_dst(d, f"buffer {j}") for j, d in enumerate(dsts)]
        ents = self._entries(ks)
        deadline = time.monotonic() + timeout

        def one(node: int, todo: list[int]) -> None:
            while todo:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                n = int(
                    self.tier.load([ks[j] for j in todo], [outs[j] for j in todo], left, node=node)
                )
                for j in todo[:n]:
                    out[j] = True
                todo = todo[n + 1 :]  # the one that ended the run is a miss; the rest go on

        self._side_by_side(one, _by_node(ents))
        return out

    # ---- puts

    def _place(self) -> int | None:
        """The node for the next put call: round-robin over the live nodes
        (of ``nodes``), None when there is none."""
        now = time.monotonic()
        with self._lock:
            at, live = self._live
        if now - at > _PLACE_EVERY or not live:
            try:
                infos = self.master.nodes()
            except MasterUnreachable:
                infos = []
            live = [
                n.node for n in infos if n.live and (self.nodes is None or n.name in self.nodes)
            ]
            with self._lock:
                self._live = (now, live)
        if not live:
            return None
        with self._lock:
            self._rr += 1
            return live[self._rr % len(live)]

    def put(
        self, keys: Any, srcs: Sequence[Any], meta: Sequence[bytes | None] | None = None
    ) -> list[PutStatus]:
        """Stores blocks (and their metadata) on one node: per key STORED,
        EXISTS, SKIPPED (no room now: offer it again) or ERROR (no live node,
        or the node failed)."""
        ks = self._keys(keys)
        if len(srcs) != len(ks):
            raise InvalidArgument(None, f"put: {len(ks)} keys but {len(srcs)} buffers")
        metas = check_meta(meta, len(ks))
        have = self._entries(ks)
        out = [PutStatus.EXISTS] * len(ks)
        todo = [j for j in range(len(ks)) if have[j] is None]
        for e in {(e.node, e.epoch) for e in have if e is not None}:
            self._took(*e)  # EXISTS: durable once its node flushed, whoever put it
        self._count("puts")
        if todo:
            node = self._place()
            if node is None:
                self._count("no_node")
                st = [PutStatus.ERROR] * len(todo)
            else:
                try:
                    st = self.save_tier.save(
                        None,
                        [ks[j] for j in todo],
                        [srcs[j] for j in todo],
                        node=node,
                        meta=[metas[j] for j in todo],
                    )
                except NoSpace:  # the put buffer is busy (another put call): not now
                    st = [PutStatus.SKIPPED] * len(todo)
                except (NodeGone, ChmError):
                    st = [PutStatus.ERROR] * len(todo)
                if PutStatus.STORED in st or PutStatus.EXISTS in st:
                    self._took(node)
            for j, x in zip(todo, st, strict=True):
                out[j] = PutStatus(x)
        for s in out:
            self._count(
                {
                    PutStatus.STORED: "put_blocks",
                    PutStatus.EXISTS: "exists_blocks",
                    PutStatus.SKIPPED: "skipped_blocks",
                }.get(s, "error_blocks")
            )
        return out

    def _took(self, node: int, epoch: int | None = None) -> None:
        """``node`` (at ``epoch``; default: the put connection's) holds a
        block a put of this store acknowledged: the next flush asks it."""
        if epoch is None:
            epoch = self.save_tier.epoch_of(node)
        with self._lock:
            if epoch is not None:
                self._dirty.setdefault(node, epoch)  # the oldest: a restart since is seen
            self._puts_to[node] = self._puts_to.get(node, 0) + 1

    def remove(self, keys: Any) -> list[bool]:
        """Removes ``keys`` from the nodes that hold them (the Master says
        which), nodes side by side: per key whether it was present. Busy
        when another client is loading one of a node's keys (that node
        keeps them; the other nodes' removes are done); NodeGone when a
        node does not answer (its keys stay). Entries of removed blocks
        leave the Master (the node unpublishes them; what still names that
        node and epoch is dropped here too)."""
        ks = self._keys(keys)
        if not ks:
            return []
        out = [False] * len(ks)

        def one(node: int, epoch: int, todo: list[int]) -> None:
            got = self.tier.remove(node, [ks[j] for j in todo])
            for j, g in zip(todo, got, strict=True):
                out[j] = g
            self.master.drop([ks[j] for j in todo], node, epoch)

        self._side_by_side(one, _by_node(self._entries(ks), epoch=True))
        return out

    def flush(self, timeout: float | None = None) -> None:
        """Every put this store had acknowledged before the call is durable
        on its node when this returns: each node that took puts since the
        last flush flushes its store (``KV_FLUSH``), the nodes side by side.
        Raises NodeGone for a node that died or restarted since it took
        them (or does not answer), WaitTimeout past ``timeout`` (None: no
        limit while the nodes answer), the node's error when its flush
        failed; the first of them, after every node was asked. A node that
        failed stays to be flushed, except one that restarted (asking it
        again cannot vouch for what it lost)."""
        with self._lock:
            todo = dict(self._dirty)
            seen = dict(self._puts_to)

        def one(node: int, epoch: int) -> None:
            try:
                self.save_tier.flush_node(node, timeout, epoch=epoch)
            except NodeGone:
                try:
                    now = self.master.node(node).epoch
                except ChmError:
                    now = epoch
                if now == epoch:
                    raise
                self._forget(node, epoch, seen.get(node, 0), force=True)
                raise NodeGone(
                    None,
                    f"flush: node {node} restarted (epoch {epoch} -> {now}) since it took "
                    "puts of this store; what it had not flushed may be lost",
                ) from None
            self._forget(node, epoch, seen.get(node, 0))

        self._side_by_side(one, list(todo.items()))

    def _side_by_side(self, one: Callable[..., None], calls: list[tuple[Any, ...]]) -> None:
        """``one(*args)`` for each node's ``args``, the nodes side by side (on
        the pool; a single one on this thread); once all have ended, the
        first exception raised, if any."""
        if len(calls) == 1:
            one(*calls[0])
            return
        futs = [self._pool.submit(one, *args) for args in calls]
        for exc in [f.exception() for f in futs]:
            if exc is not None:
                raise exc

    def _forget(self, node: int, epoch: int, puts: int, *, force: bool = False) -> None:
        """A flushed node leaves the dirty set unless it took a put since
        the flush began (``force``: its restart was reported)."""
        with self._lock:
            if self._dirty.get(node) == epoch and (force or self._puts_to.get(node) == puts):
                del self._dirty[node]

    # ---- stats and lifecycle

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._c[name] += n

    def stats(self) -> dict[str, Any]:
        """This store's counters, the worker's (``remote_*``: loads, hits,
        node errors, timeouts, checksum failures) and the Master client's
        (``master_*``)."""
        with self._lock:
            out: dict[str, Any] = dict(self._c)
        remote = dict(self.tier.stats)
        if self.save_tier is not self.tier:
            for k, v in dict(self.save_tier.stats).items():
                remote[k] = remote.get(k, 0) + v
        out.update({f"remote_{k}": v for k, v in remote.items()})
        out.update({f"master_{k}": v for k, v in dict(self.master.stats).items()})
        return out

    @property
    def reports_staging(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, *, flush: bool = True) -> None:
        """Flushes (``flush``: every node that took puts since the last
        flush, within the store's timeout) and closes; idempotent. A flush
        that fails is raised after everything is closed, as a Store's."""
        if self._closed:
            return
        try:
            if flush:
                self.flush(self.timeout)
        finally:
            self._closed = True
            self._pool.shutdown(wait=True)
            try:
                self.tier.close()
                if self.save_tier is not self.tier:
                    self.save_tier.close()
            finally:
                self.master.close()

    def __enter__(self) -> NodesStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
