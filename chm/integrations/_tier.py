"""How every adapter opens its tier: one call, the same rules for all engines.

    tier = open_tier(TierOptions(path="/var/lib/chm/kv", capacity="1T"),
                     namespace=Namespace(model=..., dtype=..., tp_rank=...),
                     chunk_bytes=16 << 20, batch=8, rank=3, log=logger, what="LMCache")
    tier.store      # a chm.kv.Store (embedded) or the daemon's store (socket)
    tier.staging    # the StagingQueue every asynchronous put goes through
    tier.stats()    # the store's and the queue's counters, one dict
    tier.close()

What it decides, so that no adapter decides it differently:

- where: ``socket`` (a ``chm-emu serve`` daemon, through ``chm.connect``:
  every rank and replica of the node shares one tier and one index),
  ``master`` (remote storage nodes and their Master on Redis, a
  ``redis://`` URL, through :class:`chm.remote.tierstore.NodesStore`: every
  worker of a fleet shares one tier; ``nodes`` names the nodes puts go to,
  else every live node the Master lists; ``secret_file`` holds the nodes'
  shared secret) or ``path`` (an embedded store, this process only). With ``per_rank_dir``
  the store is ``path/rank<N>`` (each rank its own tier). An embedded path
  another process holds raises Busy. Every failure to open is logged at
  ERROR as ``chm: tier not in use: ...`` before it is raised, so an engine
  that swallows a backend's exception still leaves that line in its log;
- capacity: a file-backed tier must fit its filesystem
  (:func:`chm.kv.capacity.check_fits`) unless ``sparse_overcommit``;
- the write buffer: unless ``wbuf`` is given, sized to hold one engine store
  call (``chunk_bytes * batch``), within what the device's DRAM allows;
- durability: ``flush_interval`` starts the store's periodic flusher (the
  daemon's store: the staging queue's flusher);
- staging: ``staging`` bytes of host staging queue (default 1 GiB); with a
  daemon, the queue reports its counters to it (KV_STAGING), so the
  daemon's stats and metrics count every client's skips.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chm.errors import Busy, InvalidArgument
from chm.kv import Namespace, Store
from chm.kv.capacity import check_fits
from chm.kv.staging import DEFAULT_STAGING, StagingQueue
from chm.sizes import parse_size

__all__ = ["RemoteTierStore", "Tier", "TierOptions", "default_wbuf", "open_tier"]

_MIB = 1 << 20
_DEFAULT_DRAM = 320 * _MIB  # the device's default dram (chm-emu options)


# The settings of an embedded store (path). A daemon's (socket) and the
# remote nodes' (master) stores have their own, from chm-emu serve: given
# with either, they would be ignored, so they are refused.
EMBEDDED_ONLY = (
    "capacity",
    "sparse_overcommit",
    "slot_size",
    "per_rank_dir",
    "backend",
    "mode",
    "eviction",
)


@dataclass
class TierOptions:
    """The tier's configuration as an adapter's config names it."""

    path: str | None = None
    socket: str | None = None
    capacity: str | int = "64G"
    dram: str | int | None = None
    wbuf: str | int | None = None
    slot_size: str | int = "32M"
    backend: str = "auto"
    mode: str = "prefetch"
    eviction: str = "lru"
    flush_interval: float | None = 1.0
    staging: str | int = DEFAULT_STAGING
    sparse_overcommit: bool = False
    per_rank_dir: bool = False
    # remote nodes (master): chm.remote.tierstore.NodesStore
    master: str | None = None
    nodes: str | list[str] | None = None
    secret_file: str | None = None
    host: str | None = None  # this worker's Transfer Engine address
    remote_buffer: str | int | None = None  # default: two store calls, at least 64 MiB
    remote_timeout: float = 10.0  # each load and save on the nodes (seconds)
    # the settings the engine's configuration names (TierOptions' names):
    # those of EMBEDDED_ONLY are refused with socket or master
    given: frozenset[str] = frozenset()


def default_wbuf(
    chunk_bytes: int | None, batch: int, dram: int | str | None, slot: int | str
) -> int | None:
    """The write buffer for ``batch`` chunks of ``chunk_bytes`` (one store call),
    rounded up to MiB and capped so the staging window keeps two slots of the
    DRAM; None (the device's default) when the chunk size is unknown or the
    default is already larger."""
    if not chunk_bytes or batch <= 0:
        return None
    dram_b = parse_size(dram) if dram is not None else _DEFAULT_DRAM
    slot_b = parse_size(slot)
    want = -(-(chunk_bytes + 4096) * batch // _MIB) * _MIB
    cap = dram_b - 2 * slot_b
    wbuf = min(want, cap)
    if wbuf <= 2 * slot_b:  # the device's default with object_size = slot
        return None
    return wbuf


class RemoteTierStore:
    """The daemon's KV store (``chm.remote.RemoteStore``) with the calls the
    adapters use of a :class:`Store`. Pins are the daemon's, taken by each
    load for as long as it runs, so ``pin``/``unpin`` only answer presence."""

    def __init__(self, socket_path: str, namespace: Namespace) -> None:
        import chm

        self.device = chm.connect(socket_path)
        try:
            self.kv = self.device.kv(namespace)
            self.max_block = int(min(self.device.slot_bytes, self.device.area_bytes))
        except BaseException:
            self.device.close()
            raise
        self.namespace = namespace
        self.socket = socket_path

    def contains(self, keys: Any) -> list[bool]:
        return self.kv.contains(keys)

    def prefix_len(self, keys: Any) -> int:
        return self.kv.prefix_len(keys)

    def put(self, keys: Any, srcs: Any, meta: Any = None) -> list[Any]:
        return self.kv.put(keys, srcs, meta)

    def get(self, keys: Any, dsts: Any, timeout: float | None = None) -> list[bool]:
        return self.kv.get(keys, dsts, timeout)

    def load_prefix(self, keys: Any, dsts: Any, timeout: float | None = None) -> int:
        return self.kv.load_prefix(keys, dsts, timeout)

    def info(self, key: Any) -> dict[str, Any] | None:
        return self.kv.entries([key])[0]

    def entries(self, keys: Any) -> list[dict[str, Any] | None]:
        return self.kv.entries(keys)

    def meta(self, keys: Any) -> list[bytes | None]:
        return self.kv.meta(keys)

    def pin(self, keys: Any) -> list[bool]:
        return self.kv.contains(keys)

    def unpin(self, keys: Any) -> None:
        return None

    def remove(self, keys: Any) -> list[bool]:
        return self.kv.remove(keys)

    def flush(self, timeout: float | None = None) -> None:
        self.kv.flush(timeout)

    def stats(self) -> dict[str, Any]:
        return self.kv.stats()

    @property
    def reports_staging(self) -> bool:
        return self.kv.reports_staging

    def report_staging(self, counters: Any) -> bool:
        return self.kv.report_staging(counters)

    @property
    def closed(self) -> bool:
        return bool(self.device.closed)

    def close(self, *, flush: bool = True) -> None:
        if self.device.closed:
            return
        try:
            if flush:
                self.kv.flush()
        finally:
            self.device.close()


class Tier:
    """An opened tier: its store, its staging queue, their stats."""

    def __init__(self, store: Any, staging: StagingQueue, where: str) -> None:
        self.store = store
        self.staging = staging
        self.where = where  # the directory or the socket

    @property
    def remote(self) -> bool:
        return isinstance(self.store, RemoteTierStore)

    @property
    def nodes(self) -> bool:
        """True when the tier is remote storage nodes (``master``)."""
        from chm.remote.tierstore import NodesStore

        return isinstance(self.store, NodesStore)

    def stats(self) -> dict[str, Any]:
        st = self.store.stats()
        out: dict[str, Any] = dict(st if isinstance(st, dict) else st.to_dict())
        out.update({f"staging_{k}": v for k, v in self.staging.stats().to_dict().items()})
        return out

    def close(self, *, flush: bool = True, timeout: float | None = 30.0) -> None:
        """Writes what the staging queue holds (up to ``timeout``), then
        flushes and closes the store."""
        try:
            self.staging.close(timeout)
        finally:
            self.store.close(flush=flush)


def open_tier(
    opts: TierOptions,
    *,
    namespace: Namespace,
    chunk_bytes: int | None = None,
    batch: int = 8,
    rank: int = 0,
    log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    what: str = "chm",
    key_prefix: str = "",
) -> Tier:
    """Opens the tier ``opts`` describes (see the module doc). ``key_prefix``
    is how the engine's configuration spells the options (``"chm."`` in
    LMCache's extra_config), for the messages. Any failure to open is also
    logged at ERROR as ``chm: tier not in use: ...`` before it is raised."""
    log = log or logging.getLogger("chm.integrations")
    try:
        return _open_tier(opts, namespace, chunk_bytes, batch, rank, log, what, key_prefix)
    except BaseException as exc:
        where = opts.master or opts.socket or opts.path
        hint = ""
        if isinstance(exc, Busy):
            hint = (
                f"; give every rank and replica the daemon's {key_prefix}socket "
                f"(chm-emu serve) or set {key_prefix}per_rank_dir"
            )
        log.error(
            "chm: tier not in use: %s: %s%s", where, getattr(exc, "strerror", None) or exc, hint
        )
        raise


def _open_tier(
    opts: TierOptions,
    namespace: Namespace,
    chunk_bytes: int | None,
    batch: int,
    rank: int,
    log: logging.Logger | logging.LoggerAdapter[Any],
    what: str,
    key_prefix: str,
) -> Tier:
    if sum(bool(x) for x in (opts.path, opts.socket, opts.master)) != 1:
        raise InvalidArgument(
            None,
            f"{what}: give exactly one of '{key_prefix}path' (an embedded store, this "
            f"process only), '{key_prefix}socket' (a chm-emu serve daemon, shared by "
            f"every rank) and '{key_prefix}master' (remote nodes' Master, redis://HOST:PORT/DB, "
            "shared by every worker)",
        )
    stray = [n for n in EMBEDDED_ONLY if n in opts.given] if not opts.path else []
    if stray:
        via, owner = (
            ("master", "each node's (chm-emu serve on the node)")
            if opts.master
            else ("socket", "the daemon's (chm-emu serve)")
        )
        raise InvalidArgument(
            None,
            f"{what}: {', '.join(repr(key_prefix + n) for n in stray)}: setting(s) of an "
            f"embedded store ('{key_prefix}path'); with '{key_prefix}{via}' the store and its "
            f"settings are {owner}",
        )
    if opts.flush_interval is not None and opts.flush_interval <= 0:
        opts.flush_interval = None  # 0: no periodic flush
    if opts.master:
        return _open_nodes(opts, namespace, chunk_bytes, batch, log, what, key_prefix)
    for name in ("nodes", "secret_file", "host"):
        if getattr(opts, name):
            raise InvalidArgument(
                None,
                f"{what}: '{key_prefix}{name}' is a setting of remote nodes ({key_prefix}master)",
            )
    if opts.socket:
        for name in ("dram", "wbuf"):
            if getattr(opts, name) is not None:
                raise InvalidArgument(
                    None,
                    f"{what}: '{key_prefix}{name}' is the daemon's setting "
                    f"(chm-emu serve --{name}), not the client's",
                )
        store: Any = RemoteTierStore(os.fspath(opts.socket), namespace)
        try:
            staging = StagingQueue(
                store,
                opts.staging,
                flush_interval=opts.flush_interval,
                name=f"chm[{what}]",
                logger=log,
                # the daemon exports this client's skips (chm_kv_staging_*)
                report=store.report_staging if store.reports_staging else None,
            )
        except BaseException:
            store.close(flush=False)
            raise
        return Tier(store, staging, opts.socket)
    assert opts.path is not None
    directory = Path(opts.path)
    if opts.per_rank_dir:
        directory = directory / f"rank{int(rank)}"
    directory.mkdir(parents=True, exist_ok=True)
    check_fits(
        directory / "kv.img",
        opts.capacity,
        sparse_overcommit=opts.sparse_overcommit,
        option=f"{key_prefix}sparse_overcommit",
    )
    dev_opts: dict[str, Any] = {}
    wbuf = opts.wbuf
    if wbuf is None:
        wbuf = default_wbuf(chunk_bytes, batch, opts.dram, opts.slot_size)
    if wbuf is not None:
        dev_opts["wbuf"] = wbuf
    store = Store.open(
        directory,
        capacity=opts.capacity,
        dram=opts.dram,
        slot_size=opts.slot_size,
        backend=opts.backend,
        mode=opts.mode,
        device_options=dev_opts,
        eviction=opts.eviction,
        namespace=namespace,
        flush_interval=opts.flush_interval,
    )
    try:
        staging = StagingQueue(store, opts.staging, name=f"chm[{what}]", logger=log)
    except BaseException:
        store.close()
        raise
    return Tier(store, staging, os.fspath(directory))


def _open_nodes(
    opts: TierOptions,
    namespace: Namespace,
    chunk_bytes: int | None,
    batch: int,
    log: logging.Logger | logging.LoggerAdapter[Any],
    what: str,
    key_prefix: str,
) -> Tier:
    """The tier on remote storage nodes (``opts.master``). The worker's
    transfer buffer (``remote_buffer``) defaults to two store calls of
    ``batch`` chunks, at least 64 MiB."""
    from chm.remote.tierstore import NodesStore, check_master_url

    assert opts.master is not None
    check_master_url(opts.master, f"{key_prefix}master")
    if not opts.secret_file:
        raise InvalidArgument(
            None,
            f"{what}: '{key_prefix}secret_file' (the nodes' shared secret, mode 0600) is "
            f"required with '{key_prefix}master'",
        )
    for name in ("dram", "wbuf"):
        if getattr(opts, name) is not None:
            raise InvalidArgument(
                None,
                f"{what}: '{key_prefix}{name}' is the nodes' setting "
                f"(chm-emu serve, [device] {name}), not the worker's",
            )
    if not opts.remote_timeout > 0:
        raise InvalidArgument(
            None, f"{what}: the remote nodes' timeout {opts.remote_timeout!r} s: expected > 0"
        )
    if opts.remote_buffer is not None:
        buffer = parse_size(opts.remote_buffer)
    else:
        buffer = max(64 * _MIB, -(-2 * (chunk_bytes or 0) * max(1, batch) // _MIB) * _MIB)
    nodes = opts.nodes
    if isinstance(nodes, str):
        nodes = [n.strip() for n in nodes.split(",") if n.strip()]
    store = NodesStore.open(
        opts.master,
        opts.secret_file,
        namespace=namespace,
        nodes=nodes,
        host=opts.host,
        buffer=buffer,
        timeout=float(opts.remote_timeout),
    )
    try:
        # the nodes flush their own stores: no flusher here
        staging = StagingQueue(store, opts.staging, name=f"chm[{what}]", logger=log)
    except BaseException:
        store.close()
        raise
    log.info(
        "chm: %s tier on remote nodes %s of the Master %s",
        what,
        ",".join(nodes) if nodes else "(every live node)",
        opts.master,
    )
    return Tier(store, staging, opts.master)


def chunk_nbytes(shape: Any, itemsize: int) -> int:
    """Bytes of a chunk of ``shape`` elements of ``itemsize`` bytes."""
    return int(np.prod([int(x) for x in shape], dtype=np.int64)) * int(itemsize)
