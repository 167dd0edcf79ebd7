"""What a daemon is started with (:class:`ServeOptions`), and what its
connections and its TCP front end may use of it (:class:`Host`).

:class:`~chm.daemon.server.Daemon` implements :class:`Host`; the
per-connection handler (:mod:`chm.daemon.connection`) and the TCP front end
(:mod:`chm.daemon.tcp`) are written against :class:`Host` alone, so neither
imports the server that creates them.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import chm
from chm.kv import Store

from .metrics import Metrics
from .sessions import Scopes

__all__ = ["POLL_US", "Host", "NodeHooks", "ServeError", "ServeOptions"]


# the default cap of a connection's poll window (ServeOptions.poll_us):
# clients asking within 200 us of an answer are polled for; longer windows
# bought no latency on a shared 2-vCPU VM for their CPU (docs/daemon.md,
# "Request path performance")
POLL_US = 200


class ServeError(Exception):
    """serve cannot start: the message says why and what to change."""


@dataclass
class ServeOptions:
    device: dict[str, Any]
    socket: str
    group: str | None = None
    kv: bool = True
    journal: str | None = None
    segment_bytes: int | None = None
    eviction: str = "lru"
    area_bytes: int | None = None  # per-client shared area (default: 4 slots, >= 64 MiB)
    force: list[str] = field(default_factory=list)
    metrics: str | None = None  # host:port of a loopback Prometheus endpoint
    max_clients: int = 256
    # request entries (slots + queue) one client's session may hold at once
    # (default: all of the device's, sessions.default_quota)
    client_quota: int | None = None
    # bytes at the top of the device that clients may read and write raw
    # (their addresses 0..raw_bytes-1); None: the whole device without a KV
    # store, none at all with one (its segments are never raw-addressable)
    raw_bytes: int | None = None
    # who may put and remove keys of the shared store (user names, uids,
    # @groups); None: every client that may connect; the others only read
    kv_writers: list[str] | None = None
    listen: str | None = None  # HOST:PORT of a TCP listener (needs secret_file)
    secret_file: str | None = None  # the shared secret TCP clients authenticate with
    # a remote storage node (chm.daemon.node): the Master's redis://HOST:PORT/N,
    # the node's stable name, the address its Transfer Engine listens on
    # (default: --listen's host), and the lease in seconds
    master: str | None = None
    node_name: str | None = None
    data_host: str | None = None
    lease: float = 3.0
    # seconds between flushes of whatever the store holds pending (None: only
    # on request and at close), so a put is durable within about that long
    flush_interval: float | None = None
    hello_timeout: float = 2.0  # seconds a new connection has to send HELLO
    idle_timeout: float = 0.0  # seconds a client may send nothing (0: forever)
    # at max_clients, the client idle longest gives way to a new one if it
    # has been idle this long (0: never)
    idle_reclaim: float = 60.0
    # the longest a connection's thread polls for its client's next request
    # before it sleeps (us; 0: never polls); the window adapts to the
    # client's recent gaps between requests (docs/daemon.md, "The request path")
    poll_us: int = POLL_US


class NodeHooks(Protocol):
    """What the connections and the TCP front end tell a storage node
    (:class:`chm.daemon.node.DaemonNode`)."""

    def attach(self, area: Any) -> tuple[int, dict[str, Any]]:
        """Registers a TCP client's area: its address and the WELCOME fields."""
        ...

    def detach(self, addr: int) -> None:
        """Unregisters a gone client's area."""
        ...

    def stored(self, ks: Any, status: Any) -> None:
        """Publishes what a put stored."""
        ...

    def removed(self, ks: Any, seqs: list[int | None]) -> None:
        """Unpublishes what a remove dropped (each key's put sequence, None
        for a key that was not there)."""
        ...


class Host(Protocol):
    """The daemon as one connection sees it: its device and store, the
    shared pool and per-client area sizes, the scopes of all clients, and
    the daemon-wide counters, log and policy."""

    opts: ServeOptions
    log: logging.Logger
    scopes: Scopes
    stopping: threading.Event
    metrics: Metrics
    dev: chm.Device
    store: Store | None
    instance: str
    client_config: dict[str, Any]
    pool_ro_fd: int
    pool_bytes: int
    area_bytes: int
    slots_total: int
    raw_base: int
    raw_bytes: int
    staging_lock: threading.Lock  # guards each client's KV_STAGING report
    poll_ns: int  # the cap of a connection's poll window (opts.poll_us)
    pollers: threading.BoundedSemaphore  # taken by a connection's thread while it polls

    @property
    def node(self) -> NodeHooks | None:
        """The storage node, when the daemon is one (``--master``)."""
        ...

    def adopt(self, conn: socket.socket, peer: str) -> bool:
        """Serve an authenticated TCP client's inner socket (False: full)."""
        ...

    def may_write(self, pid: int, uid: int, gid: int, tcp: bool = False) -> bool:
        """Whether this peer may put and remove keys of the shared store."""
        ...

    def condemn(self, pairs: list[tuple[int, int]]) -> None:
        """Remove keys a client found damaged (now, or once unpinned)."""
        ...

    def retry_condemned(self) -> None:
        """Remove the condemned keys no longer pinned."""
        ...

    def count(self, name: str, n: int = 1) -> None:
        """Add n to one of the daemon's counters."""
        ...

    def polled(self, hit: bool, ns: int, gave_way: bool = False) -> None:
        """Count one poll of a connection for its client's next request:
        whether the request came while polling, the ns it lasted, and
        whether it gave way to something else wanting the CPU."""
        ...

    def retire_staging(self, report: dict[str, int] | None) -> None:
        """Fold a departing client's staging counters into the totals."""
        ...

    def stats(self) -> dict[str, Any]:
        """The device, KV, held and daemon counters (the STATS answer)."""
        ...
