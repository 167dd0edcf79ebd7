"""chm as an SGLang HiCache storage backend (written against ``sglang==0.5.23``).

SGLang's hierarchical cache (``--enable-hierarchical-cache``) backs its
host-memory KV pool with a storage tier; this module is one, loaded by
SGLang's ``dynamic`` backend (no fork, no patch):

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "chm",
        "module_path": "chm.integrations.sglang", "class_name": "ChmHiCacheStorage",
        "path": "/var/lib/chm/sglang", "capacity": "1T", "interface_v1": 1}'

Extra-config keys besides those SGLang reads: ``path`` (an embedded store,
this process only), ``socket`` (a ``chm-emu serve`` daemon every rank and
replica of the node shares) or ``master`` (remote storage nodes' Master,
``redis://HOST:PORT/DB``, every worker of a fleet shares; with
``secret_file``, ``nodes``, ``host`` and ``remote_buffer`` as in
:mod:`chm.integrations._tier`), ``capacity`` (refused when the filesystem has
less free space, unless ``sparse_overcommit`` is true), ``dram``, ``wbuf``
(default: ``batch`` pages of the host pool SGLang registers; SGLang's
``dynamic`` factory passes no page size to the constructor, so an embedded
store opened without ``wbuf`` is reopened once, at ``register_mem_pool_host``,
with the write buffer sized from the pool's page; with ``socket`` the write
buffer is the daemon's, ``chm-emu serve --wbuf``), ``batch`` (pages per store call, 64),
``staging`` (the host staging queue, 1G), ``slot_size`` (at least one page
part), ``per_rank_dir`` (``path/rank<tp_rank>`` per rank), ``backend``,
``get_timeout_s``, ``flush_interval_s`` (default 1: a page SGLang has set is
durable, and found after a crash, within about that long; HiCache has no
flush call of its own; 0: only at close).

Keys: SGLang's page hashes (strings) hashed to 16 bytes in a namespace of
the model, tensor-parallel size and rank (rank 0 for MLA models, whose KV
every rank shares), pipeline stage, DP and context-parallel ranks and the
page layout, and, once SGLang registers its host pool, the pool's dtype,
page size and KV geometry (layers, heads, head size): another model,
dtype, page size or layout on the same tier misses.

SGLang calls these from its prefetch and backup threads, never from the
scheduler, so they return when the data has moved. Loads are one
:meth:`chm.kv.Store.get` over the pages in order (the store prefetches them
through its staging window). Stores go through the tier's host staging
queue (:class:`chm.kv.staging.StagingQueue`) and wait for it: a batch larger
than the write buffer is written as the flusher drains it, never skipped for
its size; a page is reported not stored only when the queue is full
(counted in :meth:`stats`, logged at WARNING).

The calls, for a ``dynamic`` backend: ``batch_exists`` (the prefix of pages
present); the copying ``batch_get`` / ``batch_set`` (into and out of flat
page tensors); with ``"interface_v1": 1`` the zero-copy ``batch_get_v1`` /
``batch_set_v1`` with host-pool indices, which move each page's parts (the
buffers ``HostKVCache.get_page_buffer_meta`` names: K and V, or one per
layer and K/V) straight between the host pool and the store, each part a
block; and the hybrid-model calls ``batch_exists_v2`` / ``batch_get_v2`` /
``batch_set_v2`` with the pools SGLang registers through
``register_mem_host_pool_v2`` (Mamba states, SWA and other sidecar pools),
each pool's parts keyed by the pool's name, the page hash and the part.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from chm.integrations import require

require("sglang", "sglang", "chm.integrations.sglang")

import numpy as np  # noqa: E402
import xxhash  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolTransfer,
    PoolTransferResult,
)

from chm.errors import InvalidArgument  # noqa: E402
from chm.integrations._tier import Tier, TierOptions, default_wbuf, open_tier  # noqa: E402
from chm.kv import Namespace, PutStatus  # noqa: E402

__all__ = ["ChmHiCacheStorage", "namespace_of"]

logger = logging.getLogger(__name__)

_KEYS = (
    "path",
    "socket",
    "capacity",
    "sparse_overcommit",
    "dram",
    "wbuf",
    "batch",
    "staging",
    "slot_size",
    "per_rank_dir",
    "backend",
    "get_timeout_s",
    "flush_interval_s",
    "master",
    "nodes",
    "secret_file",
    "host",
    "remote_buffer",
)
_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")
_KV = "kv"


def _seconds(extra: dict[str, Any], name: str, default: float) -> float:
    try:
        v = float(extra.get(name, default))
    except (TypeError, ValueError):
        raise InvalidArgument(
            None, f"ChmHiCacheStorage: {name}={extra[name]!r} is no number"
        ) from None
    if v < 0:
        raise InvalidArgument(None, f"ChmHiCacheStorage: {name}={v} must be >= 0")
    return v


def _flag(extra: dict[str, Any], name: str) -> bool:
    v = extra.get(name, False)
    if isinstance(v, bool) or v in (0, 1):
        return bool(v)
    text = str(v).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise InvalidArgument(None, f"ChmHiCacheStorage: {name}={v!r} is not a boolean")


def _arange(n: int) -> Any:
    import torch

    return torch.arange(n, dtype=torch.int64)


def _text(value: object) -> str:
    return str(value).replace("@", "_").replace("\0", "_") or "_"


def namespace_of(cfg: HiCacheStorageConfig) -> Namespace:
    """The key namespace of an SGLang rank (see the module doc)."""
    mla = bool(cfg.is_mla_model)
    parts = [_text(cfg.model_name or "sglang"), f"tp{cfg.tp_size}"]
    if cfg.pp_size > 1:
        parts.append(f"pp{cfg.pp_rank}of{cfg.pp_size}")
    if getattr(cfg, "dp_rank", 0):
        parts.append(f"dp{cfg.dp_rank}")
    if cfg.attn_cp_size > 1:
        parts.append(f"cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}")
    if getattr(cfg, "dcp_size", 1) > 1:
        parts.append(f"dcp{cfg.dcp_rank}of{cfg.dcp_size}")
    if getattr(cfg, "should_split_heads", False):
        parts.append(f"split{cfg.tp_lcm_size}")
    parts.append("mla" if mla else "mha")
    parts.append("pagefirst" if cfg.is_page_first_layout else "layerfirst")
    return Namespace(model="#".join(parts), dtype="kv", tp_rank=0 if mla else int(cfg.tp_rank))


def _pool_layout(pool: Any) -> str:
    """A host pool's byte format: its class, dtype, page size, layout and geometry."""
    fields = [type(pool).__name__]
    for name in ("dtype", "page_size", "layout", "layer_num", "head_num", "head_dim"):
        v = getattr(pool, name, None)
        if v is not None:
            fields.append(f"{name}={str(v).removeprefix('torch.')}")
    return ",".join(fields)


class ChmHiCacheStorage(HiCacheStorage):  # type: ignore[misc]
    """An SGLang HiCache storage backend on a chm KV store (see the module doc)."""

    def __init__(
        self,
        storage_config: HiCacheStorageConfig,
        kwargs: dict[str, Any] | None = None,
        *,
        tier: Tier | None = None,
    ) -> None:
        extra = dict(storage_config.extra_config or {})
        unknown = sorted(set(extra) - set(_KEYS) - set(_SGLANG_KEYS))
        if unknown:
            raise InvalidArgument(
                None, f"ChmHiCacheStorage: unknown extra-config key(s) {unknown}; known: {_KEYS}"
            )
        self.zero_copy = _flag(extra, "interface_v1")
        self._parts: dict[str, int] = {_KV: 1}  # blocks per page, per pool
        self._pools: dict[str, Any] = {}
        self._layout = "nopool"  # the KV host pool's format, once registered
        self.get_timeout = _seconds(extra, "get_timeout_s", 10.0)
        flush = _seconds(extra, "flush_interval_s", 1.0)
        self.namespace = namespace_of(storage_config)
        if tier is None:
            if sum(bool(extra.get(k)) for k in ("path", "socket", "master")) != 1:
                raise InvalidArgument(
                    None,
                    "ChmHiCacheStorage: one of extra-config 'path' (an embedded store's "
                    "directory), 'socket' (a chm-emu serve daemon's socket) and 'master' "
                    "(remote nodes' Master, redis://HOST:PORT/DB) is required",
                )
            try:
                batch = int(extra.get("batch", 64))
            except (TypeError, ValueError):
                raise InvalidArgument(
                    None, f"ChmHiCacheStorage: batch={extra['batch']!r} is no integer"
                ) from None
            page = (kwargs or {}).get("page_bytes")
            self._opts = TierOptions(
                path=extra.get("path"),
                socket=extra.get("socket"),
                capacity=extra.get("capacity", "64G"),
                dram=extra.get("dram"),
                wbuf=extra.get("wbuf"),
                slot_size=extra.get("slot_size", "32M"),
                backend=extra.get("backend", "auto"),
                flush_interval=flush or None,
                staging=extra.get("staging", "1G"),
                sparse_overcommit=_flag(extra, "sparse_overcommit"),
                per_rank_dir=_flag(extra, "per_rank_dir"),
                master=extra.get("master"),
                nodes=extra.get("nodes"),
                secret_file=extra.get("secret_file"),
                host=extra.get("host"),
                remote_buffer=extra.get("remote_buffer"),
                remote_timeout=self.get_timeout or 10.0,
                given=frozenset(k for k, v in extra.items() if v is not None),
            )
            self._batch = max(1, batch)
            self._rank = int(storage_config.tp_rank)
            # an embedded store whose write buffer no page size sized yet: it
            # is opened now (a second process on the path fails here, Busy)
            # and reopened once the host pool tells the page (SGLang's
            # dynamic factory passes none to the constructor)
            self._size_at_register = (
                not page and not self._opts.socket and not self._opts.master and not self._opts.wbuf
            )
            tier = self._open(int(page) if page else None, self._batch)
        self.tier = tier
        self.store = tier.store

    def _open(self, chunk_bytes: int | None, batch: int) -> Tier:
        return open_tier(
            self._opts,
            namespace=self.namespace,
            chunk_bytes=chunk_bytes,
            batch=batch,
            rank=self._rank,
            log=logger,
            what="SGLang",
        )

    def _size_wbuf(self, pool: Any) -> None:
        """Reopens the embedded store with the write buffer sized for
        ``batch`` pages of ``pool`` (one backup call), when the page is now
        known and the device's default is smaller."""
        if not getattr(self, "_size_at_register", False):
            return
        self._size_at_register = False
        ps = int(getattr(pool, "page_size", 1) or 1)
        if getattr(pool, "kv_buffer", True) is None:
            return  # a logical anchor (hybrid models): no KV pages of its own
        _, sizes = pool.get_page_buffer_meta(_arange(ps))
        sizes = [int(n) for n in sizes]
        if not sizes:
            return
        if self.zero_copy:  # each part of a page is a block
            chunk, batch = max(sizes), self._batch * len(sizes)
        else:  # one flat page per block
            chunk, batch = sum(sizes), self._batch
        o = self._opts
        if default_wbuf(chunk, batch, o.dram, o.slot_size) is None:
            return  # the device's default already holds it (or DRAM allows no more)
        old = self.tier
        old.close()
        self.tier = self._open(chunk, batch)
        self.store = self.tier.store
        logger.info(
            "chm: write buffer sized for %d pages of %d bytes: %d bytes",
            self._batch,
            sum(sizes),
            self.store.device.config.wbuf_bytes,
        )

    # ---- keys

    def _digest(self, pool: str, key: str, part: int = 0) -> bytes:
        if not isinstance(key, str) or not key:
            raise InvalidArgument(None, f"HiCache key {key!r:.60}: expected a non-empty str")
        if pool == _KV:
            raw = f"{self._layout}\0{key}" if part == 0 else f"{self._layout}\0{key}\0{part}"
        else:
            layout = _pool_layout(self._pools[pool]) if pool in self._pools else "nopool"
            raw = f"{pool}\0{layout}\0{key}\0{part}"
        return xxhash.xxh3_128_digest(raw.encode())

    def _part_keys(self, keys: list[str], pool: str = _KV) -> list[bytes]:
        """Digests of every part of every page, page by page (the KV pool's part
        0 is the page's own key, so batch_exists and the copying calls see the
        same pages)."""
        m = self._parts.get(pool, 1)
        return [self._digest(pool, k, j) for k in keys for j in range(m)]

    # ---- pools

    def _parts_of(self, pool: Any, name: str) -> int:
        ps = int(getattr(pool, "page_size", 1) or 1)
        meta = pool.get_page_buffer_meta(_arange(ps))
        if not meta or not meta[0]:
            raise InvalidArgument(
                None,
                f"ChmHiCacheStorage: pool {name!r} ({type(pool).__name__}) names no page "
                "buffers (get_page_buffer_meta gave none)",
            )
        return len(meta[0])

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._layout = _pool_layout(mem_pool_host)
        if self.zero_copy and getattr(mem_pool_host, "kv_buffer", True) is not None:
            self._parts[_KV] = self._parts_of(mem_pool_host, _KV)
        self._size_wbuf(mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        if name == _KV:
            return  # the anchor: register_mem_pool_host
        self._pools[name] = host_pool
        self._parts[name] = self._parts_of(host_pool, name)

    def _pool(self, name: str) -> Any:
        if name == _KV and name not in self._pools:
            pool = getattr(self, "mem_pool_host", None)
        else:
            pool = self._pools.get(name)
        if pool is None:
            raise InvalidArgument(
                None, f"ChmHiCacheStorage: pool {name!r} used before it was registered"
            )
        return pool

    def _views(self, pool: Any, name: str, keys: list[str], host_indices: Any) -> list[Any]:
        ps = int(getattr(pool, "page_size", 1) or 1)
        if len(host_indices) != len(keys) * ps:
            raise InvalidArgument(
                None,
                f"ChmHiCacheStorage: {len(host_indices)} host indices for {len(keys)} pages "
                f"of {ps} tokens",
            )
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        if len(ptrs) != len(keys) * self._parts.get(name, 1):
            raise InvalidArgument(
                None,
                f"ChmHiCacheStorage: {len(ptrs)} page buffers for {len(keys)} pages of pool "
                f"{name!r}",
            )
        return [
            np.ctypeslib.as_array((ctypes.c_uint8 * int(n)).from_address(int(p)))
            for p, n in zip(ptrs, sizes, strict=True)
        ]

    def _per_page(self, ok: list[bool], pages: int, name: str = _KV) -> list[bool]:
        m = self._parts.get(name, 1)
        return [all(ok[i * m : (i + 1) * m]) for i in range(pages)]

    def _put(self, keys: list[bytes], srcs: list[Any]) -> list[bool]:
        st = self.tier.staging.put(keys, srcs)
        return [s in (PutStatus.STORED, PutStatus.EXISTS) for s in st]

    # ---- zero copy (interface_v1)

    def batch_get_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Reads each page's parts into the host pool, in place; per page whether it loaded."""
        if getattr(self, "mem_pool_host", None) is None:
            raise InvalidArgument(
                None, "ChmHiCacheStorage: interface_v1 call before register_mem_pool_host"
            )
        views = self._views(self.mem_pool_host, _KV, keys, host_indices)
        got = self.store.get(self._part_keys(keys), views, self.get_timeout)
        return self._per_page(got, len(keys))

    def batch_set_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Writes each page's parts from the host pool; per page whether it is stored."""
        if getattr(self, "mem_pool_host", None) is None:
            raise InvalidArgument(
                None, "ChmHiCacheStorage: interface_v1 call before register_mem_pool_host"
            )
        views = self._views(self.mem_pool_host, _KV, keys, host_indices)
        return self._per_page(self._put(self._part_keys(keys), views), len(keys))

    # ---- hybrid models (v2): the KV pool and its sidecar pools

    def _pages_present(self, keys: list[str], name: str) -> list[bool]:
        got = self.store.contains(self._part_keys(keys, name))
        return self._per_page(got, len(keys), name)

    def batch_exists_v2(
        self,
        keys: list[str],
        pool_transfers: list[PoolTransfer] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """The usable prefix: the KV pages present, cut by each sidecar pool's
        hit policy (ALL_PAGES: every page of the prefix; TRAILING_PAGES: the
        last ``len(transfer.keys)`` pages before the stop point; BLOCK_GROUPS:
        reported, never cutting the prefix)."""
        anchor = getattr(self, "mem_pool_host", None)
        if anchor is not None and getattr(anchor, "kv_buffer", True) is None:
            kv_pages = len(keys)  # a logical anchor: the sidecars decide
        else:
            kv_pages = self.batch_exists(keys, extra_info)
        hits: dict[str, int] = {_KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for t in pool_transfers or []:
            if not restorable:
                break
            name = str(t.name)
            if name not in self._pools:
                raise InvalidArgument(
                    None, f"ChmHiCacheStorage: pool {name!r} used before it was registered"
                )
            present = self._pages_present(keys[:kv_pages], name)
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                stop = present.index(False) if False in present else kv_pages
                mine = set(range(1, stop + 1))
                boundary = stop
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(t.keys) if t.keys else 1)
                mine = {n for n in range(1, kv_pages + 1) if all(present[max(0, n - window) : n])}
                boundary = max(mine) if mine else 0
            else:  # BLOCK_GROUPS: the pool's own verdict, it never gates the KV hit
                group = max(1, int(getattr(t, "group_pages", 0) or 1))
                run = present.index(False) if False in present else kv_pages
                if run // group * group:
                    hits[name] = run // group * group
                continue
            if boundary:
                hits[name] = boundary
            restorable = [n for n in restorable if n in mine]
        final = restorable[-1] if restorable else 0
        return PoolTransferResult(final, hits, restorable)

    def _io_v2(self, transfers: list[PoolTransfer], is_set: bool) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for t in transfers:
            name = str(t.name)
            keys = list(t.keys or [])
            if not keys:
                out[name] = []
                continue
            views = self._views(self._pool(name), name, keys, t.host_indices)
            bkeys = self._part_keys(keys, name)
            if is_set:
                ok = self._put(bkeys, views)
            else:
                ok = self.store.get(bkeys, views, self.get_timeout)
            out[name] = self._per_page(ok, len(keys), name)
        return out

    def batch_get_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        """Reads each pool's pages into its host pool, in place; per pool, per page."""
        return self._io_v2(transfers, is_set=False)

    def batch_set_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        """Writes each pool's pages from its host pool; per pool, per page."""
        return self._io_v2(transfers, is_set=True)

    # ---- the copying interface

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        if target_location is None:
            raise InvalidArgument(None, "ChmHiCacheStorage.get: a target_location is required")
        ok = self.store.get([self._digest(_KV, key)], [target_location], self.get_timeout)
        return target_location if ok[0] else None

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[Any]:
        if target_locations is None or len(target_locations) != len(keys):
            raise InvalidArgument(
                None, "ChmHiCacheStorage.batch_get: one target_location per key is required"
            )
        ok = self.store.get(
            [self._digest(_KV, k) for k in keys], list(target_locations), self.get_timeout
        )
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
        ok = self._put([self._digest(_KV, k) for k in keys], [v.contiguous() for v in values])
        return all(ok)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        m = self._parts.get(_KV, 1)
        if m == 1:
            return int(self.store.prefix_len([self._digest(_KV, k) for k in keys]))
        return int(self.store.prefix_len(self._part_keys(keys))) // m

    def clear(self) -> None:
        """Removes nothing: the store's segments are reclaimed oldest first when full."""

    def stats(self) -> dict[str, Any]:
        """The store's counters and the staging queue's (``staging_*``;
        ``staging_skipped`` counts pages not stored)."""
        return self.tier.stats()

    def close(self) -> None:
        """Writes what is staged, flushes and closes the store (SGLang has no
        shutdown hook for a storage backend; call it at exit)."""
        self.tier.close()
