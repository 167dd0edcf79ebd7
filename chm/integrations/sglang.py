"""chm as an SGLang HiCache storage backend (written against ``sglang==0.5.23``).

SGLang's hierarchical cache (``--enable-hierarchical-cache``) backs its
host-memory KV pool with a storage tier; this module is one, loaded by
SGLang's ``dynamic`` backend (no fork, no patch):

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "chm",
        "module_path": "chm.integrations.sglang", "class_name": "ChmHiCacheStorage",
        "path": "/var/lib/chm/sglang", "capacity": "1T", "slot_size": "32M"}'

Extra-config keys besides the three SGLang reads: ``path`` (required),
``capacity``, ``dram``, ``wbuf``, ``slot_size`` (at least one page of KV),
``backend``, ``get_timeout_s``, ``flush_interval_s`` (default 1: a page
SGLang has set is durable, and found after a crash, within about that long;
HiCache has no flush call of its own).

SGLang calls these from its prefetch and backup threads, never from the
scheduler, so they return when the data has moved. Keys are SGLang's page
hashes (strings), hashed to 16 bytes in the namespace of the model, its
tensor-parallel rank (0 for MLA models, whose KV every rank shares) and
pipeline stage. ``batch_get`` reads the pages through one
:meth:`chm.kv.Store.get`, so the store prefetches them in order through its
staging window; ``batch_set`` is one :meth:`~chm.kv.Store.put`, which never
stalls: a page the write buffer skips is reported as not stored.

SGLang 0.5.23 calls, for a ``dynamic`` backend: ``batch_exists`` (the prefix
of pages present), and either the copying ``batch_get`` / ``batch_set``
(into and out of flat page tensors it allocates) or, with
``"interface_v1": 1`` in the extra config, the zero-copy ``batch_get_v1`` /
``batch_set_v1`` with host-pool indices. Those move each page's parts (the
buffers ``HostKVCache.get_page_buffer_meta`` names: K and V, or one per layer
and K/V) straight between the host pool and the store, each part a block
keyed by the page hash and its part number; a page is present when all its
parts are. The v2 calls (``batch_*_v2``) serve sidecar pools (Mamba states
and the like) of hybrid models and are not implemented: SGLang only makes
them for models that have such pools.
"""

from __future__ import annotations

from typing import Any

from chm.integrations import require

require("sglang", "sglang", "chm.integrations.sglang")

import ctypes  # noqa: E402

import numpy as np  # noqa: E402
import xxhash  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from chm.errors import InvalidArgument  # noqa: E402
from chm.kv import Namespace, PutStatus, Store  # noqa: E402

__all__ = ["ChmHiCacheStorage"]

_KEYS = (
    "path",
    "capacity",
    "dram",
    "wbuf",
    "slot_size",
    "backend",
    "get_timeout_s",
    "flush_interval_s",
)
_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")


def _seconds(extra: dict[str, Any], name: str, default: float) -> float:
    try:
        return float(extra.get(name, default))
    except (TypeError, ValueError):
        raise InvalidArgument(
            None, f"ChmHiCacheStorage: {name}={extra[name]!r} is no number"
        ) from None


def _arange(n: int) -> Any:
    import torch

    return torch.arange(n, dtype=torch.int64)


def _digest(key: str) -> bytes:
    if not isinstance(key, str) or not key:
        raise InvalidArgument(None, f"HiCache key {key!r:.60}: expected a non-empty str")
    return xxhash.xxh3_128_digest(key.encode())


class ChmHiCacheStorage(HiCacheStorage):  # type: ignore[misc]
    """An SGLang HiCache storage backend on a :class:`chm.kv.Store`."""

    def __init__(
        self,
        storage_config: HiCacheStorageConfig,
        kwargs: dict[str, Any] | None = None,
        *,
        store: Store | None = None,
    ) -> None:
        extra = dict(storage_config.extra_config or {})
        unknown = sorted(set(extra) - set(_KEYS) - set(_SGLANG_KEYS))
        if unknown:
            raise InvalidArgument(
                None, f"ChmHiCacheStorage: unknown extra-config key(s) {unknown}; known: {_KEYS}"
            )
        self.zero_copy = bool(extra.get("interface_v1"))
        self._parts = 1  # blocks per page (interface_v1: the host pool's buffers per page)
        self.get_timeout = _seconds(extra, "get_timeout_s", 10.0)
        if store is None:
            if not extra.get("path"):
                raise InvalidArgument(
                    None,
                    "ChmHiCacheStorage: extra-config 'path' (the store's directory) is required",
                )
            model = (storage_config.model_name or "sglang").replace("@", "_")
            if storage_config.pp_size > 1:
                model += f"#pp{storage_config.pp_rank}of{storage_config.pp_size}"
            rank = 0 if storage_config.is_mla_model else storage_config.tp_rank
            store = Store.open(
                extra["path"],
                capacity=extra.get("capacity", "64G"),
                dram=extra.get("dram"),
                slot_size=extra.get("slot_size", "32M"),
                backend=extra.get("backend", "auto"),
                device_options={"wbuf": extra["wbuf"]} if "wbuf" in extra else None,
                namespace=Namespace(model=model, tp_rank=rank),
                flush_interval=_seconds(extra, "flush_interval_s", 1.0),
            )
        self.store = store

    # ---- zero copy (interface_v1): pages as parts of the host pool

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        if self.zero_copy:
            ps = int(mem_pool_host.page_size)
            meta = mem_pool_host.get_page_buffer_meta(_arange(ps))
            if not meta or not meta[0]:
                raise InvalidArgument(
                    None,
                    f"ChmHiCacheStorage: interface_v1 needs a host pool that names its page "
                    f"buffers ({type(mem_pool_host).__name__}.get_page_buffer_meta gave none)",
                )
            self._parts = len(meta[0])

    def _part_keys(self, keys: list[str]) -> list[bytes]:
        """Digests of every part of every page, page by page (part 0 is the page's
        own key, so batch_exists and the copying calls see the same pages)."""
        out = []
        for k in keys:
            out.append(_digest(k))
            out += [_digest(f"{k}\0{j}") for j in range(1, self._parts)]
        return out

    def _views(self, keys: list[str], host_indices: Any) -> list[np.ndarray[Any, Any]]:
        pool = getattr(self, "mem_pool_host", None)
        if pool is None:
            raise InvalidArgument(
                None, "ChmHiCacheStorage: interface_v1 call before register_mem_pool_host"
            )
        if len(host_indices) != len(keys) * int(pool.page_size):
            raise InvalidArgument(
                None,
                f"ChmHiCacheStorage: {len(host_indices)} host indices for {len(keys)} pages "
                f"of {pool.page_size} tokens",
            )
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if len(ptrs) != len(keys) * self._parts:
            raise InvalidArgument(
                None, f"ChmHiCacheStorage: {len(ptrs)} page buffers for {len(keys)} pages"
            )
        return [
            np.ctypeslib.as_array((ctypes.c_uint8 * int(n)).from_address(int(p)))
            for p, n in zip(ptrs, sizes, strict=True)
        ]

    def _per_page(self, ok: list[bool], pages: int) -> list[bool]:
        m = self._parts
        return [all(ok[i * m : (i + 1) * m]) for i in range(pages)]

    def batch_get_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Reads each page's parts into the host pool, in place; per page whether it loaded."""
        got = self.store.get(
            self._part_keys(keys), self._views(keys, host_indices), self.get_timeout
        )
        return self._per_page(got, len(keys))

    def batch_set_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Writes each page's parts from the host pool; per page whether it is stored."""
        st = self.store.put(self._part_keys(keys), self._views(keys, host_indices))
        return self._per_page([s in (PutStatus.STORED, PutStatus.EXISTS) for s in st], len(keys))

    # ---- the copying interface

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        if target_location is None:
            raise InvalidArgument(None, "ChmHiCacheStorage.get: a target_location is required")
        ok = self.store.get([_digest(key)], [target_location], self.get_timeout)
        return target_location if ok[0] else None

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[Any]:
        if target_locations is None or len(target_locations) != len(keys):
            raise InvalidArgument(
                None, "ChmHiCacheStorage.batch_get: one target_location per key is required"
            )
        ok = self.store.get([_digest(k) for k in keys], list(target_locations), self.get_timeout)
        return [t if o else None for t, o in zip(target_locations, ok, strict=True)]

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        if values is None or len(values) != len(keys):
            raise InvalidArgument(
                None, "ChmHiCacheStorage.batch_set: one value per key is required"
            )
        st = self.store.put([_digest(k) for k in keys], [v.contiguous() for v in values])
        return all(s in (PutStatus.STORED, PutStatus.EXISTS) for s in st)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        if self._parts == 1:
            return self.store.prefix_len([_digest(k) for k in keys])
        return self.store.prefix_len(self._part_keys(keys)) // self._parts

    def clear(self) -> None:
        """Removes nothing: the store's segments are reclaimed oldest first when full."""

    def close(self) -> None:
        """Flushes and closes the store (SGLang has no shutdown hook; call it at exit)."""
        self.store.close()
