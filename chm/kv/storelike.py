"""``StoreLike``: the KV store API that the embedded and the daemon's store share.

:class:`chm.kv.Store` (on a device of this process),
:class:`chm.remote.RemoteStore` (the daemon's shared store, ``dev.kv()``)
and :class:`chm.remote.tierstore.NodesStore` (remote nodes and their
Master) satisfy it, so code written against it runs on any of them;
``tests/integration/test_like_protocols.py`` runs one suite against all three.
Their ``stats()`` differ (a :class:`~chm.kv.StoreStats` embedded, the
daemon's ``kv`` counters or the remote tier's as a dict) and are not part of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from chm.kv.store import PutStatus

__all__ = ["StoreLike"]


@runtime_checkable
class StoreLike(Protocol):
    """Put, look up, load, remove and flush fixed-size blocks by key."""

    def contains(self, keys: Any) -> list[bool]: ...

    def prefix_len(self, keys: Any) -> int: ...

    def put(
        self, keys: Any, srcs: Sequence[Any], meta: Sequence[bytes | None] | None = None
    ) -> list[PutStatus]: ...

    def get(self, keys: Any, dsts: Sequence[Any], timeout: float | None = None) -> list[bool]: ...

    def load_prefix(self, keys: Any, dsts: Sequence[Any], timeout: float | None = None) -> int: ...

    def entries(self, keys: Any) -> list[dict[str, Any] | None]: ...

    def meta(self, keys: Any) -> list[bytes | None]: ...

    def remove(self, keys: Any) -> list[bool]: ...

    def flush(self, timeout: float | None = None) -> None: ...
