"""``DeviceLike``: the part of a device the KV layer uses.

Everything in :mod:`chm.kv` is written against these two protocols, which
``chm.Device`` and its ``chm.Handle`` satisfy today; a daemon client that
offers the same calls runs the KV layer unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from chm.config import Config
from chm.errors import ChmError
from chm.stats import Stats

__all__ = ["DeviceLike", "HandleLike"]


@runtime_checkable
class HandleLike(Protocol):
    """One issued prefetch (``chm.Handle``)."""

    token: int

    def wait(self, timeout: float | None = None) -> memoryview: ...

    def release(self) -> None: ...

    @property
    def released(self) -> bool: ...


@runtime_checkable
class DeviceLike(Protocol):
    """A chm device: issue-wait-release prefetch, reads, writes, flush, stats."""

    def prefetch(
        self, addr: int, length: int, *, noqueue: bool = False, retain: bool = False
    ) -> Any: ...

    def read(self, addr: int, length: int) -> bytes: ...

    def read_into(self, addr: int, buf: Any) -> int: ...

    def write(self, addr: int, data: Any) -> bool: ...

    def write_length(self, addr: int, length: int) -> bool: ...

    def write_many(self, addrs: Sequence[int], datas: Sequence[Any]) -> list[bool | ChmError]: ...

    def flush(self, timeout: float | None = None) -> None: ...

    def stats(self) -> Stats: ...

    @property
    def config(self) -> Config: ...

    @property
    def capacity(self) -> int: ...

    @property
    def slot_bytes(self) -> int: ...

    def close(self) -> None: ...
