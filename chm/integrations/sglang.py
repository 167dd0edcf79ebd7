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
"""

from __future__ import annotations

from typing import Any

from chm.integrations import require

require("sglang", "sglang", "chm.integrations.sglang")

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
        if extra.get("interface_v1"):
            raise InvalidArgument(
                None, "ChmHiCacheStorage: interface_v1 (zero-copy host indices) is not supported"
            )
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
        return bool(self.store.contains([_digest(key)])[0])

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        return self.store.prefix_len([_digest(k) for k in keys])

    def clear(self) -> None:
        """Removes nothing: the store's segments are reclaimed oldest first when full."""

    def close(self) -> None:
        """Flushes and closes the store (SGLang has no shutdown hook; call it at exit)."""
        self.store.close()
