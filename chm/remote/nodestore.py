"""One remote node as a store, so :class:`chm.kv.AddressSpace` places across nodes.

    tier = RemoteTier(master, Engine.get(host), secret)
    space = AddressSpace([NodeStore(tier, n.node) for n in master.nodes() if n.live])
    space.save("req-1", keys, srcs)        # the whole request on one node, in order
    space.load("req-1", keys, dsts)        # the leading hits, from whichever node holds them

:class:`NodeStore` gives :class:`chm.kv.AddressSpace` what it calls on a
store (``contains``, ``prefix_len``, ``put``, ``load_prefix``, ``stats``,
``flush``: the node's own flush, ``close``), over a
:class:`chm.remote.node.RemoteTier` and one node id, so request-level
placement (round-robin or least-outstanding) is
the same code for local devices and remote nodes. Keys are engine keys in
``namespace`` (as for a local :class:`chm.kv.Store`). A node error counts
in ``stats().io_errors``, which takes the node out of the address space.
Closing a NodeStore does not close the shared tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chm.kv.keys import Namespace
from chm.kv.lookup import prefix_hits
from chm.kv.store import PutStatus
from chm.remote.node import RemoteTier

__all__ = ["NodeStore", "NodeStoreStats"]


@dataclass(frozen=True)
class NodeStoreStats:
    """What AddressSpace reads of a store's stats."""

    io_errors: int


class NodeStore:
    """One node of a RemoteTier behind the store calls AddressSpace makes."""

    def __init__(self, tier: RemoteTier, node: int, namespace: Namespace | None = None) -> None:
        self.tier = tier
        self.node = int(node)
        self.namespace = namespace or Namespace()
        self._errors = 0

    def _keys(self, keys: Any) -> np.ndarray[Any, Any]:
        return self.namespace.keys(keys)

    def _track(self) -> tuple[int, int]:
        s = self.tier.stats
        return s["node_errors"], s["timeouts"]

    def contains(self, keys: Any) -> list[bool]:
        """Per key whether this node holds it now (a live entry of its epoch)."""
        return [
            e is not None and e.node == self.node for e in self.tier.master.get(self._keys(keys))
        ]

    def prefix_len(self, keys: Any) -> int:
        return prefix_hits(np.asarray(self.contains(keys), dtype=bool))

    def put(self, keys: Any, srcs: Sequence[Any]) -> list[PutStatus]:
        before = self._track()
        out = self.tier.save(None, self._keys(keys), srcs, node=self.node)
        if self._track()[0] > before[0]:
            self._errors += 1
        return out

    def load_prefix(
        self, keys: Any, dsts: Sequence[Any], timeout: float | None = None, request: object = None
    ) -> int:
        """The leading hits on this node, loaded into ``dsts``; how many."""
        before = self._track()
        n = self.tier.load(self._keys(keys), dsts, timeout, node=self.node)
        if self._track()[0] > before[0]:
            self._errors += 1
        return n

    def stats(self) -> NodeStoreStats:
        return NodeStoreStats(io_errors=self._errors)

    def flush(self, timeout: float | None = None) -> None:
        """Makes every block the node holds durable there (``KV_FLUSH``):
        what was put before the call survives a crash of the node. NodeGone
        (which takes the node out of an AddressSpace) when it does not
        answer; WaitTimeout past ``timeout``."""
        self.tier.flush_node(self.node, timeout)

    def close(self) -> None:
        """The tier is shared by every NodeStore of it: closed by its owner."""
