"""An LRU set of block keys with a capacity in blocks."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["LruBlocks"]


class LruBlocks:
    """Block keys in recency order; the least recently used go first.

    ``capacity`` is in blocks (0: holds nothing). ``evictions`` counts the
    keys pushed out. With ``evict=False`` a full set refuses new keys
    instead (a store that fails when full, as Redis does under its default
    ``maxmemory-policy noeviction``): ``store_failures`` counts them, and a
    refused block leaves a hole that ends every later prefix at it.
    """

    def __init__(self, capacity: int, *, evict: bool = True) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 blocks, got {capacity}")
        self.capacity = capacity
        self.evict = evict
        self.evictions = 0
        self.store_failures = 0
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def prefix_len(self, keys: Sequence[bytes], start: int = 0) -> int:
        """How many of ``keys[start:]`` are held before the first one that is not."""
        n = 0
        for k in keys[start:]:
            if k not in self._keys:
                break
            n += 1
        return n

    def access(self, keys: Sequence[bytes]) -> None:
        """Makes each key the most recent in turn, inserting it if absent."""
        if not self.capacity:
            return
        d = self._keys
        for k in keys:
            if k in d:
                d.move_to_end(k)
            elif not self.evict and len(d) >= self.capacity:
                self.store_failures += 1
            else:
                d[k] = None
                if len(d) > self.capacity:
                    d.popitem(last=False)
                    self.evictions += 1
