"""The Master on Redis: key -> <node, addr, len, checksum, epoch> for several nodes.

One host keeps the embedded index (:class:`chm.kv.index.Index`); when
several storage nodes share a tier their entries live in one Redis database
(Debian's ``redis-server``, the ``redis`` Python client), under a key prefix
(``chm:`` by default):

- ``<p>e`` — a hash: field = the 16-byte key (big-endian digest), value = the
  entry, 64 bytes packed as ``ENTRY`` (``<QQQQQQQII``: key hi, key lo,
  addr, length, checksum, node epoch, put sequence, node id, flags).
- ``<p>ids`` / ``<p>nextid`` — node name -> node id (u32, stable across
  restarts); ``<p>epoch:<id>`` — the node's epoch counter, bumped by every
  :meth:`RedisMaster.register`; ``<p>node:<id>`` — the node's name, epoch and
  endpoints (a hash).
- ``<p>lease:<id>`` — the node's live epoch (8 bytes) with a TTL
  (``lease`` seconds), renewed by :meth:`RedisMaster.renew` while the node
  runs; renewing with an older epoch fails, so a node that restarted
  cannot be revived by its predecessor.

An entry is a **hit** only while its node's lease holds the entry's epoch:
entries of a node whose lease expired (it died) or whose epoch moved on (it
restarted) are never served, and a restarted node re-publishes what it
flushed under its new epoch. :meth:`RedisMaster.lookup` asks at most
``LOOKUP_BATCH`` (32) keys per round trip (one server-side script doing the
gets and the lease checks), with prefix semantics: the answer stops at the
first miss, and a longer key list goes on in further round trips only while
every key so far hit; ``on_hits`` is called with each round's hits as soon
as they are known (the early hit: the caller issues those prefetches while
the next round is asked).

Redis unreachable: the constructor raises :class:`MasterUnreachable` (a
clear error at start); afterwards a lookup that cannot reach Redis returns
no hits (a miss, counted in ``stats["errors"]``) within ``timeout`` seconds
instead of hanging, a publish returns False, and the next call after Redis
is back works again (the client reconnects).
"""

from __future__ import annotations

import errno
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chm.errors import ChmError, InvalidArgument, NotFound
from chm.kv.keys import KEY_BYTES, KEY_DTYPE

__all__ = [
    "ENTRY",
    "ENTRY_BYTES",
    "LOOKUP_BATCH",
    "Entry",
    "MasterUnreachable",
    "NodeInfo",
    "Lease",
    "RedisMaster",
    "key_bytes",
]

LOOKUP_BATCH = 32
_UPDATE_STEP = 4096  # dropped blocks per script call of RedisMaster.update
ENTRY = struct.Struct("<QQQQQQQII")
ENTRY_BYTES = ENTRY.size
assert ENTRY_BYTES == 64
_EPOCH_AT = 40  # byte offset of the node epoch in ENTRY
_NODE_AT = 56  # byte offset of the node id
_WIRE = np.dtype([("hi", ">u8"), ("lo", ">u8")])
# RedisMaster.renew_status
RENEWED, SUPERSEDED, UNKNOWN, UNREACHABLE = 1, 0, -1, -2

# KEYS[1] = entries hash, KEYS[2] = lease key prefix; ARGV = 16-byte keys.
# Returns the leading entries whose node lease holds their epoch, stopping
# at the first absent or stale one (prefix semantics), and as its last item
# how many were stale.
_LOOKUP = """
local leases = {}
local out = {}
for i = 1, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if not v then break end
  local node = string.sub(v, 57, 60)
  local live = leases[node]
  if live == nil then
    live = redis.call('GET', KEYS[2] .. node) or false
    leases[node] = live
  end
  if live ~= string.sub(v, 41, 48) then
    out[#out + 1] = 'stale'
    return out
  end
  out[#out + 1] = v
end
return out
"""

# The same checks for every key, no prefix: per key its entry or false.
_CONTAINS = """
local leases = {}
local out = {}
for i = 1, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  local hit = false
  if v then
    local node = string.sub(v, 57, 60)
    local live = leases[node]
    if live == nil then
      live = redis.call('GET', KEYS[2] .. node) or false
      leases[node] = live
    end
    if live == string.sub(v, 41, 48) then hit = v end
  end
  out[i] = hit
end
return out
"""

# KEYS[1] = entries hash; ARGV = node id (4 bytes), node epoch (8 bytes, or
# empty: any), then 16-byte keys. Deletes each key's entry only while it
# still names that node (and epoch); returns how many it deleted.
_DROP = """
local n = 0
for i = 3, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v and string.sub(v, 57, 60) == ARGV[1]
      and (ARGV[2] == '' or string.sub(v, 41, 48) == ARGV[2]) then
    redis.call('HDEL', KEYS[1], ARGV[i])
    n = n + 1
  end
end
return n
"""

# KEYS[1] = entries hash; ARGV = node id (4 bytes), node epoch (8 bytes),
# how many blocks to drop, then per block to drop its 16-byte key and its
# put sequence (8 bytes) joined, then per entry to publish its 16-byte key
# and its 64 bytes joined. Deletes each dropped block's entry only while it
# is still that very block (node, epoch and sequence), then sets the
# published entries; returns how many it deleted.
_UPDATE = """
local n = 0
local last = 3 + tonumber(ARGV[3])
for i = 4, last do
  local k = string.sub(ARGV[i], 1, 16)
  local v = redis.call('HGET', KEYS[1], k)
  if v and string.sub(v, 57, 60) == ARGV[1] and string.sub(v, 41, 48) == ARGV[2]
      and string.sub(v, 49, 56) == string.sub(ARGV[i], 17, 24) then
    redis.call('HDEL', KEYS[1], k)
    n = n + 1
  end
end
for i = last + 1, #ARGV do
  redis.call('HSET', KEYS[1], string.sub(ARGV[i], 1, 16), string.sub(ARGV[i], 17))
end
return n
"""

# KEYS[1] = lease key, KEYS[2] = epoch counter; ARGV = epoch (8 bytes), ttl ms.
_RENEW = """
local cur = redis.call('GET', KEYS[2])
if not cur then return -1 end
if tonumber(cur) ~= tonumber(ARGV[3]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


class MasterUnreachable(ChmError, ConnectionError):
    """ECONNREFUSED: the Master's Redis does not answer (at start)."""

    default_errno = errno.ECONNREFUSED


@dataclass(frozen=True)
class Entry:
    """Where one block lives: node id and epoch, device address, length, checksum."""

    key: bytes
    node: int
    addr: int
    length: int
    checksum: int
    epoch: int
    seq: int = 0
    flags: int = 0

    def pack(self) -> bytes:
        hi, lo = struct.unpack(">QQ", self.key)
        return ENTRY.pack(
            hi,
            lo,
            self.addr,
            self.length,
            self.checksum,
            self.epoch,
            self.seq,
            self.node,
            self.flags,
        )

    @classmethod
    def unpack(cls, raw: bytes) -> Entry:
        if len(raw) != ENTRY_BYTES:
            raise InvalidArgument(None, f"an entry is {ENTRY_BYTES} bytes, not {len(raw)}")
        hi, lo, addr, length, checksum, epoch, seq, node, flags = ENTRY.unpack(raw)
        return cls(struct.pack(">QQ", hi, lo), node, addr, length, checksum, epoch, seq, flags)


@dataclass(frozen=True)
class NodeInfo:
    """A registered node as the Master sees it now."""

    node: int
    name: str
    epoch: int
    live: bool  # its lease holds its epoch
    lease_ms: int  # milliseconds left on the lease (-2: none)
    endpoints: dict[str, str]


def key_bytes(keys: Any) -> list[bytes]:
    """16-byte keys from a KEY_DTYPE array (Namespace.keys()) or a list of 16-byte bytes."""
    if isinstance(keys, np.ndarray):
        if keys.dtype != KEY_DTYPE:
            raise InvalidArgument(None, "master keys: a KEY_DTYPE array or 16-byte bytes")
        raw = keys.reshape(-1).astype(_WIRE).tobytes()
        return [raw[i : i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES)]
    out = []
    for k in keys:
        if not isinstance(k, (bytes, bytearray, memoryview)) or len(k) != KEY_BYTES:
            raise InvalidArgument(None, f"master key {k!r}: expected {KEY_BYTES} bytes")
        out.append(bytes(k))
    return out


def _redis() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - the 'remote' extra is missing
        raise NotFound(
            None, "the Master on Redis needs the 'redis' package (pip install chm[remote])"
        ) from exc
    return redis


class RedisMaster:
    """The global index on Redis (see the module docstring).

    ``url`` is ``redis://HOST:PORT/DB``; ``timeout`` bounds every round trip
    (seconds; a lookup that cannot finish in it is a miss); ``lease`` is the
    node lease in seconds. Thread-safe (redis-py's pool).
    """

    def __init__(
        self, url: str, *, prefix: str = "chm:", timeout: float = 0.5, lease: float = 3.0
    ) -> None:
        redis = _redis()
        if lease <= 0 or timeout <= 0:
            raise InvalidArgument(None, f"lease={lease}, timeout={timeout}: both must be > 0")
        self.url = url
        self.prefix = prefix.encode()
        self.timeout = float(timeout)
        self.lease = float(lease)
        self._errors_cls: tuple[type[BaseException], ...] = (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
        )
        try:
            self._r = redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry_on_timeout=False,
                health_check_interval=0,
            )
        except ValueError as exc:
            raise InvalidArgument(None, f"master url {url!r}: {exc}") from None
        self._lookup = self._r.register_script(_LOOKUP)
        self._contains = self._r.register_script(_CONTAINS)
        self._renew = self._r.register_script(_RENEW)
        self._drop = self._r.register_script(_DROP)
        self._update = self._r.register_script(_UPDATE)
        self._lock = threading.Lock()
        self.stats: dict[str, int] = {
            "lookups": 0,
            "round_trips": 0,
            "hits": 0,
            "stale": 0,
            "errors": 0,
            "published": 0,
        }
        try:
            self._r.ping()
        except self._errors_cls as exc:
            raise MasterUnreachable(
                None, f"the Master's Redis at {url} does not answer: {exc}"
            ) from None

    # ---- helpers

    def _k(self, *parts: bytes | str) -> bytes:
        return self.prefix + b"".join(p.encode() if isinstance(p, str) else p for p in parts)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    # ---- nodes

    def register(self, name: str, endpoints: dict[str, str] | None = None) -> tuple[int, int]:
        """Registers node ``name`` (a restart): returns ``(node id, new epoch)``.

        The epoch is one more than any epoch the node had before, so every
        entry it published earlier stops being a hit until it publishes it
        again; the lease starts now. Raises MasterUnreachable when Redis is down.
        """
        if not name or not isinstance(name, str):
            raise InvalidArgument(None, f"node name {name!r}: expected non-empty text")
        try:
            nid = self._r.hget(self._k("ids"), name)
            if nid is None:
                new = int(self._r.incr(self._k("nextid")))
                self._r.hsetnx(self._k("ids"), name, new)
                nid = self._r.hget(self._k("ids"), name)
            node = int(nid)
            epoch = int(self._r.incr(self._k(f"epoch:{node}")))
            info = {"name": name, "epoch": str(epoch), **(endpoints or {})}
            pipe = self._r.pipeline()
            pipe.delete(self._k(f"node:{node}"))
            pipe.hset(self._k(f"node:{node}"), mapping=info)
            pipe.set(self._lease_key(node), struct.pack("<Q", epoch), px=int(self.lease * 1000))
            pipe.execute()
        except self._errors_cls as exc:
            raise MasterUnreachable(None, f"register {name}: the Master's Redis: {exc}") from None
        return node, epoch

    def _lease_key(self, node: int) -> bytes:
        return self._k("lease:", struct.pack("<I", node))

    def renew(self, node: int, epoch: int) -> bool:
        """Extends the node's lease; False when Redis is down or the node has a newer epoch."""
        return self.renew_status(node, epoch) == RENEWED

    def renew_status(self, node: int, epoch: int) -> int:
        """Extends the node's lease: ``RENEWED``; ``SUPERSEDED`` (the node
        registered again since: a newer epoch); ``UNKNOWN`` (Redis no longer
        knows the node: it lost its data, so the node must register again);
        ``UNREACHABLE``."""
        try:
            rc = self._renew(
                keys=[self._lease_key(node), self._k(f"epoch:{node}")],
                args=[struct.pack("<Q", epoch), int(self.lease * 1000), epoch],
            )
        except self._errors_cls:
            self._count("errors")
            return UNREACHABLE
        return int(rc)

    def deregister(self, node: int, epoch: int) -> None:
        """Ends the node's lease now (a clean shutdown): its entries stop being hits."""
        try:
            if self._r.get(self._lease_key(node)) == struct.pack("<Q", epoch):
                self._r.delete(self._lease_key(node))
        except self._errors_cls:
            self._count("errors")

    def nodes(self) -> list[NodeInfo]:
        """Every node ever registered, with its epoch, liveness and lease time left
        (MasterUnreachable when Redis does not answer)."""
        try:
            return self._nodes()
        except self._errors_cls as exc:
            self._count("errors")
            raise MasterUnreachable(None, f"nodes: the Master's Redis: {exc}") from None

    def _nodes(self) -> list[NodeInfo]:
        out = []
        for name, nid in sorted(self._r.hgetall(self._k("ids")).items(), key=lambda kv: int(kv[1])):
            node = int(nid)
            info = {
                k.decode(): v.decode() for k, v in self._r.hgetall(self._k(f"node:{node}")).items()
            }
            epoch = int(info.pop("epoch", 0))
            info.pop("name", None)
            lease = self._r.get(self._lease_key(node))
            live = lease is not None and struct.unpack("<Q", lease)[0] == epoch
            out.append(
                NodeInfo(
                    node, name.decode(), epoch, live, int(self._r.pttl(self._lease_key(node))), info
                )
            )
        return out

    def node(self, node: int) -> NodeInfo:
        """One node by id, in one round trip (NotFound when it never
        registered; MasterUnreachable when Redis does not answer)."""
        try:
            pipe = self._r.pipeline(transaction=False)
            pipe.hgetall(self._k(f"node:{node}"))
            pipe.get(self._lease_key(node))
            pipe.pttl(self._lease_key(node))
            raw, lease, ttl = pipe.execute()
        except self._errors_cls as exc:
            self._count("errors")
            raise MasterUnreachable(None, f"node {node}: the Master's Redis: {exc}") from None
        if not raw:
            raise NotFound(None, f"node {node} is not registered with the Master")
        info = {k.decode(): v.decode() for k, v in raw.items()}
        epoch = int(info.pop("epoch", 0))
        name = info.pop("name", "")
        live = lease is not None and struct.unpack("<Q", lease)[0] == epoch
        return NodeInfo(node, name, epoch, live, int(ttl), info)

    # ---- entries

    def publish(self, entries: Sequence[Entry]) -> bool:
        """Adds or replaces entries (one round trip); False when Redis is down."""
        if not entries:
            return True
        try:
            self._r.hset(self._k("e"), mapping={e.key: e.pack() for e in entries})
        except self._errors_cls:
            self._count("errors")
            return False
        self._count("published", len(entries))
        return True

    def remove(self, keys: Any) -> bool:
        """Deletes entries (one round trip); False when Redis is down."""
        ks = key_bytes(keys)
        if not ks:
            return True
        try:
            self._r.hdel(self._k("e"), *ks)
        except self._errors_cls:
            self._count("errors")
            return False
        return True

    def drop(self, keys: Any, node: int, epoch: int | None = None) -> int:
        """Deletes the entries of ``keys`` that still name ``node`` (and
        ``epoch``, if given), in one round trip: a block a node removed or
        evicted stops being a hit without touching an entry another node (or
        a later epoch) published since. Returns how many; 0 when Redis is down."""
        ks = key_bytes(keys)
        if not ks:
            return 0
        args = [struct.pack("<I", node), b"" if epoch is None else struct.pack("<Q", epoch), *ks]
        try:
            return int(self._drop(keys=[self._k("e")], args=args))
        except self._errors_cls:
            self._count("errors")
            return 0

    def update(
        self,
        node: int,
        epoch: int,
        publish: Sequence[Entry] = (),
        gone: Sequence[tuple[bytes, int]] = (),
    ) -> int | None:
        """A node's changes in one round trip: first deletes the entries of
        the blocks in ``gone`` (``(key, put sequence)``) while they still
        name that very block (this node, ``epoch``, that sequence: a later
        put of the key, here or elsewhere, is left alone), then adds or
        replaces ``publish`` (one round trip per 4,096 blocks dropped).
        Returns how many entries it deleted, None when Redis is down (a part
        may have changed: sending the same again is harmless)."""
        if not gone:
            return 0 if self.publish(publish) else None
        n = 0
        for at in range(0, len(gone), _UPDATE_STEP):  # one script call per step
            part = gone[at : at + _UPDATE_STEP]
            last = at + _UPDATE_STEP >= len(gone)
            args: list[bytes | int] = [struct.pack("<I", node), struct.pack("<Q", epoch), len(part)]
            args += [k + struct.pack("<Q", seq) for k, seq in part]
            if last:
                args += [e.key + e.pack() for e in publish]
            try:
                n += int(self._update(keys=[self._k("e")], args=args))
            except self._errors_cls:
                self._count("errors")
                return None
        self._count("published", len(publish))
        return n

    def lookup(
        self,
        keys: Any,
        on_hits: Callable[[list[Entry]], None] | None = None,
        *,
        batch: int = LOOKUP_BATCH,
    ) -> list[Entry]:
        """The leading hits of ``keys`` (prefix semantics), ``batch`` keys per round trip.

        A key is a hit when its entry exists and its node's lease holds the
        entry's epoch; the answer stops at the first key that is not. When
        Redis does not answer within ``timeout`` the hits found so far are
        returned (a miss from there on), never an exception.
        """
        if not 1 <= batch <= LOOKUP_BATCH:
            raise InvalidArgument(None, f"lookup batch={batch}: expected 1..{LOOKUP_BATCH}")
        ks = key_bytes(keys)
        self._count("lookups")
        hits: list[Entry] = []
        for at in range(0, len(ks), batch):
            part = ks[at : at + batch]
            try:
                raw = self._lookup(keys=[self._k("e"), self._k("lease:")], args=part)
            except self._errors_cls:
                self._count("errors")
                break
            self._count("round_trips")
            stale = bool(raw) and raw[-1] == b"stale"
            got = [Entry.unpack(v) for v in (raw[:-1] if stale else raw)]
            if stale:
                self._count("stale")
            hits.extend(got)
            if got and on_hits is not None:
                on_hits(got)
            if len(got) < len(part):
                break
        self._count("hits", len(hits))
        return hits

    def get(self, keys: Any) -> list[Entry | None]:
        """Per key its live entry or None (no prefix semantics), ``LOOKUP_BATCH``
        keys per round trip; None for the rest when Redis does not answer."""
        ks = key_bytes(keys)
        out: list[Entry | None] = []
        for at in range(0, len(ks), LOOKUP_BATCH):
            part = ks[at : at + LOOKUP_BATCH]
            try:
                raw = self._contains(keys=[self._k("e"), self._k("lease:")], args=part)
            except self._errors_cls:
                self._count("errors")
                return out + [None] * (len(ks) - len(out))
            self._count("round_trips")
            out.extend(Entry.unpack(v) if v else None for v in raw)
        return out

    def prefix_len(self, keys: Any) -> int:
        return len(self.lookup(keys))

    def entries_of(self, node: int) -> Iterable[Entry]:
        """Every entry published by ``node`` (any epoch): a scan, for tools and tests."""
        for _, v in self._r.hscan_iter(self._k("e"), count=1000):
            e = Entry.unpack(v)
            if e.node == node:
                yield e

    def flushdb(self) -> None:
        """Drops every key under this Master's prefix (tests and benchmarks)."""
        for k in self._r.scan_iter(match=self.prefix + b"*", count=1000):
            self._r.delete(k)

    def close(self) -> None:
        self._r.close()

    def __enter__(self) -> RedisMaster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Lease:
    """A thread that renews a node's lease every ``lease / 3`` seconds until stopped.

    ``on_lost_master`` is called (on the lease thread) when Redis answers
    again after it was unreachable or no longer knows this node (it
    restarted without its data); it returns the node's ``(node, epoch)``
    to renew from then on (e.g. after registering and re-publishing). When
    a newer epoch of the node took over, ``lost`` is set and renewing stops.
    """

    def __init__(
        self,
        master: RedisMaster,
        node: int,
        epoch: int,
        on_lost_master: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.master, self.node, self.epoch = master, node, epoch
        self.on_lost_master = on_lost_master
        self.lost = False  # a newer epoch took over: this node must stop serving
        self.recoveries = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name=f"chm-lease-{node}", daemon=True)
        self._t.start()

    def _run(self) -> None:
        step = self.master.lease / 3
        down = False
        while not self._stop.wait(step):
            rc = self.master.renew_status(self.node, self.epoch)
            if rc == UNREACHABLE:
                down = True  # renew again when it is back
                continue
            if rc == SUPERSEDED:
                self.lost = True
                return
            if (rc == UNKNOWN or down) and self.on_lost_master is not None:
                try:
                    self.node, self.epoch = self.on_lost_master()
                except ChmError:
                    down = True
                    continue
                self.recoveries += 1
            down = False

    def stop(self, deregister: bool = True) -> None:
        self._stop.set()
        self._t.join()
        if deregister:
            self.master.deregister(self.node, self.epoch)
