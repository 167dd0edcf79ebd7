"""The KV layer: a persistent KV-block store over chm devices.

:class:`Store` (index, segment allocator, journal, checksums over one
device), :class:`Lookup` (prefix lookup with early prefetch), the prefetch
windows of :mod:`chm.kv.window`, :class:`Connector` for serving code and
:class:`AddressSpace` over several devices. Everything is written against
:class:`DeviceLike`.
"""

from __future__ import annotations

from chm.kv.connector import MODELS, Connector, ConnectorStats, block_bytes
from chm.kv.keys import KEY_DTYPE, Namespace
from chm.kv.lookup import LOOKUP_BATCH, Lookup
from chm.kv.protocol import DeviceLike, HandleLike
from chm.kv.space import PLACEMENTS, AddressSpace
from chm.kv.store import MAX_META, PutStatus, Store, StoreStats
from chm.kv.storelike import StoreLike
from chm.kv.tickets import Ticket
from chm.kv.window import WINDOW_BYTES, KVManager, SlidingWindow, fair_shares, w_max

__all__ = [
    "KEY_DTYPE",
    "LOOKUP_BATCH",
    "MAX_META",
    "MODELS",
    "PLACEMENTS",
    "WINDOW_BYTES",
    "AddressSpace",
    "Connector",
    "ConnectorStats",
    "DeviceLike",
    "HandleLike",
    "KVManager",
    "Lookup",
    "Namespace",
    "PutStatus",
    "SlidingWindow",
    "Store",
    "StoreLike",
    "StoreStats",
    "Ticket",
    "block_bytes",
    "fair_shares",
    "w_max",
]
