"""chm as an LMCache storage plugin (tested against ``lmcache==0.5.6``).

Configuration (LMCache's YAML; every ``chm.*`` key but ``chm.path`` is
optional)::

    local_cpu: false
    max_local_cpu_size: 2          # GB: LMCache's staging pool for retrieves
    storage_plugins: [chm]
    extra_config:
      storage_plugin.chm.module_path: chm.integrations.lmcache
      storage_plugin.chm.class_name: ChmStorageBackend
      chm.path: /var/lib/chm/kv    # directory of the store (kv.img + journal)
      chm.capacity: 64G
      chm.dram: 320M
      chm.wbuf: 32M
      chm.slot_size: 32M           # the largest chunk that can be stored
      chm.backend: auto            # auto | uring | pread
      chm.mode: prefetch           # prefetch | lru (the transparent-cache baseline)
      chm.get_timeout_s: 10        # a load slower than this is a miss
      chm.flush_interval_s: 1.0    # make puts durable at most this late

Why a storage plugin and not an L2 adapter. LMCache 0.5.6 has two
extension points. ``StoragePluginInterface`` is a tier of the in-process
``StorageManager`` that LMCache's vLLM and SGLang connectors use; its
retrieve call (``batched_get_blocking`` / ``batched_get_non_blocking``)
receives the whole ordered list of a request's chunk keys after a prefix
``batched_contains``, which is exactly the issue-wait-release hint chm's
prefetch window needs. The L2 adapters (``lmcache.v1.distributed``) serve
only the separate multiprocess server, move objects one descriptor at a time
through L1 memory the server owns, and would need a second copy path. So
chm plugs in where the ordered prefix is visible, with one copy from the
device DRAM into LMCache's own staging buffers.

What each call does:

- keys: a ``CacheEngineKey``'s string (model, world size, worker, chunk
  hash, dtype, tags) hashed to 16 bytes, in the namespace of this engine's
  model, dtype and worker; every chunk has a data block and a small
  metadata block (shape, dtype, format, cached positions) under the same
  hash prefixed with ``meta``, so a store reopened after a restart can rebuild the
  ``MemoryObj`` without LMCache's in-memory index (which its local disk
  backend loses);
- ``batched_submit_put_task``: never blocks. The chunks are written by the
  store's worker thread (``Store.put_async``); completion is seen through
  the ticket's eventfd on LMCache's event loop, which then drops the
  reference LMCache lent and calls ``on_complete_callback``. A put the
  store skips (write buffer full) is simply not stored: LMCache recomputes;
- ``batched_contains`` / ``batched_async_contains``: prefix hits (data and
  metadata both present), pinned on request;
- ``batched_get_blocking`` / ``batched_get_non_blocking``: allocate the
  destinations from LMCache's CPU pool without waiting for space, then one
  ``Store.load_prefix`` over the ordered keys; the result is the loaded
  prefix. When the CPU pool cannot hold a whole history, the part that fits
  is returned and the rest is a miss, so a retrieve never waits on memory
  that only its own caller could free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
from chm.kv import Namespace, PutStatus, Store, Ticket  # noqa: E402

__all__ = ["ChmStorageBackend", "chunk_meta", "options"]

logger = init_logger(__name__)

_META = b"meta"
_OPTIONS: dict[str, tuple[type, Any]] = {
    # option: (type, default); None default = required
    "path": (str, None),
    "capacity": (str, "64G"),
    "dram": (str, None),
    "wbuf": (str, None),
    "slot_size": (str, "32M"),
    "backend": (str, "auto"),
    "eviction": (str, "lru"),
    "mode": (str, "prefetch"),
    "get_timeout_s": (float, 10.0),
    "flush_interval_s": (float, 1.0),
}


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
            if name == "path" and need_path:
                raise InvalidArgument(
                    None, "LMCache extra_config: chm.path (the store's directory) is required"
                )
            continue
        try:
            out[name] = typ(value)
        except (TypeError, ValueError):
            raise InvalidArgument(
                None, f"LMCache extra_config: chm.{name}={value!r} is not a {typ.__name__}"
            ) from None
    for name in ("get_timeout_s", "flush_interval_s"):
        if out[name] < 0:
            raise InvalidArgument(None, f"LMCache extra_config: chm.{name} must be >= 0")
    return out


def chunk_meta(obj: MemoryObj) -> bytes:
    """The metadata block of a chunk: what is needed to allocate it again."""
    m = obj.metadata
    pos = m.cached_positions
    return json.dumps(
        {
            "v": 1,
            "nbytes": int(obj.get_size()),
            "shape": list(m.shape),
            "dtype": str(m.dtype).removeprefix("torch.") if m.dtype is not None else None,
            "shapes": [list(s) for s in m.shapes] if m.shapes else None,
            "dtypes": [str(d).removeprefix("torch.") for d in m.dtypes] if m.dtypes else None,
            "fmt": int(m.fmt.value),
            "cached_positions": pos.tolist() if pos is not None else None,
        },
        separators=(",", ":"),
    ).encode()


class _Meta:
    """A parsed metadata block."""

    __slots__ = ("cached_positions", "dtypes", "fmt", "nbytes", "shapes")

    def __init__(self, raw: bytes) -> None:
        d = json.loads(raw)
        if d.get("v") != 1:
            raise ValueError(f"metadata version {d.get('v')!r}")
        self.nbytes = int(d["nbytes"])
        if d["shapes"]:
            self.shapes: Any = [torch.Size(s) for s in d["shapes"]]
            self.dtypes: Any = [getattr(torch, t) for t in d["dtypes"]]
        else:
            self.shapes = torch.Size(d["shape"])
            self.dtypes = getattr(torch, d["dtype"])
        self.fmt = MemoryFormat(d["fmt"])
        pos = d["cached_positions"]
        self.cached_positions = torch.tensor(pos, dtype=torch.long) if pos is not None else None


def _text(value: object) -> str:
    s = str(value).replace("@", "_").replace("\0", "_")
    return s or "_"


class ChmStorageBackend(StoragePluginInterface):  # type: ignore[misc]
    """An LMCache storage tier on a :class:`chm.kv.Store` (see the module doc)."""

    def __init__(
        self,
        dst_device: str = "cpu",
        config: Any = None,
        metadata: Any = None,
        local_cpu_backend: Any = None,
        loop: asyncio.AbstractEventLoop | None = None,
        store: Store | None = None,
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
        opts = options(getattr(config, "extra_config", None), need_path=store is None)
        self.get_timeout = float(opts["get_timeout_s"])
        self.flush_interval = float(opts["flush_interval_s"])
        if store is None:
            model = _text(getattr(metadata, "model_name", None) or "lmcache")
            dtype = _text(str(getattr(metadata, "kv_dtype", "kv")).removeprefix("torch."))
            rank = int(getattr(metadata, "worker_id", 0) or 0)
            dev_opts: dict[str, Any] = {}
            if "wbuf" in opts:
                dev_opts["wbuf"] = opts["wbuf"]
            store = Store.open(
                opts["path"],
                capacity=opts["capacity"],
                dram=opts.get("dram"),
                slot_size=opts["slot_size"],
                backend=opts["backend"],
                mode=opts["mode"],
                device_options=dev_opts,
                eviction=opts["eviction"],
                namespace=Namespace(model=model, dtype=dtype, tp_rank=rank),
            )
        self.store = store
        self._lock = threading.Lock()
        self._inflight: set[CacheEngineKey] = set()
        self._meta: dict[CacheEngineKey, _Meta] = {}
        self._pins: dict[CacheEngineKey, int] = {}
        self._last_flush = time.monotonic()
        self._closed = False

    def __str__(self) -> str:
        return "ChmStorageBackend"

    # ---- keys

    def _digest(self, key: CacheEngineKey) -> bytes:
        return xxhash.xxh3_128_digest(key.to_string().encode())

    def _data_keys(self, keys: Sequence[CacheEngineKey]) -> list[bytes]:
        return [self._digest(k) for k in keys]

    def _meta_keys(self, keys: Sequence[CacheEngineKey]) -> list[bytes]:
        return [_META + self._digest(k) for k in keys]

    # ---- queries

    def _present(self, keys: Sequence[CacheEngineKey]) -> list[bool]:
        """Per key: data and metadata blocks both in the store."""
        if not keys:
            return []
        data = self.store.contains(self._data_keys(keys))
        with self._lock:
            known = [k in self._meta for k in keys]
        need = [i for i, k in enumerate(known) if not k]
        meta = list(known)
        if need:
            got = self.store.contains(self._meta_keys([keys[i] for i in need]))
            for i, g in zip(need, got, strict=True):
                meta[i] = g
        return [d and m for d, m in zip(data, meta, strict=True)]

    def _pin_prefix(self, keys: Sequence[CacheEngineKey], n: int) -> int:
        """Pins the first n keys; returns how many were still there to pin."""
        if n == 0:
            return 0
        ok = self.store.pin(self._data_keys(keys[:n]))
        held = 0
        with self._lock:
            for k, o in zip(keys[:n], ok, strict=True):
                if o:
                    self._pins[k] = self._pins.get(k, 0) + 1
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

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future[None]] | None:
        if self._closed:
            return None
        present = self._present(list(keys))
        todo: list[tuple[CacheEngineKey, MemoryObj]] = []
        with self._lock:
            for k, o, p in zip(keys, objs, present, strict=False):
                if p or k in self._inflight:
                    continue
                self._inflight.add(k)
                todo.append((k, o))
        if not todo:
            return None
        ks = [k for k, _ in todo]
        store_keys = [d for k in ks for d in (*self._meta_keys([k]), *self._data_keys([k]))]
        srcs: list[Any] = []
        metas: list[_Meta] = []
        for _, o in todo:
            o.ref_count_up()
            raw = chunk_meta(o)
            metas.append(_Meta(raw))
            srcs += [raw, o.byte_array]
        try:
            ticket = self.store.put_async(store_keys, srcs)
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
        except ChmError as exc:
            logger.warning("chm: a put of %d chunks failed: %s", len(todo), exc)
            statuses = [PutStatus.ERROR] * (2 * len(todo))
        finally:
            self._release_puts(todo)
            ticket.close()
        stored = []
        with self._lock:
            for j, (k, _) in enumerate(todo):
                pair = statuses[2 * j : 2 * j + 2]
                if all(s in (PutStatus.STORED, PutStatus.EXISTS) for s in pair):
                    self._meta[k] = metas[j]
                    stored.append(k)
        if callback is not None:
            for k in stored:
                try:
                    callback(k)
                except Exception as exc:  # LMCache's own backends log and go on
                    logger.warning("on_complete_callback failed for key %s: %s", k, exc)
        if time.monotonic() - self._last_flush >= self.flush_interval and not self._closed:
            self._last_flush = time.monotonic()
            try:
                await asyncio.to_thread(self.store.flush)
            except ChmError as exc:  # the chunks it covered are misses now, never wrong
                logger.warning("chm: periodic flush failed: %s", exc)

    def flush(self, timeout: float | None = None) -> None:
        """Makes every chunk stored so far durable (found after a restart or a crash).

        Puts still in flight are not covered; a device failure raises
        DeviceIOError (the chunks it covered become misses).
        """
        self.store.flush(timeout)

    # ---- gets

    def _metas(self, keys: Sequence[CacheEngineKey]) -> list[_Meta | None]:
        """The metadata of each key (from memory, else read from the store)."""
        with self._lock:
            out: list[_Meta | None] = [self._meta.get(k) for k in keys]
        need = [i for i, m in enumerate(out) if m is None]
        if not need:
            return out
        mkeys = self._meta_keys([keys[i] for i in need])
        bufs: list[bytearray] = []
        idx: list[int] = []
        for j, i in enumerate(need):
            info = self.store.info(mkeys[j])
            if info is None:
                break  # the prefix ends here
            bufs.append(bytearray(info["length"]))
            idx.append(i)
        if not idx:
            return out
        ok = self.store.get(mkeys[: len(idx)], bufs, self.get_timeout)
        for i, b, o in zip(idx, bufs, ok, strict=True):
            if not o:
                break
            try:
                m = _Meta(bytes(b))
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
                self._data_keys(keys[: len(objs)]),
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
                self.store.unpin(self._data_keys([key]))
            return True
        return bool(self.store.contains(self._data_keys([key]))[0])

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        with self._lock:
            self._meta.pop(key, None)
        try:
            gone = self.store.remove(self._data_keys([key]))[0]
        except Busy:
            return False
        with contextlib.suppress(Busy):
            self.store.remove(self._meta_keys([key]))
        return bool(gone)

    def touch_cache(self) -> None:
        """Recency is the store's: every load touches its segments."""

    def get_allocator_backend(self) -> AllocatorBackendInterface:
        return self.local_cpu_backend

    def close(self) -> None:
        """Waits (up to 10 s) for puts in flight, then flushes and closes the store."""
        if self._closed:
            return
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            with self._lock:
                if not self._inflight:
                    break
            time.sleep(0.005)
        self._closed = True
        self.store.close()


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
