"""The daemon behind ``chm-emu serve``: one device and one KV store for local clients.

    d = Daemon(ServeOptions(device={...}, socket="/run/chm/chm.sock"))
    d.start()                 # opens device + store, listens
    d.serve_forever()         # until stop() (SIGTERM/SIGINT in the command)
    d.close()                 # flush, journal, close

The DRAM pool must be shareable (memfd, or a file/devdax pool): each client
gets it read-only (an O_RDONLY descriptor of a pool sealed against future
writes), so staged objects are read with zero copies.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import json
import logging
import os
import pwd
import socket
import stat
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import chm
from chm.errors import Busy, ChmError
from chm.kv import KEY_DTYPE, Store
from chm.remote.protocol import MAX_FRAME, Op, config_options, encode, read_secret

from .connection import Client
from .devices import check_target, reason_key
from .metrics import Metrics
from .node import DaemonNode
from .options import ServeError, ServeOptions
from .sessions import Scopes, default_quota
from .tcp import TcpFront

__all__ = ["Daemon", "JsonFormatter", "ServeError", "ServeOptions"]

_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_F_SEAL_FUTURE_WRITE = 0x0010  # linux/fcntl.h; not exported by Python's fcntl


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, msg and the record's extra fields."""

    _STD: ClassVar[frozenset[str]] = frozenset(vars(logging.makeLogRecord({})))

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in self._STD and k not in ("message", "asctime"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _refusals(targets: list[str], force: list[str]) -> list[str]:
    errors = []
    for t in targets:
        for r in check_target(t):
            key = reason_key(r)
            if key not in force:
                errors.append(f"{t}: {r} (pass --force {key} to use it anyway)")
    return errors


def _size_of(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise ServeError(f"{path}: {exc.strerror}") from None
    try:
        return os.lseek(fd, 0, os.SEEK_END)  # block devices too
    finally:
        os.close(fd)


def _targets_capacity(targets: list[str]) -> int:
    """No capacity given: what the targets hold, striped evenly (1 MiB units)."""
    sizes = [_size_of(t) for t in targets]
    if not all(sizes):
        missing = [t for t, n in zip(targets, sizes, strict=True) if not n]
        raise ServeError(f"no --capacity given and {', '.join(missing)} has no size yet")
    unit = 1 << 20
    return min(sizes) // unit * unit * len(targets)


class Daemon:
    def __init__(self, opts: ServeOptions, log: logging.Logger | None = None) -> None:
        self.opts = opts
        self.log = log or logging.getLogger("chm.serve")
        self.scopes = Scopes()
        self.stopping = threading.Event()
        self.instance = uuid.uuid4().hex
        self._clients: dict[int, tuple[Client, threading.Thread]] = {}
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {
            "clients_total": 0,
            "clients_refused": 0,
            "protocol_errors": 0,
            "kv_lookup_hits": 0,
            "kv_checksum_errors": 0,
            "kv_checksum_reports_ignored": 0,
            "idle_timeouts": 0,
            "idle_reclaimed": 0,
            "handshakes_dropped": 0,
            "tcp_bytes_staged": 0,
            # connection threads polling for their client's next request
            # (connection.Client._polled): requests found by polling, polls
            # that ended without one (of which those that gave way to
            # something else wanting the CPU), and the ns spent polling
            "poll_hits": 0,
            "poll_misses": 0,
            "poll_gave_way": 0,
            "poll_ns": 0,
        }
        self._condemned: set[tuple[int, int]] = set()
        # clients' staging-queue reports (KV_STAGING): the live ones are read
        # from each client; a gone client's counters are folded in here
        self.staging_lock = threading.Lock()
        # connection threads polling for their client's next request at once:
        # at most all CPUs but one, so polling never takes every CPU
        self.poll_ns = max(0, int(opts.poll_us)) * 1000
        self.pollers = threading.BoundedSemaphore(max(1, (os.cpu_count() or 1) - 1))
        self._staging_gone: dict[str, int] = dict.fromkeys(_STAGING_TOTALS, 0)
        self._refusing = threading.BoundedSemaphore(16)
        self.raw_base = 0
        self.raw_bytes = 0
        self._writer_uids: set[int] | None = None
        self._writer_gids: set[int] = set()
        self._next_cid = 1
        self.dev: chm.Device
        self.store: Store | None = None
        self.pool_ro_fd = -1
        self._listener: socket.socket | None = None
        self.tcp: TcpFront | None = None
        self.node: DaemonNode | None = None
        self.metrics = Metrics(self.stats)
        self.started = time.time()

    # ---- start / stop

    def start(self) -> None:
        o = self.opts
        dev_opts = dict(o.device)
        targets = [str(t) for t in dev_opts.get("targets") or []]
        if not targets:
            raise ServeError("no targets: name block devices or files with --target")
        refused = _refusals(targets, o.force)
        if refused:
            raise ServeError("refusing unsafe targets:\n  " + "\n  ".join(refused))
        if "capacity" not in dev_opts:
            dev_opts["capacity"] = _targets_capacity(targets)
        dev_opts.setdefault("pool", "memfd")
        if dev_opts["pool"] not in ("memfd", "file"):
            raise ServeError(
                f"pool={dev_opts['pool']!r} cannot be shared with clients: use pool=memfd, "
                "or pool=file with pool_path (a file or a devdax device)"
            )
        try:
            self.dev = chm.Device.open(**dev_opts)
        except ChmError as exc:
            raise ServeError(f"could not open the device: {exc}") from exc
        try:
            self._share_pool()
            cfg = self.dev.config
            self.client_config = config_options(cfg.to_dict())
            self.slots_total = int(self.dev.stats().slots_total)
            queue = int(cfg.to_dict()["refill_queue"])
            self.scopes.quota = o.client_quota or default_quota(cfg.slot_count, queue)
            self.pool_bytes = int(self.dev.stats().pool_bytes)
            area = o.area_bytes or max(64 << 20, 4 * cfg.slot_bytes)
            self.area_bytes = -(-area // 4096) * 4096
            self._writers()
            cap = int(cfg.capacity)
            kv = o.kv and cfg.mode == "prefetch"
            self.raw_bytes = cap if not kv else (o.raw_bytes or 0)
            if kv and self.raw_bytes:
                unit = 1 << 20
                if self.raw_bytes % unit or self.raw_bytes >= cap:
                    raise ServeError(
                        f"raw_bytes={self.raw_bytes}: a multiple of 1 MiB below the capacity "
                        f"({cap}), so the KV store keeps the rest"
                    )
            self.raw_base = cap - self.raw_bytes
            if kv:
                kw: dict[str, Any] = {"eviction": o.eviction, "flush_interval": o.flush_interval}
                if o.segment_bytes:
                    kw["segment_bytes"] = o.segment_bytes
                if self.raw_bytes:
                    kw["capacity"] = self.raw_base  # [0, raw_base): its segments only
                try:
                    self.store = Store(self.dev, journal=o.journal, **kw)
                except ChmError as exc:
                    raise ServeError(f"could not open the KV store: {exc}") from exc
            self._listen()
            if o.listen:
                self._listen_tcp()
            if o.master:
                self._become_node()
            if o.metrics:
                try:
                    self.metrics.serve(o.metrics)
                except (OSError, ValueError) as exc:
                    raise ServeError(f"--metrics {o.metrics}: {exc}") from None
        except BaseException:
            self.close()
            raise
        st = self.store.stats() if self.store is not None else None
        self.log.info(
            "serving",
            extra={
                "event": "start",
                "socket": o.socket,
                "pid": os.getpid(),
                "targets": targets,
                "capacity": cfg.capacity,
                "mode": cfg.mode,
                "backend": cfg.backend,
                "pool": cfg.to_dict()["pool_kind"],
                "pool_bytes": self.pool_bytes,
                "kv": self.store is not None,
                "raw_bytes": self.raw_bytes,
                "listen": _hostport(self.tcp.address) if self.tcp is not None else None,
                "kv_writers": o.kv_writers,
                "node": None
                if self.node is None
                else {
                    "name": self.node.name,
                    "id": self.node.node,
                    "epoch": self.node.epoch,
                    "data": self.node.engine.endpoint,
                    "control": self.node.control,
                },
                "recovered_entries": st.recovered_entries if st else 0,
                "journal": st.journal_path if st else None,
            },
        )

    def _share_pool(self) -> None:
        """A read-only descriptor of the pool for clients; memfd pools are
        sealed against future writes first, so no client can map it writable."""
        cfg = self.dev.config.to_dict()
        if cfg["pool_kind"] == "memfd":
            fd = self.dev.pool_fd()
            fcntl.fcntl(fd, _F_ADD_SEALS, _F_SEAL_FUTURE_WRITE)
            self.pool_ro_fd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        else:
            self.pool_ro_fd = os.open(cfg["pool_path"], os.O_RDONLY | os.O_CLOEXEC)

    def _listen(self) -> None:
        path = self.opts.socket
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() or p.is_symlink():
            if not stat.S_ISSOCK(p.lstat().st_mode):
                raise ServeError(f"socket path {path} exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                probe.connect(path)
            except OSError:
                p.unlink()  # left by a daemon that died
            else:
                raise ServeError(f"another daemon is serving on {path}")
            finally:
                probe.close()
        gid = -1
        if self.opts.group:
            try:
                gid = grp.getgrnam(self.opts.group).gr_gid
            except KeyError:
                raise ServeError(f"group {self.opts.group!r} does not exist") from None
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        old = os.umask(0o117)  # created 0660: never a moment with wider access
        try:
            s.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o660)
        if gid >= 0:
            os.chown(path, -1, gid)
        s.listen(64)
        s.settimeout(0.2)
        self._listener = s

    def _listen_tcp(self) -> None:
        o = self.opts
        if not o.secret_file:
            raise ServeError(f"--listen {o.listen}: TCP clients need --secret-file")
        try:
            secret = read_secret(o.secret_file)
        except (OSError, ValueError) as exc:
            raise ServeError(f"--secret-file {o.secret_file}: {exc}") from None
        try:
            self.tcp = TcpFront(self, o.listen or "", secret)
        except (OSError, ValueError) as exc:
            raise ServeError(f"--listen {o.listen}: {exc}") from None
        self.tcp.start()

    def _become_node(self) -> None:
        """Registers with the Master as a remote storage node (chm.daemon.node)."""
        o = self.opts
        assert o.master is not None
        if self.tcp is None or not o.node_name:
            raise ServeError("--master needs --listen and --node-name: workers dial the node")
        if self.store is None:
            raise ServeError("--master needs the KV store (prefetch mode, no --no-kv)")
        host = str(self.tcp.address[0])
        data = o.data_host or host
        if data in ("0.0.0.0", "::", ""):
            raise ServeError(
                f"--listen {o.listen} listens on every address: name the one workers "
                "reach with --data-host"
            )
        ctl = data if host in ("0.0.0.0", "::", "") else host
        try:
            self.node = DaemonNode(
                self,
                o.master,
                o.node_name,
                data_host=data,
                control=_hostport((ctl, self.tcp.address[1])),
                lease=o.lease,
            )
        except (ChmError, OSError) as exc:
            raise ServeError(f"--master {o.master}: {exc}") from None

    def serve_forever(self) -> None:
        assert self._listener is not None
        while not self.stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self.stopping.is_set():
                    break
                raise
            conn.setblocking(True)
            self._accept(conn)
        self._stop_clients()

    def adopt(self, conn: socket.socket, peer: str) -> bool:
        """Serves an authenticated TCP client's end of a socket pair as a
        client like any other; False when the daemon is full."""
        return self._accept(conn, peer)

    def _accept(self, conn: socket.socket, peer: str | None = None) -> bool:
        self._await_departures()
        with self._lock:
            self._reap()
            if len(self._clients) >= self.opts.max_clients:
                # a connection that has not said HELLO yet gives way to a new
                # one: silent connections cannot lock real clients out
                silent = [c for c, _ in self._clients.values() if not c.greeted and not c.evicted]
                idle = self._idlest()
                if silent:
                    victim = min(silent, key=lambda c: c.cid)
                    victim.evict(
                        "no HELLO yet and the daemon is full: dropped for a new connection"
                    )
                    self._counts["handshakes_dropped"] += 1
                elif idle is not None:
                    idle.evict(
                        f"idle for {time.monotonic() - idle.last_active:.0f} s while the "
                        "daemon is full: disconnected for a new client (idle_reclaim)",
                        tell=True,
                    )
                    self._counts["idle_reclaimed"] += 1
                else:
                    self._counts["clients_refused"] += 1
                    if peer is not None:  # the TCP front end says so
                        conn.close()
                        return False
                    self._refuse(conn)
                    return False
            cid = self._next_cid
            self._next_cid += 1
            self._counts["clients_total"] += 1
        try:
            c = Client(self, conn, cid, peer)
        except (ChmError, OSError) as exc:  # e.g. no device session left for it
            with self._lock:
                self._counts["clients_refused"] += 1
            msg = f"cannot serve another client: {exc.strerror or exc}"
            err = exc.errno or errno.EIO
            with contextlib.suppress(OSError):
                conn.settimeout(0.5)
                conn.send(encode(Op.ERROR, 0, {"errno": err, "message": msg, "fatal": True}))
            conn.close()
            self.log.warning(msg, extra={"event": "refuse", "client": cid})
            return False
        t = threading.Thread(target=c.run, name=f"chm-client-{cid}", daemon=True)
        with self._lock:
            self._clients[cid] = (c, t)
        t.start()
        return True

    def _await_departures(self, limit: float = 1.0) -> None:
        """When the daemon is full, waits (up to ``limit`` s) for the
        threads of clients that have already hung up to finish their
        cleanup, so a client closing and reconnecting at once is not refused
        on account of its own closed connection."""
        with self._lock:
            self._reap()
            if len(self._clients) < self.opts.max_clients:
                return
            leaving = [t for c, t in self._clients.values() if c.hung_up()]
        end = time.monotonic() + limit
        for t in leaving:
            t.join(max(0.0, end - time.monotonic()))

    def _idlest(self) -> Client | None:
        """The client idle longest, if idle at least idle_reclaim seconds."""
        limit = self.opts.idle_reclaim
        if not limit:
            return None
        now = time.monotonic()
        idle = [
            c
            for c, _ in self._clients.values()
            if c.greeted and not c.evicted and not c.busy and now - c.last_active >= limit
        ]
        return min(idle, key=lambda c: c.last_active) if idle else None

    def _refuse(self, conn: socket.socket) -> None:
        """Tells a connection the daemon is full (a fatal ERROR), then closes it."""
        n = self.opts.max_clients
        msg = f"the daemon is full: {n} clients connected (max_clients {n}); try again later"
        with contextlib.suppress(OSError):
            conn.settimeout(0.5)
            conn.send(encode(Op.ERROR, 0, {"errno": errno.EBUSY, "message": msg, "fatal": True}))
        self.log.warning(
            "client refused: too many clients", extra={"event": "refuse", "max_clients": n}
        )
        if self._refusing.acquire(blocking=False):  # a few at a time; past that, closed at once
            threading.Thread(target=self._linger, args=(conn,), daemon=True).start()
        else:
            conn.close()

    def _linger(self, conn: socket.socket) -> None:
        """Reads what a refused client sends until it hangs up (at most 1 s):
        closing with its HELLO unread would reset the connection, and the
        client would lose the ERROR that says why."""
        try:
            end = time.monotonic() + 1.0
            with contextlib.suppress(OSError):
                while (left := end - time.monotonic()) > 0:
                    conn.settimeout(left)
                    if not conn.recv(MAX_FRAME + 1):
                        break
        finally:
            conn.close()
            self._refusing.release()

    def _reap(self) -> None:
        for cid in [k for k, (_, t) in self._clients.items() if not t.is_alive()]:
            del self._clients[cid]

    def stop(self) -> None:
        """Asks serve_forever() to return (safe from a signal handler)."""
        self.stopping.set()

    def _stop_clients(self) -> None:
        with self._lock:
            live = list(self._clients.values())
        for c, _ in live:
            with contextlib.suppress(OSError):
                c.sock.shutdown(socket.SHUT_RDWR)
        for _, t in live:
            t.join(timeout=5.0)

    def close(self) -> None:
        """Flushes and journals the store, then closes everything (idempotent)."""
        self.stopping.set()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(OSError):
                os.unlink(self.opts.socket)
        if self.node is not None:  # first: workers stop finding this node's blocks
            with contextlib.suppress(ChmError):
                self.node.close()
        if self.tcp is not None:
            self.tcp.close()
            self.tcp = None
        self._stop_clients()
        self.metrics.close()
        # A shutdown that cannot write everything back (a full backing
        # filesystem, a failing disk) reports the loss and still closes
        # everything, rather than dying with the device half open.
        if self.store is not None:
            st = self.store
            self.store = None
            try:
                try:
                    st.flush(timeout=30.0)
                    entries = len(st)
                finally:
                    st.close()
            except ChmError as exc:
                self.log.error(f"closing the KV store: {exc}", extra={"event": "lost"})
            else:
                self.log.info(
                    "store flushed and journaled", extra={"event": "flush", "entries": entries}
                )
        if self.pool_ro_fd >= 0:
            os.close(self.pool_ro_fd)
            self.pool_ro_fd = -1
        dev = getattr(self, "dev", None)
        if dev is not None and not dev.closed:
            try:
                try:
                    dev.flush(timeout=30.0)
                finally:
                    dev.close()
            except ChmError as exc:
                self.log.error(f"closing the device: {exc}", extra={"event": "lost"})

    # ---- rights and blocks to drop

    def _writers(self) -> None:
        spec = self.opts.kv_writers
        if spec is None:
            return
        self._writer_uids = set()
        for w in spec:
            try:
                if w == "tcp":  # every authenticated TCP client
                    continue
                if w.startswith("@"):
                    self._writer_gids.add(grp.getgrnam(w[1:]).gr_gid)
                elif w.isdigit():
                    self._writer_uids.add(int(w))
                else:
                    self._writer_uids.add(pwd.getpwnam(w).pw_uid)
            except KeyError:
                what = "group" if w.startswith("@") else "user"
                raise ServeError(f"kv_writers: no {what} {w.lstrip('@')!r}") from None

    def may_write(self, pid: int, uid: int, gid: int, tcp: bool = False) -> bool:
        """Whether a client (its SO_PEERCRED) may put and remove shared keys;
        a TCP client has no credentials: it may if ``tcp`` is a writer."""
        if self._writer_uids is None:
            return True
        if tcp:
            return "tcp" in (self.opts.kv_writers or [])
        if uid in self._writer_uids or gid in self._writer_gids:
            return True
        return bool(self._writer_gids & _groups_of(pid))

    def condemn(self, pairs: list[tuple[int, int]]) -> None:
        """Drops blocks a client found corrupt: now, or once no client holds them."""
        with self._lock:
            self._condemned.update(pairs)
        self.retry_condemned()

    def retry_condemned(self) -> None:
        with self._lock:
            todo, st = list(self._condemned), self.store
        if not todo or st is None:
            return
        for p in todo:
            ks = np.zeros(1, dtype=KEY_DTYPE)
            ks[0] = p
            try:
                seqs = st.remove_seqs(ks)
                if self.node is not None:
                    self.node.removed(ks, seqs)
            except Busy:  # another client still loads it: later
                continue
            except ChmError as exc:
                self.log.warning(
                    "could not drop a corrupt block",
                    extra={"event": "bad_block", "error": str(exc)},
                )
            with self._lock:
                self._condemned.discard(p)

    # ---- clients' staging queues

    def retire_staging(self, report: dict[str, int] | None) -> None:
        """Folds a departing client's staging counters into the totals (what
        it had queued goes with it)."""
        if report is None:
            return
        with self.staging_lock:
            for k in _STAGING_TOTALS:
                self._staging_gone[k] += report[k]

    def staging_stats(self) -> dict[str, int]:
        """The staging queues of the clients that report them (KV_STAGING):
        what the live ones hold now, and totals over every client so far."""
        with self._lock:
            live = [c for c, _ in self._clients.values()]
        with self.staging_lock:
            reports = [c.staging for c in live if c.staging is not None]
            totals = dict(self._staging_gone)
        for r in reports:
            for k in _STAGING_TOTALS:
                totals[k] += r[k]
        out = {
            "clients": len(reports),
            "queued_bytes": sum(r["queued_bytes"] for r in reports),
            "capacity_bytes": sum(r["capacity_bytes"] for r in reports),
        }
        for k in _STAGING_TOTALS:
            out[f"{k}_total"] = totals[k]
        out["skipped_total"] = totals["skipped_full"] + totals["skipped_timeout"]
        return out

    # ---- introspection

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def polled(self, hit: bool, ns: int, gave_way: bool = False) -> None:
        with self._lock:
            self._counts["poll_hits" if hit else "poll_misses"] += 1
            self._counts["poll_ns"] += ns
            self._counts["poll_gave_way"] += gave_way

    def stats(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self._counts)
        return {
            "device": self.dev.stats().to_dict(),
            "kv": self.store.stats().to_dict() if self.store is not None else None,
            "held": self.scopes.held(),
            "staging": self.staging_stats(),
            "node": None
            if self.node is None
            else {**self.node.health(), "bytes_staged_tcp": counts["tcp_bytes_staged"]},
            "daemon": {
                **counts,
                "pid": os.getpid(),
                "instance": self.instance,
                "uptime_s": round(time.time() - self.started, 3),
                "socket": self.opts.socket,
            },
        }


_STAGING_TOTALS = ("submitted_blocks", "stored_blocks", "skipped_full", "skipped_timeout")


def _hostport(addr: tuple[Any, ...]) -> str:
    host = str(addr[0])
    return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"


def _groups_of(pid: int) -> set[int]:
    """The supplementary groups of a process (empty if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


def setup_logging(level: str = "info") -> logging.Logger:
    log = logging.getLogger("chm.serve")
    log.handlers.clear()
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(JsonFormatter())
    log.addHandler(h)
    log.setLevel(level.upper())
    log.propagate = False
    return log
