"""chm as an LMCache storage plugin (tested against ``lmcache==0.5.6``).

Configuration (LMCache's YAML; one of ``chm.path``, ``chm.socket`` and
``chm.master`` is required, every other ``chm.*`` key is optional)::

    chunk_size: 256
    local_cpu: false
    max_local_cpu_size: 2          # GB: LMCache's buffers for retrieved chunks
    pre_caching_hash_algorithm: sha256_cbor   # chunk hashes stable across restarts
    storage_plugins: [chm]
    extra_config:
      storage_plugin.chm.module_path: chm.integrations.lmcache
      storage_plugin.chm.class_name: ChmStorageBackend
      chm.path: /var/lib/chm/kv    # an embedded store (kv.img + journal), or
      # chm.socket: /run/chm/chm.sock   # a chm-emu serve daemon every rank shares, or
      # chm.master: redis://10.0.0.1:6379/0   # remote nodes every worker shares, with
      # chm.secret_file: /etc/chm/secret      # the nodes' shared secret (mode 0600)
      # chm.nodes: node-a,node-b              # where puts go (default: every live node)
      # chm.host: 10.0.0.3                    # this worker's Transfer Engine address
      # chm.remote_buffer: 64M                # its registered transfer buffer
      chm.capacity: 64G            # refused if the filesystem has less free space,
      chm.sparse_overcommit: false # unless this is true
      chm.dram: 320M
      chm.wbuf: 128M               # default: one store call (chunk bytes x chm.batch)
      chm.batch: 8                 # chunks per store call, to size the write buffer
      chm.staging: 1G              # host staging queue in front of the write buffer
      chm.slot_size: 32M           # the largest chunk (default: LMCache's chunk size)
      chm.per_rank_dir: false      # true: chm.path/rank<worker_id> per rank
      chm.backend: auto            # auto | uring | pread
      chm.mode: prefetch           # prefetch | lru (the transparent-cache baseline)
      chm.get_timeout_s: 10        # a load slower than this is a miss
      chm.flush_interval_s: 1.0    # puts durable at most this late (0: only at close)

Why a storage plugin and not an L2 adapter. LMCache 0.5.6 has two
extension points. ``StoragePluginInterface`` is a tier of the in-process
``StorageManager`` that LMCache's vLLM and SGLang connectors use; its
retrieve call (``batched_get_blocking`` / ``batched_get_non_blocking``)
receives the whole ordered list of a request's chunk keys after a prefix
``batched_contains``, which is exactly the issue-wait-release hint chm's
prefetch window needs. The L2 adapters (``lmcache.v1.distributed``) serve
only the separate multiprocess server, move objects one descriptor at a time
through L1 memory the server owns, and would need a second copy path.

What each call does:

- keys: a ``CacheEngineKey``'s string (model, world size, worker, chunk
  hash, dtype, tags) hashed to 16 bytes, in a namespace made of this
  engine's model, world size, KV shape (layers, heads, head size, MLA),
  KV dtype and worker id, so another model or layout on the same tier
  misses. Each chunk is one block; its metadata (shape, dtype, format,
  cached positions) is the block's metadata field in the store's index, so
  a restarted engine rebuilds the ``MemoryObj`` with no I/O;
- ``batched_submit_put_task``: never blocks. The chunks go to the tier's
  host staging queue (:class:`chm.kv.staging.StagingQueue`), which offers
  them to the device's write buffer as its flusher frees space, so a store
  call larger than the write buffer is stored whole; a chunk is skipped
  only when the queue is full (counted in :meth:`stats`, logged at
  WARNING). Completion is seen through the ticket's eventfd on LMCache's
  event loop, which then drops the reference LMCache lent and calls
  ``on_complete_callback``;
- ``batched_contains`` / ``batched_async_contains``: prefix hits, pinned on
  request;
- ``batched_get_blocking`` / ``batched_get_non_blocking``: allocate the
  destinations from LMCache's CPU pool without waiting for space, then one
  ``load_prefix`` over the ordered keys straight into them; the result is
  the loaded prefix. When the CPU pool cannot hold a whole history, the
  part that fits is returned and the rest is a miss;
- ``clear``: removes every chunk this engine has stored or found (a
  restarted engine's unseen chunks age out by LRU).

Start-up checks, logged where LMCache's log shows them: a per-process chunk
hash (``pre_caching_hash_algorithm: builtin`` without ``PYTHONHASHSEED``)
is a WARNING (a restart would find nothing); a ``chm.path`` held by another
process is an ERROR line ``chm: tier not in use`` (LMCache catches a
backend's exception and runs without it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from chm.integrations import require

require("lmcache", "lmcache", "chm.integrations.lmcache")

import torch  # noqa: E402
import xxhash  # noqa: E402
from lmcache.logging import init_logger  # noqa: E402
from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat, MemoryObj  # noqa: E402
from lmcache.v1.storage_backend.abstract_backend import (  # noqa: E402
    AllocatorBackendInterface,
    StoragePluginInterface,
)

from chm.errors import Busy, ChmError, InvalidArgument  # noqa: E402
from chm.integrations._tier import Tier, TierOptions, chunk_nbytes, open_tier  # noqa: E402
from chm.kv import MAX_META, Namespace, PutStatus, Ticket  # noqa: E402
from chm.sizes import parse_size  # noqa: E402

__all__ = ["ChmStorageBackend", "chunk_meta", "hash_is_per_process", "namespace_of", "options"]

logger = init_logger(__name__)

_OPTIONS: dict[str, tuple[type, Any]] = {
    # option: (type, default); None default = not set
    "path": (str, None),
    "socket": (str, None),
    "capacity": (str, "64G"),
    "sparse_overcommit": (bool, False),
    "dram": (str, None),
    "wbuf": (str, None),
    "batch": (int, 8),
    "staging": (str, "1G"),
    "slot_size": (str, None),
    "per_rank_dir": (bool, False),
    "backend": (str, "auto"),
    "eviction": (str, "lru"),
    "mode": (str, "prefetch"),
    "get_timeout_s": (float, 10.0),
    "flush_interval_s": (float, 1.0),
    "master": (str, None),
    "nodes": (str, None),
    "secret_file": (str, None),
    "host": (str, None),
    "remote_buffer": (str, None),
}
_DEFAULT_SLOT = 32 << 20


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise InvalidArgument(None, f"LMCache extra_config: chm.{name}={value!r} is not a boolean")


def options(extra: dict[str, Any] | None, *, need_path: bool = True) -> dict[str, Any]:
    """The ``chm.*`` options of an LMCache ``extra_config``, checked and defaulted."""
    extra = extra or {}
    unknown = sorted(k for k in extra if k.startswith("chm.") and k[len("chm.") :] not in _OPTIONS)
    if unknown:
        raise InvalidArgument(
            None,
            f"LMCache extra_config: unknown chm option(s) {unknown}; known: "
            f"{sorted('chm.' + k for k in _OPTIONS)}",
        )
    out: dict[str, Any] = {}
    for name, (typ, default) in _OPTIONS.items():
        value = extra.get("chm." + name, default)
        if value is None:
            continue
        if name == "nodes" and isinstance(value, (list, tuple)):  # a YAML list
            value = ",".join(str(v) for v in value)
        if typ is bool:
            out[name] = _bool(name, value)
            continue
        try:
            out[name] = typ(value)
        except (TypeError, ValueError):
            raise InvalidArgument(
                None, f"LMCache extra_config: chm.{name}={value!r} is not a {typ.__name__}"
            ) from None
    if need_path and sum(k in out for k in ("path", "socket", "master")) != 1:
        raise InvalidArgument(
            None,
            "LMCache extra_config: one of chm.path (an embedded store's directory), "
            "chm.socket (a chm-emu serve daemon's socket) and chm.master (remote nodes' "
            "Master, redis://HOST:PORT/DB) is required",
        )
    for name in ("get_timeout_s", "flush_interval_s"):
        if out[name] < 0:
            raise InvalidArgument(None, f"LMCache extra_config: chm.{name} must be >= 0")
    if out["batch"] < 1:
        raise InvalidArgument(None, "LMCache extra_config: chm.batch must be >= 1")
    return out


def hash_is_per_process(config: Any) -> bool:
    """True when LMCache's chunk hashes change from one process to the next:
    Python's ``hash`` (``pre_caching_hash_algorithm: builtin``, or an
    algorithm that needs vLLM's hashing when vLLM is absent) without a
    fixed ``PYTHONHASHSEED``."""
    seed = os.environ.get("PYTHONHASHSEED")
    if seed is not None and seed != "random":
        return False
    alg = str(getattr(config, "pre_caching_hash_algorithm", "builtin") or "builtin")
    if alg == "builtin":
        return True
    try:
        from vllm.utils.hashing import get_hash_fn_by_name
    except ImportError:
        try:
            from vllm.utils import get_hash_fn_by_name
        except ImportError:
            return True  # LMCache falls back to the builtin hash
    try:
        get_hash_fn_by_name(alg)
    except ValueError:
        return not alg.startswith("sha256_cbor")  # LMCache maps the renamed variants
    return False


def _text(value: object) -> str:
    s = str(value).replace("@", "_").replace("\0", "_")
    return s or "_"


def namespace_of(metadata: Any) -> Namespace:
    """The key namespace of an engine: model, world size, KV layout, dtype, worker."""
    model = _text(getattr(metadata, "model_name", None) or "lmcache")
    world = int(getattr(metadata, "world_size", 1) or 1)
    shape = getattr(metadata, "kv_shape", None)
    layout = "x".join(str(int(x)) for i, x in enumerate(shape or ()) if i != 2)  # not tokens
    mla = "#mla" if getattr(metadata, "use_mla", False) else ""
    dtype = _text(str(getattr(metadata, "kv_dtype", "kv")).removeprefix("torch."))
    return Namespace(
        model=f"{model}#ws{world}#kv{layout or '_'}{mla}",
        dtype=dtype,
        tp_rank=int(getattr(metadata, "worker_id", 0) or 0),
    )


def _chunk_bytes(config: Any, metadata: Any) -> int | None:
    shape = getattr(metadata, "kv_shape", None)
    dtype = getattr(metadata, "kv_dtype", None)
    if not shape or not isinstance(dtype, torch.dtype):
        return None
    dims = list(shape)
    if len(dims) == 5:
        dims[2] = int(getattr(config, "chunk_size", dims[2]) or dims[2])
    return chunk_nbytes(dims, torch.empty((), dtype=dtype).element_size())


def chunk_meta(obj: MemoryObj) -> bytes:
    """A chunk's metadata (what is needed to allocate it again), at most MAX_META
    bytes; ValueError if its cached positions make it longer."""
    m = obj.metadata
    pos = m.cached_positions
    positions: Any = None
    if pos is not None:
        p = pos.tolist()
        if p and p == list(range(p[0], p[0] + len(p))):
            positions = {"from": p[0], "n": len(p)}  # the usual case: a range
        else:
            positions = p
    raw = json.dumps(
        {
            "v": 2,
            "nbytes": int(obj.get_size()),
            "shape": list(m.shape),
            "dtype": str(m.dtype).removeprefix("torch.") if m.dtype is not None else None,
            "shapes": [list(s) for s in m.shapes] if m.shapes else None,
            "dtypes": [str(d).removeprefix("torch.") for d in m.dtypes] if m.dtypes else None,
            "fmt": int(m.fmt.value),
            "pos": positions,
        },
        separators=(",", ":"),
    ).encode()
    if len(raw) > MAX_META:
        raise ValueError(f"chunk metadata of {len(raw)} bytes > {MAX_META}")
    return raw


class _Meta:
    """A parsed metadata field."""

    __slots__ = ("cached_positions", "dtypes", "fmt", "nbytes", "shapes", "tokens")

    def __init__(self, raw: bytes) -> None:
        d = json.loads(raw)
        if d.get("v") != 2:
            raise ValueError(f"metadata version {d.get('v')!r}")
        self.nbytes = int(d["nbytes"])
        if d["shapes"]:
            self.shapes: Any = [torch.Size(s) for s in d["shapes"]]
            self.dtypes: Any = [getattr(torch, t) for t in d["dtypes"]]
        else:
            self.shapes = torch.Size(d["shape"])
            self.dtypes = getattr(torch, d["dtype"])
        self.fmt = MemoryFormat(d["fmt"])
        shape = d["shape"] or (d["shapes"] or [[]])[0]
        try:
            self.tokens = int(shape[self.fmt.token_dim()])
        except (IndexError, ValueError, TypeError):
            self.tokens = 0
        pos = d["pos"]
        if isinstance(pos, dict):
            pos = list(range(int(pos["from"]), int(pos["from"]) + int(pos["n"])))
        self.cached_positions = torch.tensor(pos, dtype=torch.long) if pos is not None else None


class ChmStorageBackend(StoragePluginInterface):  # type: ignore[misc]
    """An LMCache storage tier on a chm KV store (see the module doc)."""

    def __init__(
        self,
        dst_device: str = "cpu",
        config: Any = None,
        metadata: Any = None,
        local_cpu_backend: Any = None,
        loop: asyncio.AbstractEventLoop | None = None,
        tier: Tier | None = None,
    ) -> None:
        super().__init__(
            dst_device=dst_device,
            config=config,
            metadata=metadata,
            local_cpu_backend=local_cpu_backend,
            loop=loop,
        )
        if local_cpu_backend is None:
            raise InvalidArgument(
                None,
                "ChmStorageBackend needs LMCache's local CPU backend (its retrieve buffers): "
                "set max_local_cpu_size > 0",
            )
        if loop is None:
            raise InvalidArgument(None, "ChmStorageBackend needs LMCache's event loop")
        opts = options(getattr(config, "extra_config", None), need_path=tier is None)
        self.get_timeout = float(opts["get_timeout_s"])
        self.chunk_bytes = _chunk_bytes(config, metadata)
        if hash_is_per_process(config):
            logger.warning(
                "chm: LMCache's chunk hash is Python's per-process hash() "
                "(pre_caching_hash_algorithm=%s, PYTHONHASHSEED unset): a restarted engine "
                "finds none of the chunks chm kept; set pre_caching_hash_algorithm: "
                "sha256_cbor (vLLM's hashing) or export PYTHONHASHSEED=0",
                getattr(config, "pre_caching_hash_algorithm", "builtin"),
            )
        if tier is None:
            slot = opts.get("slot_size")
            if slot is None:  # the default: one chunk (rounded up to MiB), else 32M
                slot = (
                    (-(-self.chunk_bytes // (1 << 20)) << 20) if self.chunk_bytes else _DEFAULT_SLOT
                )
            elif self.chunk_bytes and self.chunk_bytes > parse_size(slot):
                logger.error(
                    "chm: LMCache's chunks are %d bytes but chm.slot_size is %s: no chunk "
                    "can be stored; raise chm.slot_size",
                    self.chunk_bytes,
                    slot,
                )
            tier = open_tier(
                TierOptions(
                    path=opts.get("path"),
                    socket=opts.get("socket"),
                    capacity=opts["capacity"],
                    dram=opts.get("dram"),
                    wbuf=opts.get("wbuf"),
                    slot_size=slot,
                    backend=opts["backend"],
                    mode=opts["mode"],
                    eviction=opts["eviction"],
                    flush_interval=opts["flush_interval_s"] or None,
                    staging=opts["staging"],
                    sparse_overcommit=opts["sparse_overcommit"],
                    per_rank_dir=opts["per_rank_dir"],
                    master=opts.get("master"),
                    nodes=opts.get("nodes"),
                    secret_file=opts.get("secret_file"),
                    host=opts.get("host"),
                    remote_buffer=opts.get("remote_buffer"),
                    remote_timeout=self.get_timeout or 10.0,
                    given=frozenset(
                        k[len("chm.") :]
                        for k, v in (getattr(config, "extra_config", None) or {}).items()
                        if k.startswith("chm.") and v is not None
                    ),
                ),
                namespace=namespace_of(metadata),
                chunk_bytes=self.chunk_bytes,
                batch=opts["batch"],
                rank=int(getattr(metadata, "worker_id", 0) or 0),
                log=logger,
                what="LMCache",
                key_prefix="chm.",
            )
        self.tier = tier
        self.store = tier.store
        self._lock = threading.Lock()
        self._inflight: set[CacheEngineKey] = set()
        self._meta: dict[CacheEngineKey, _Meta] = {}
        self._pins: dict[CacheEngineKey, int] = {}
        self._counts = {"puts_too_large": 0, "puts_failed": 0, "cleared_chunks": 0}
        self._closed = False

    def __str__(self) -> str:
        return "ChmStorageBackend"

    # ---- keys

    def _digest(self, key: CacheEngineKey) -> bytes:
        return xxhash.xxh3_128_digest(key.to_string().encode())

    def _keys(self, keys: Sequence[CacheEngineKey]) -> list[bytes]:
        return [self._digest(k) for k in keys]

    # ---- queries

    def _present(self, keys: Sequence[CacheEngineKey]) -> list[bool]:
        return self.store.contains(self._keys(keys)) if keys else []

    def _pin_prefix(self, keys: Sequence[CacheEngineKey], n: int) -> int:
        """Pins the first n keys; returns how many were still there to pin."""
        if n == 0:
            return 0
        ok = self.store.pin(self._keys(keys[:n]))
        with self._lock:
            for k, o in zip(keys[:n], ok, strict=True):
                if o:
                    self._pins[k] = self._pins.get(k, 0) + 1
        held = 0
        for o in ok:
            if not o:
                break
            held += 1
        # keys pinned after a gap are not part of the prefix: give them back
        for k, o in list(zip(keys[:n], ok, strict=True))[held:]:
            if o:
                self.unpin(k)
        return held

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        return self.batched_contains([key], pin) == 1

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        present = self._present(keys)
        n = next((i for i, p in enumerate(present) if not p), len(present))
        return self._pin_prefix(keys, n) if pin else n

    async def batched_async_contains(
        self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False
    ) -> int:
        return self.batched_contains(keys, pin)

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return key in self._inflight

    # ---- puts

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future[None]] | None:
        if self._closed:
            return None
        keys = list(keys)[: len(objs)]
        present = self._present(keys)
        todo: list[tuple[CacheEngineKey, MemoryObj]] = []
        metas: list[_Meta] = []
        raws: list[bytes] = []
        max_block = int(getattr(self.store, "max_block", 0) or 0)
        with self._lock:
            for k, o, p in zip(keys, objs, present, strict=True):
                if p or k in self._inflight:
                    continue
                if max_block and o.get_size() > max_block:
                    self._counts["puts_too_large"] += 1
                    continue
                try:
                    raw = chunk_meta(o)
                except ValueError as exc:
                    logger.warning("chm: %s not stored: %s", k, exc)
                    self._counts["puts_too_large"] += 1
                    continue
                self._inflight.add(k)
                todo.append((k, o))
                raws.append(raw)
                metas.append(_Meta(raw))
        if not todo:
            return None
        for _, o in todo:
            o.ref_count_up()
        try:
            ticket = self.tier.staging.submit(
                self._keys([k for k, _ in todo]), [o.byte_array for _, o in todo], raws
            )
        except BaseException:
            self._release_puts(todo)
            raise
        assert self.loop is not None
        coro = self._finish_put(ticket, todo, metas, on_complete_callback)
        return [asyncio.run_coroutine_threadsafe(coro, self.loop)]

    def _release_puts(self, todo: Sequence[tuple[CacheEngineKey, MemoryObj]]) -> None:
        with self._lock:
            for k, _ in todo:
                self._inflight.discard(k)
        for _, o in todo:
            o.ref_count_down()

    async def _finish_put(
        self,
        ticket: Ticket,
        todo: Sequence[tuple[CacheEngineKey, MemoryObj]],
        metas: Sequence[_Meta],
        callback: Callable[[CacheEngineKey], None] | None,
    ) -> None:
        try:
            statuses: list[PutStatus] = await _wait_ticket(ticket)
        except (ChmError, ValueError) as exc:
            logger.warning("chm: a put of %d chunks failed: %s", len(todo), exc)
            statuses = [PutStatus.ERROR] * len(todo)
        finally:
            self._release_puts(todo)
            ticket.close()
        stored = []
        with self._lock:
            for (k, _), m, s in zip(todo, metas, statuses, strict=True):
                if s in (PutStatus.STORED, PutStatus.EXISTS):
                    self._meta[k] = m
                    stored.append(k)
                elif s == PutStatus.ERROR:
                    self._counts["puts_failed"] += 1
        if callback is not None:
            for k in stored:
                try:
                    callback(k)
                except Exception as exc:  # LMCache's own backends log and go on
                    logger.warning("on_complete_callback failed for key %s: %s", k, exc)

    def flush(self, timeout: float | None = None) -> None:
        """Makes every chunk submitted so far durable (found after a restart or
        a crash): waits for the staging queue, then flushes the store. A device
        failure raises DeviceIOError (the chunks it covered become misses)."""
        self.tier.staging.drain(timeout)
        self.store.flush(timeout)

    def stats(self) -> dict[str, Any]:
        """The store's counters, the staging queue's (``staging_*``: ``staging_skipped``
        counts puts not stored) and this plugin's (``lmcache_*``)."""
        out = self.tier.stats()
        with self._lock:
            out.update({f"lmcache_{k}": v for k, v in self._counts.items()})
        return out

    # ---- gets

    def _metas(self, keys: Sequence[CacheEngineKey]) -> list[_Meta | None]:
        """The metadata of each key (from memory, else the store's index)."""
        with self._lock:
            out: list[_Meta | None] = [self._meta.get(k) for k in keys]
        need = [i for i, m in enumerate(out) if m is None]
        if not need:
            return out
        raws = self.store.meta(self._keys([keys[i] for i in need]))
        for i, raw in zip(need, raws, strict=True):
            if raw is None:
                break  # the prefix ends here
            try:
                m = _Meta(bytes(raw))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                logger.warning("chm: unreadable metadata for %s: %s", keys[i], exc)
                break
            out[i] = m
            with self._lock:
                self._meta[keys[i]] = m
        return out

    def _load_prefix(self, keys: Sequence[CacheEngineKey]) -> list[MemoryObj]:
        """Loads the leading chunks that are present and fit LMCache's CPU pool."""
        if not keys or self._closed:
            return []
        metas = self._metas(keys)
        objs: list[MemoryObj] = []
        for k, m in zip(keys, metas, strict=True):
            if m is None:
                break
            o = self.local_cpu_backend.allocate(m.shapes, m.dtypes, m.fmt, busy_loop=False)
            if o is None:
                logger.info(
                    "chm: LMCache's CPU pool is full after %d of %d chunks; the rest is a miss",
                    len(objs),
                    len(keys),
                )
                break
            if o.get_size() != m.nbytes:
                logger.warning("chm: %s: %d bytes allocated, %d stored", k, o.get_size(), m.nbytes)
                o.ref_count_down()
                break
            objs.append(o)
        if not objs:
            return []
        try:
            n = self.store.load_prefix(
                self._keys(keys[: len(objs)]),
                [o.byte_array for o in objs],
                self.get_timeout,
            )
        except BaseException:
            for o in objs:
                o.ref_count_down()
            raise
        for o in objs[n:]:
            o.ref_count_down()
        for o, m in zip(objs[:n], metas, strict=False):
            assert m is not None
            o.metadata.cached_positions = m.cached_positions
        return objs[:n]

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        got = self._load_prefix([key])
        return got[0] if got else None

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        got: list[MemoryObj | None] = list(self._load_prefix(keys))
        return got + [None] * (len(keys) - len(got))

    def get_non_blocking(self, key: CacheEngineKey, location: str | None = None) -> Future[Any]:
        assert self.loop is not None

        async def one() -> MemoryObj | None:
            got = await asyncio.to_thread(self._load_prefix, [key])
            return got[0] if got else None

        return asyncio.run_coroutine_threadsafe(one(), self.loop)

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: list[CacheEngineKey], transfer_spec: Any = None
    ) -> list[MemoryObj]:
        try:
            return await asyncio.to_thread(self._load_prefix, keys)
        finally:
            for k in keys:  # the pins of the lookup that announced this load
                self.unpin(k)

    # ---- pins, removal, lifecycle

    def pin(self, key: CacheEngineKey) -> bool:
        return self._pin_prefix([key], 1) == 1

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            n = self._pins.get(key, 0)
            if n:
                if n == 1:
                    del self._pins[key]
                else:
                    self._pins[key] = n - 1
        if n:
            with contextlib.suppress(InvalidArgument):
                self.store.unpin(self._keys([key]))
            return True
        return bool(self.store.contains(self._keys([key]))[0])

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        try:
            gone = self.store.remove(self._keys([key]))[0]
        except Busy:
            return False
        with self._lock:
            self._meta.pop(key, None)
        return bool(gone)

    def clear(self) -> int:
        """Removes every chunk this engine stored or found since it started
        (pinned ones stay); returns the tokens they held. Chunks a restarted
        engine has not looked up are not known to it: they age out by LRU."""
        with self._lock:
            known = list(self._meta.items())
        tokens = 0
        n = 0
        for k, m in known:
            if self.remove(k):
                tokens += m.tokens
                n += 1
        self._count("cleared_chunks", n)
        return tokens

    def touch_cache(self) -> None:
        """Recency is the store's: every load touches its segments."""

    def get_allocator_backend(self) -> AllocatorBackendInterface:
        return self.local_cpu_backend

    def close(self) -> None:
        """Waits (up to 30 s) for the staging queue, then flushes and closes the store."""
        if self._closed:
            return
        self._closed = True
        self.tier.close()
        deadline = time.monotonic() + 10.0
        while self.loop is not None and self.loop.is_running() and time.monotonic() < deadline:
            # the loop hands LMCache's objects back
            with self._lock:
                if not self._inflight:
                    break
            time.sleep(0.005)


async def _wait_ticket(ticket: Ticket) -> Any:
    """The ticket's result, awaited through its eventfd on the running loop."""
    if not ticket.done():
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = ticket.fileno()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, wake)
        try:
            if not ticket.done():
                await ready
        finally:
            loop.remove_reader(fd)
    return ticket.wait(0)
