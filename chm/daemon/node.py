"""The daemon as a remote storage node (``chm-emu serve --listen ... --master ...``).

A daemon started with a Master serves its KV store to workers on other
hosts over its own protocol (the TCP front end, :mod:`chm.daemon.tcp`), and
lets them move the blocks' bytes with Mooncake Transfer Engine instead of
in-band:

- its DRAM pool (the memfd the daemon already maps) is registered with the
  process's Transfer Engine, so a worker reads a staged object straight out
  of device DRAM with one-sided reads; each TCP client's shared area is
  registered too, so a worker writes the blocks of a KV_PUT into it;
- it registers with the Master (:class:`chm.remote.master.RedisMaster`) under
  its name, with a new epoch on every start and a lease the
  :class:`~chm.remote.master.Lease` thread renews; a clean shutdown ends
  the lease, so its entries stop being hits at once;
- every block a client puts (STORED or EXISTS) is published under the
  current epoch; on start, and whenever Redis comes back without this
  node, everything the store holds is published again. Puts never wait on
  a Redis that does not answer: after a publish found it down they skip
  publishing for a second, and the first publish that works again
  re-publishes everything. A block the store evicts to make room (or drops
  as corrupt, or after a failed flush) leaves the Master in the same round
  trip as the put's publish (:meth:`Store.take_drops`,
  :meth:`RedisMaster.update`: only while the entry is still that very
  block), a removed or condemned block in the remove's
  (:meth:`Store.remove_seqs`); with Redis skipped or down both wait (at
  most ``_GONE_MAX``) for the next publish that works. A stale entry that
  still gets through (more waiting than that, or a node killed before it
  told Redis) is dropped by the first worker that asks for it: the node
  answers it absent, and the worker drops the entry if it still names this
  node and epoch (:meth:`RedisMaster.drop`).

A TCP client's WELCOME carries ``transfer`` (the engine's endpoint, the
pool's and this client's area's addresses and sizes) and ``node`` (id,
epoch, name): ``fw_spec/protocol.md``, "TCP".
"""

from __future__ import annotations

import contextlib
import mmap
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from chm.errors import ChmError
from chm.kv.keys import KEY_DTYPE
from chm.kv.store import PutStatus
from chm.remote.master import Entry, Lease, RedisMaster, key_bytes

if TYPE_CHECKING:
    from chm.remote.transfer import Engine

    from .options import Host

__all__ = ["DaemonNode"]

_PUBLISH_STEP = 4096  # entries in one publish round trip at a republish
_RETRY = 1.0  # seconds puts skip publishing after a publish found Redis down
_GONE_MAX = 1 << 16  # dropped blocks kept for unpublishing while Redis is skipped


class DaemonNode:
    """The node part of a daemon (module docstring).

    ``master`` is the Master's ``redis://HOST:PORT/N``; ``name`` the node's
    stable name; ``data_host`` the address the Transfer Engine listens on
    (what workers reach); ``control`` the ``HOST:PORT`` workers dial for the
    daemon protocol. Raises MasterUnreachable when Redis does not answer.
    """

    def __init__(
        self,
        daemon: Host,
        master: str,
        name: str,
        *,
        data_host: str,
        control: str,
        lease: float = 3.0,
    ) -> None:
        from chm.remote.transfer import Engine

        self.d = daemon
        self.name = name
        self.control = control
        self.master = RedisMaster(master, lease=lease)
        self._lock = threading.Lock()
        self._areas: dict[int, np.ndarray[Any, Any]] = {}
        self.counts = {
            "published": 0,
            "unpublished": 0,
            "evicted_unpublished": 0,
            "publish_errors": 0,
            "publish_skipped": 0,
        }
        self._down_at: float | None = None  # when a publish last found Redis down
        self._back = False
        self._gone: list[tuple[bytes, int]] = []  # (key, put seq) to unpublish, waiting
        if daemon.store is not None:
            daemon.store.watch_drops(_GONE_MAX)
        try:
            self.engine: Engine = Engine.get(data_host)
            self._pool = mmap.mmap(
                daemon.pool_ro_fd, daemon.pool_bytes, mmap.MAP_SHARED, mmap.PROT_READ
            )
            self._pool_arr = np.frombuffer(self._pool, dtype=np.uint8)
            self.pool_addr = int(self._pool_arr.ctypes.data)
            self.engine.register(self.pool_addr, daemon.pool_bytes)
            self._endpoints = {"data": self.engine.endpoint, "control": control}
            self.node, self.epoch = self.master.register(name, self._endpoints)
        except BaseException:
            self.master.close()
            raise
        self._lease = Lease(self.master, self.node, self.epoch, self._master_back)
        self.republish()

    # ---- what TCP clients are told

    def attach(self, area: mmap.mmap) -> tuple[int, dict[str, Any]]:
        """Registers a TCP client's area with the engine: ``(its address,
        the WELCOME fields transfer and node)``."""
        arr = np.frombuffer(area, dtype=np.uint8)
        addr = int(arr.ctypes.data)
        self.engine.register(addr, len(area))
        with self._lock:
            self._areas[addr] = arr
        return addr, {
            "transfer": {
                "engine": self.engine.endpoint,
                "protocol": self.engine.protocol,
                "pool_addr": self.pool_addr,
                "pool_bytes": self.d.pool_bytes,
                "area_addr": addr,
                "area_bytes": len(area),
            },
            "node": {"id": self.node, "epoch": self.epoch, "name": self.name},
        }

    def detach(self, addr: int) -> None:
        """Unregisters a gone client's area (before the front end unmaps it)."""
        self.engine.unregister(addr)
        with self._lock:
            self._areas.pop(addr, None)

    # ---- the Master

    def _entries(self, ks: np.ndarray[Any, Any]) -> list[Entry]:
        store = self.d.store
        if store is None:
            return []
        out = []
        for k, e in zip(key_bytes(ks), store.entries(ks), strict=True):
            if e is not None:
                out.append(
                    Entry(
                        k, self.node, e["addr"], e["length"], e["checksum"], self.epoch, e["epoch"]
                    )
                )
        return out

    def _publish(self, ents: list[Entry]) -> bool:
        ok = self.master.publish(ents)
        with self._lock:
            self.counts["published" if ok else "publish_errors"] += len(ents) if ok else 1
        return ok

    def _master_down(self) -> bool:
        """Whether a recent publish found Redis down: puts then skip
        publishing (they must not wait a Redis timeout each) until
        ``_RETRY`` seconds have passed; the next publish that works
        re-publishes everything, on a thread of its own."""
        with self._lock:
            since = self._down_at
            if since is None:
                return False
            if time.monotonic() - since < _RETRY:
                self.counts["publish_skipped"] += 1
                return True
            self._down_at = None  # this put tries again
            self._back = True
            return False

    def _published(self, ok: bool) -> None:
        with self._lock:
            if not ok:
                self._down_at = time.monotonic()
                return
            back, self._back = self._back, False
        if back:  # Redis answers again: what was skipped meanwhile goes in too
            threading.Thread(target=self._republish_quietly, daemon=True).start()

    def _republish_quietly(self) -> None:
        with contextlib.suppress(ChmError):
            self.republish()

    def _take_gone(self) -> list[tuple[bytes, int]]:
        """The blocks the store dropped since the last call, with those
        still waiting to be unpublished (emptied: the caller puts back what
        it could not send)."""
        store = self.d.store
        got = store.take_drops() if store is not None else None
        with self._lock:
            gone, self._gone = self._gone, []
        if got is not None and got.size:
            ks = np.empty(got.size, dtype=KEY_DTYPE)
            ks["hi"], ks["lo"] = got["hi"], got["lo"]
            gone += zip(key_bytes(ks), got["epoch"].tolist(), strict=True)
        return gone

    def _keep_gone(self, gone: list[tuple[bytes, int]]) -> None:
        """Puts back blocks not unpublished yet (the newest ``_GONE_MAX``)."""
        if gone:
            with self._lock:
                self._gone = (gone + self._gone)[-_GONE_MAX:]

    def stored(self, ks: np.ndarray[Any, Any], status: list[PutStatus] | list[int]) -> None:
        """Publishes the blocks a put stored (or found stored already) and,
        in the same round trip, unpublishes those the store dropped
        meanwhile (the put's evictions)."""
        done = [j for j, s in enumerate(status) if s in (PutStatus.STORED, PutStatus.EXISTS)]
        gone = self._take_gone()
        if done or gone:
            self._send(ks[done], gone)

    def _send(
        self, ks: np.ndarray[Any, Any], gone: list[tuple[bytes, int]], *, evicted: bool = True
    ) -> None:
        """Publishes the blocks of ``ks`` and unpublishes ``gone``, unless
        Redis is skipped (or this node superseded): then ``gone`` waits."""
        if self._lease.lost or self._master_down():
            self._keep_gone(gone)
            return
        ents = self._entries(ks) if ks.size else []
        self._published(self._update(ents, gone, evicted=evicted))

    def _update(
        self, ents: list[Entry], gone: list[tuple[bytes, int]], *, evicted: bool = True
    ) -> bool:
        """Publishes ``ents`` and unpublishes the dropped blocks ``gone`` in
        one Master call, counted (``evicted``: as the store's own drops,
        with any removes that waited among them); what it could not send
        waits for the next."""
        n = self.master.update(self.node, self.epoch, ents, gone)
        with self._lock:
            if n is None:
                self.counts["publish_errors"] += 1
            else:
                self.counts["published"] += len(ents)
                self.counts["unpublished"] += n
                if evicted:
                    self.counts["evicted_unpublished"] += n
        if n is None:
            self._keep_gone(gone)
        return n is not None

    def removed(self, ks: np.ndarray[Any, Any], seqs: list[int | None]) -> None:
        """Unpublishes the blocks a remove dropped (``Store.remove_seqs``:
        each key's put sequence), exactly those blocks, so a later put of
        the key is left alone; with Redis skipped or down they wait with
        the evictions for the next publish that works."""
        gone = [(k, s) for k, s in zip(key_bytes(ks), seqs, strict=True) if s is not None]
        if gone:
            self._send(ks[:0], gone, evicted=False)

    def republish(self) -> int:
        """Publishes every block the store holds under this epoch; returns how many."""
        store = self.d.store
        if store is None:
            return 0
        idx = store._index  # the store's rows: keys of every block it holds
        live = idx.e[idx.e["state"] != 0]
        ks = np.empty(live.shape[0], dtype=KEY_DTYPE)
        ks["hi"], ks["lo"] = live["hi"], live["lo"]
        n = 0
        for at in range(0, ks.size, _PUBLISH_STEP):
            ents = self._entries(ks[at : at + _PUBLISH_STEP])
            self._publish(ents)
            n += len(ents)
        gone = self._take_gone()  # what was dropped while Redis was skipped
        if gone:
            self._update([], gone)
        return n

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

    # ---- health

    def health(self) -> dict[str, Any]:
        """The node as its operator sees it (the ``node`` group of STATS and
        the ``chm_node_*`` metrics): Master reachable, id, epoch, lease
        time left, entries published, TCP clients, bytes staged for them."""
        try:
            info = self.master.node(self.node)
            reachable, lease_ms = True, info.lease_ms if info.epoch == self.epoch else 0
        except ChmError:
            reachable, lease_ms = False, 0
        with self._lock:
            counts = dict(self.counts)
            areas = len(self._areas)
        return {
            "name": self.name,
            "id": self.node,
            "epoch": self.epoch,
            "master_reachable": int(reachable),
            "lease_remaining_s": round(max(lease_ms, 0) / 1000.0, 3),
            "superseded": int(self._lease.lost),
            "master_recoveries": self._lease.recoveries,
            "tcp_clients": areas,
            "entries_published": counts["published"],
            "entries_unpublished": counts["unpublished"],
            "entries_evicted_unpublished": counts["evicted_unpublished"],
            "publish_errors": counts["publish_errors"],
            "publish_skipped": counts["publish_skipped"],
            "engine": self.engine.endpoint,
            **{f"engine_{k}": v for k, v in self.engine.stats.items()},
        }

    def close(self) -> None:
        """Ends the lease (the node's entries stop being hits) and unregisters the pool."""
        self._lease.stop(deregister=True)
        with contextlib.suppress(ChmError):
            self.engine.unregister(self.pool_addr)
        self.master.close()
