"""One client connection of the daemon: handshake, then one request at a time.

Runs in a thread of its own. Every protocol violation (see
:mod:`chm.remote.protocol`) ends this connection only, with the reason
logged; whatever the client held is released when the connection ends, for
whatever reason.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import logging
import mmap
import os
import select
import socket
import struct
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from chm.errors import ChmError
from chm.kv import KEY_DTYPE, MAX_META
from chm.remote.protocol import (
    MAX_BATCH,
    MAX_FRAME,
    QUIET,
    STAGING_COUNTERS,
    VERSION,
    VERSIONS,
    Op,
    ProtocolError,
    decode,
    encode,
    send_fds,
)

from .sessions import RETAIN

if TYPE_CHECKING:
    from .options import Host

__all__ = ["Client", "poll_window"]

_FOREVER = 2**64 - 1  # a timeout_ns that never ends (UINT64_MAX)
_SLICE_NS = 50_000_000  # a wait re-checks the connection and shutdown this often
# A connection's thread polls for its client's next request before it
# sleeps (a thread woken from sleep costs tens of us on a VM), for a window
# learnt from the client's recent gaps between an answer and its next
# request (Client._learn): up to ServeOptions.poll_us, never when the
# client's gaps are all longer than that, so an idle client costs no CPU.
_GAPS = 16  # the gaps a window is learnt from
_MIN_WINDOW_NS = 50_000  # the shortest window, when it polls at all
_SLACK_NS = 20_000  # beyond 1.5 times the longest recent gap
# a try of a poll that comes back this late found the CPU wanted by
# something else (the client itself, when it shares the CPU, another
# thread or process): the thread sleeps
_CONTENDED_NS = 50_000
# this late: something else ran for a scheduler slice; the thread does not
# poll again for _BACKOFF_NS
_TAKEN_NS = 500_000
_BACKOFF_NS = 100_000_000

_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4)


class _Gone(Exception):
    """The client hung up (not a protocol error); the reason for the log."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Idle(Exception):
    """The client sent nothing for idle_timeout seconds."""


def poll_window(gaps: Iterable[int], cap: int) -> int:
    """ns to poll for a client's next request, from its recent gaps (ns
    from serving a request to its next one): 1.5 times the longest gap
    within ``cap`` plus a margin (at least _MIN_WINDOW_NS), at most ``cap``;
    0 (sleep at once) when every gap was longer than ``cap``, so a client
    that asks seldom, or has gone quiet, is not polled for."""
    near = [g for g in gaps if g <= cap]
    if not near:
        return 0
    return min(cap, max(_MIN_WINDOW_NS, max(near) * 3 // 2 + _SLACK_NS))


def _errname(err: int) -> str:
    return errno.errorcode.get(err, f"errno {err}")


def _proc_state(pid: int) -> str | None:
    """The state letter of a process (R, S, Z, ...), None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :][:1].decode() or None


def _int(v: Any, what: str, lo: int = 0, hi: int = 2**64 - 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ProtocolError(f"{what}: expected an integer in [{lo}, {hi}], got {v!r}")
    return v


def _tokens(v: Any, what: str) -> list[int]:
    """A list of at most MAX_BATCH tokens (unsigned 64-bit integers)."""
    toks = _list(v, what)
    if all(type(t) is int for t in toks) and (not toks or (min(toks) >= 0 and max(toks) < 2**64)):
        return toks
    return [_int(t, "token") for t in toks]  # says which is wrong


def _list(v: Any, what: str, width: int | None = None) -> list[Any]:
    if not isinstance(v, list) or len(v) > MAX_BATCH:
        raise ProtocolError(f"{what}: expected a list of at most {MAX_BATCH} elements")
    if width is not None:
        for e in v:
            if not isinstance(e, list) or len(e) != width:
                raise ProtocolError(f"{what}: every element is a list of {width}")
    return v


def _keys(pairs: list[Any], what: str) -> np.ndarray[Any, Any]:
    ks = np.zeros(len(pairs), dtype=KEY_DTYPE)
    for j, p in enumerate(pairs):
        ks[j] = (_int(p[0], f"{what} hi"), _int(p[1], f"{what} lo"))
    return ks


def _wrc(r: bool | ChmError) -> int:
    """One element of WRITE's answer: 1 admitted, 0 skipped, -errno."""
    if isinstance(r, ChmError):
        return -(r.errno or errno.EIO)
    return 1 if r else 0


class Client:
    """A connected client: its socket, shared area and scope."""

    def __init__(
        self, daemon: Host, sock: socket.socket, cid: int, peer: str | None = None
    ) -> None:
        self.d = daemon
        self.sock = sock
        self.cid = cid
        self.seq = 0
        self.version = 0  # the protocol version of its HELLO
        self.peer = peer  # "HOST:PORT" of a TCP client (through the front end)
        if peer is None:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            self.pid, self.uid, self.gid = struct.unpack("3i", creds)
        else:
            self.pid = self.uid = self.gid = -1
        self.area: mmap.mmap | None = None
        self.area_np: np.ndarray[Any, Any] | None = None
        self.area_fd = -1
        self.scope = daemon.scopes.open(daemon.dev, daemon.store)
        self.kv_write = daemon.may_write(self.pid, self.uid, self.gid, tcp=peer is not None)
        self.greeted = False  # HELLO answered
        self.busy = False  # a request is being served
        self.last_active = time.monotonic()
        self._gaps: collections.deque[int] = collections.deque(maxlen=_GAPS)
        self._window = 0  # ns to poll for the next request (see _learn)
        self._calm_at = 0  # perf_counter_ns before which it does not poll (_polled)
        self.evicted: str | None = None  # why the daemon ended it before HELLO
        self.staging: dict[str, int] | None = None  # its last KV_STAGING report

    # ---- lifecycle

    def run(self) -> None:
        reason = "closed by the client"
        level = logging.INFO
        try:
            self._hello()
            while True:
                self.busy = False
                op, seq, body = self._recv(self.d.opts.idle_timeout or None)
                self.busy = True
                self.last_active = time.monotonic()
                if op == Op.BYE and self.version >= 3:
                    break
                if seq != self.seq + 1:
                    raise ProtocolError(f"out-of-order seq {seq} (expected {self.seq + 1})")
                self.seq = seq
                t0 = time.perf_counter()
                if op in QUIET:  # no answer: the client does not wait for one
                    self._quiet(op, body)
                    self.d.metrics.observe(op.name, time.perf_counter() - t0)
                    continue
                try:
                    reply = self._dispatch(op, body)
                except ChmError as exc:  # the request failed: this client's answer
                    self._check_alone(op)
                    self._fail(op, exc.errno or errno.EIO, exc.strerror or str(exc))
                    continue
                except (ProtocolError, _Gone, OSError):
                    raise
                except Exception as exc:  # a daemon bug: answered, logged, serving on
                    self.d.log.exception(
                        "request failed", extra={"client": self.cid, "op": op.name}
                    )
                    self._check_alone(op)
                    self._fail(op, errno.EIO, f"internal error: {type(exc).__name__}: {exc}")
                    continue
                self.d.metrics.observe(op.name, time.perf_counter() - t0)
                self._check_alone(op)
                self.sock.send(encode(op, seq, reply))
        except _Gone as gone:
            reason = gone.reason
        except _Idle as idle:
            reason = str(idle)
            self.d.count("idle_timeouts")
            self._error(errno.ETIMEDOUT, reason)
        except ProtocolError as exc:
            reason, level = f"protocol error: {exc}", logging.WARNING
            self.d.count("protocol_errors")
            self._error(errno.EPROTO, str(exc))
        except OSError as exc:
            reason = self._lost(exc)
        except Exception as exc:  # a daemon bug: log it, keep serving the others
            reason, level = f"internal error: {type(exc).__name__}: {exc}", logging.ERROR
            self.d.log.exception("client handler failed", extra={"client": self.cid})
        finally:
            self.d.retire_staging(self.staging)
            self.staging = None
            handles, pins = self.d.scopes.close(self.scope)
            self._close()
            self.d.retry_condemned()
            self.d.log.log(
                level,
                "client disconnected",
                extra={
                    "event": "disconnect",
                    "client": self.cid,
                    "reason": reason,
                    "released_handles": handles,
                    "released_pins": pins,
                    "pid": self.pid,
                },
            )

    def _quiet(self, op: Op, body: Any) -> None:
        """A request without an answer (RELEASE_QUIET, KV_DONE_QUIET): a
        failure as a whole is logged (the client learns of nothing, as it
        asked); a malformed one is a protocol error as any."""
        if self.version < 4:
            raise ProtocolError(f"{op.name} is a version 4 request")
        try:
            self._dispatch(op, body)
        except ChmError as exc:
            self.d.log.warning(
                "unanswered request failed",
                extra={"client": self.cid, "op": op.name, "errno": exc.errno},
            )

    def _fail(self, op: Op, err: int, message: str) -> None:
        """Answers a request that failed as a whole: a non-fatal ERROR
        (version 3). A version 1 or 2 client reads any ERROR as the end of
        its connection, so for it the connection does end, saying why."""
        body = {"errno": err, "message": f"{op.name}: {message}", "fatal": self.version < 3}
        self.sock.send(encode(Op.ERROR, self.seq, body))
        if self.version < 3:
            raise _Gone(f"{op.name} failed ({_errname(err)}) on a version {self.version} client")

    def _check_alone(self, op: Op) -> None:
        """A request that arrived before this answer went out is a protocol
        error (one request at a time); a hang-up is the client gone."""
        r, _, _ = select.select([self.sock], [], [], 0)
        if r:
            try:
                peek = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if not peek:
                raise _Gone(self._vanished())
            raise ProtocolError(f"a request arrived before the answer to {op.name}")

    def evict(self, reason: str, tell: bool = False) -> None:
        """Ends the connection from the accept loop (a silent one, or an
        idle one when the daemon is full); ``tell``: with a fatal ERROR
        (ETIMEDOUT) saying why, which the client reads on its next call."""
        self.evicted = reason
        if tell:
            self._error(errno.ETIMEDOUT, reason)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _vanished(self) -> str:
        """Why the connection ended without BYE: the client process died
        (killed or exited without closing), or it dropped the connection."""
        if self.evicted:
            return self.evicted
        if self.peer is not None:
            return f"the TCP client {self.peer} closed the connection without BYE"
        for _ in range(20):  # the kernel closes a dying process's sockets first
            state = _proc_state(self.pid)
            if state in (None, "Z", "X"):
                return f"the client died (process {self.pid} is gone: killed or exited)"
            time.sleep(0.005)
        if self.version < 3:  # no BYE in its protocol: an orderly close
            return "closed by the client"
        return f"the client dropped the connection without BYE (process {self.pid} is alive)"

    def _lost(self, exc: OSError) -> str:
        name = _errname(exc.errno or 0)
        if exc.errno == errno.ECONNRESET:
            return f"connection reset by the client ({name}); {self._vanished()}"
        if exc.errno == errno.EPIPE:
            return f"the client went away before its answer ({name}); {self._vanished()}"
        return f"connection error: {exc.strerror or exc} ({name})"

    def hung_up(self) -> bool:
        """Whether the peer has closed its end (its thread is, or is about
        to be, cleaning up): a client that reconnects at once must not find
        its own old connection still counted against max_clients."""
        try:
            p = select.poll()
            p.register(self.sock, select.POLLRDHUP | select.POLLHUP)
            return bool(p.poll(0))
        except (OSError, ValueError):  # already closed by its thread
            return True

    def _close(self) -> None:
        self.area_np = None
        if self.area is not None:
            # a store call may still view it: then it goes with the object
            with contextlib.suppress(BufferError):
                self.area.close()
        if self.area_fd >= 0:
            os.close(self.area_fd)
            self.area_fd = -1
        # requests it sent that will not be answered: read, so the close does
        # not reset the connection before the client reads our last ERROR
        with contextlib.suppress(OSError):
            for _ in range(64):
                if not self.sock.recv(MAX_FRAME + 1, socket.MSG_DONTWAIT):
                    break
        self.sock.close()

    def _error(self, err: int, message: str) -> None:
        body = {"errno": err, "message": message, "fatal": True}
        with contextlib.suppress(OSError, ProtocolError):
            self.sock.send(encode(Op.ERROR, self.seq, body))

    def _recv(self, timeout: float | None = None, hello: bool = False) -> tuple[Op, int, Any]:
        # called as soon as the last request was served (or HELLO answered):
        # from here to the next packet is the client's gap
        asked = time.perf_counter_ns()
        poll = self._window and asked >= self._calm_at
        got = self._polled(self._window) if poll else None
        if got is None:
            if timeout is not None:
                r, _, _ = select.select([self.sock], [], [], timeout)
                if not r:
                    if hello:
                        raise ProtocolError(f"no HELLO within {timeout:g} s")
                    raise _Idle(f"idle for {timeout:g} s (idle_timeout): the connection is closed")
            got = self.sock.recvmsg(MAX_FRAME + 1)
        if not hello:
            self._learn(time.perf_counter_ns() - asked)
        data, _, flags, _ = got
        if not data:
            raise _Gone(self._vanished())
        if flags & socket.MSG_TRUNC or len(data) > MAX_FRAME:
            raise ProtocolError(f"oversized packet (more than {MAX_FRAME} bytes)")
        return decode(data)

    def _learn(self, gap: int) -> None:
        """Sets the next poll window from this client's last gaps (ns from
        serving a request to its next one), see :func:`poll_window`."""
        self._gaps.append(gap)
        self._window = poll_window(self._gaps, self.d.poll_ns)

    def _polled(self, window: int) -> Any:
        """The next packet if it arrives within ``window`` ns of polling,
        else None: a thread woken from sleep costs tens of us on a VM, more
        than a short request takes (docs/daemon.md, "The request path").
        At most Host.pollers threads poll at once (the others sleep at
        once). A poll yields its CPU between tries, so a client or another
        connection waiting for that CPU runs first; a try that comes back
        late because something else ran ends the poll (the thread sleeps),
        and one that comes back a scheduler slice late (another process
        wants this CPU) stops polling for _BACKOFF_NS: polling only uses a
        CPU nothing else wants, a busy CPU wakes a sleeping thread cheaply
        anyway (no idle vCPU to bring back), and a woken thread is
        scheduled sooner than one that keeps yielding."""
        if not self.d.pollers.acquire(blocking=False):
            return None
        got = None
        start = last = now = time.perf_counter_ns()
        end = start + window
        try:
            while True:
                try:
                    got = self.sock.recvmsg(MAX_FRAME + 1, 0, socket.MSG_DONTWAIT)
                    now = time.perf_counter_ns()
                    return got
                except BlockingIOError:
                    now = time.perf_counter_ns()
                    if now >= end or now - last > _CONTENDED_NS:
                        return None
                    last = now
                    os.sched_yield()
        finally:
            self.d.pollers.release()
            # something else took this CPU for a scheduler slice: no polling
            # for a while (a woken thread is scheduled sooner than a yielding one)
            contended = now - last > _TAKEN_NS
            if contended:
                self._calm_at = now + _BACKOFF_NS
            self.d.polled(got is not None, now - start, contended)

    def _hello(self) -> None:
        op, seq, body = self._recv(self.d.opts.hello_timeout, hello=True)
        if op != Op.HELLO or seq != 0:
            raise ProtocolError(f"the first message must be HELLO with seq 0, not {op.name}/{seq}")
        if not isinstance(body, dict) or "version" not in body:
            raise ProtocolError("HELLO body must be a map with 'version'")
        v = body["version"]
        if type(v) is not int or v not in VERSIONS:
            raise ProtocolError(
                f"protocol version {body['version']!r} is not supported; this daemon speaks "
                f"versions {', '.join(map(str, VERSIONS))}"
            )
        self.version = int(body["version"])
        top = body.get("max_version", self.version)
        if type(top) is not int or top < self.version:
            raise ProtocolError(f"HELLO max_version {top!r}: an integer >= version is expected")
        if self.version >= 3:  # the highest version both speak
            self.version = min(top, VERSION)
        d = self.d
        try:
            self.area_fd = os.memfd_create(
                f"chm-area-{self.cid}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
            )
            os.ftruncate(self.area_fd, d.area_bytes)
            fcntl.fcntl(self.area_fd, _F_ADD_SEALS, _SEALS)
            self.area = mmap.mmap(self.area_fd, d.area_bytes, mmap.MAP_SHARED)
        except OSError as exc:  # out of memory for it: told, not just closed
            why = f"cannot create the {d.area_bytes}-byte shared area: {exc.strerror or exc}"
            self._error(exc.errno or errno.ENOMEM, why)
            raise _Gone(why) from None
        self.area_np = np.frombuffer(self.area, dtype=np.uint8)
        welcome = {
            "version": max(self.version, 3),  # what this connection speaks (3 before 4)
            "session": self.scope.sid,
            "daemon_pid": os.getpid(),
            "instance": d.instance,
            "pool_bytes": d.pool_bytes,
            "area_bytes": d.area_bytes,
            "config": d.client_config,
            "slots_total": d.slots_total,
            "kv": d.store is not None,
            "kv_write": self.kv_write,
            "raw_bytes": d.raw_bytes,
            "max_batch": MAX_BATCH,
            "staging_report": True,  # KV_STAGING is understood
        }
        # said HELLO: no longer a silent connection to drop for a new one
        # (set before the answer, which lets the client connect a next one)
        self.greeted = True
        send_fds(self.sock, encode(Op.HELLO, 0, welcome), [d.pool_ro_fd, self.area_fd])
        self.d.log.info(
            "client connected",
            extra={
                "event": "connect",
                "client": self.cid,
                "pid": self.pid,
                "uid": self.uid,
                "gid": self.gid,
                "peer": self.peer or "local",
            },
        )

    # ---- requests

    def _dispatch(self, op: Op, body: Any) -> Any:
        h = _HANDLERS.get(op)
        if h is None:
            raise ProtocolError(f"{op.name} is not a request")
        return h(self, body)

    def _area(self, off: Any, n: Any, what: str) -> np.ndarray[Any, Any]:
        assert self.area_np is not None
        o = _int(off, f"{what} area offset", 0, self.d.area_bytes)
        ln = _int(n, f"{what} length", 0, self.d.area_bytes - o)
        return self.area_np[o : o + ln]

    def _raw(self, addr: int, length: int) -> int:
        """The device address of ``[addr, addr+length)`` of the raw region
        (a client's raw addresses start at 0 there); -EACCES outside it: the
        KV store's segments are never a client's to write or read raw."""
        if self.d.store is None:  # the whole device: its own checks answer
            return addr
        if addr + length > self.d.raw_bytes or (length == 0 and addr >= self.d.raw_bytes):
            return -errno.EACCES
        return self.d.raw_base + addr

    def _prefetch(self, body: Any, what: str = "PREFETCH") -> list[list[int]]:
        out: list[list[int]] = []
        todo: list[tuple[int, int, int]] = []
        where: list[int] = []
        for e in _list(body, what, 3):
            addr, n = _int(e[0], "addr"), _int(e[1], "len")
            flags = _int(e[2], "flags", 0, 2**32 - 1)
            at = self._raw(addr, n)
            if at < 0:
                out.append([at, 0])
            else:
                where.append(len(out))
                out.append([0, 0])
                todo.append((at, n, flags))
        for j, (rc, tok) in zip(where, self.scope.prefetch_many(todo), strict=True):
            out[j] = [rc, tok]
        return out

    def _deadline(self, tns: Any, what: str) -> int | None:
        t = _int(tns, f"{what} timeout_ns")
        return None if t >= _FOREVER else time.monotonic_ns() + t

    def _stage(self, body: Any) -> Any:
        """RELEASE (optional), PREFETCH and WAIT in one request (version 4):
        one deadline for the batch; an object not staged by it keeps its
        token (rc -ETIMEDOUT), which the client waits for or releases."""
        if self.version < 4:
            raise ProtocolError("STAGE is a version 4 request")
        if not isinstance(body, list) or len(body) not in (2, 3):
            raise ProtocolError(
                "STAGE body is [timeout_ns, [[addr, len, flags], ...](, [token, ...])]"
            )
        deadline = self._deadline(body[0], "STAGE")
        if len(body) == 3:  # handed back first: their slots serve this batch
            self.scope.release_many(_tokens(body[2], "STAGE release"))
        out: list[list[int]] = []
        for rc, tok in self._prefetch(body[1], "STAGE"):
            if rc:
                out.append([rc, 0, 0, 0, 0])
                continue
            wrc, off, n, addr = self._wait_one(tok, deadline)
            out.append([wrc, tok, off, n, addr])
        return out

    def _wait_one(self, token: int, deadline: int | None) -> list[int]:
        while True:
            left = _FOREVER if deadline is None else max(0, deadline - time.monotonic_ns())
            rc, off, n, addr = self.scope.wait(token, min(left, _SLICE_NS))
            if rc != -errno.ETIMEDOUT or left <= _SLICE_NS:
                if rc == 0 and addr >= self.d.raw_base:  # raw: the client's address
                    addr -= self.d.raw_base
                return [rc, off, n, addr]
            if self.d.stopping.is_set():
                return [-errno.ECANCELED, 0, 0, 0]
            r, _, _ = select.select([self.sock], [], [], 0)
            if r:  # the client spoke before the answer, or hung up
                if not self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    raise _Gone(self._vanished())
                raise ProtocolError("a request arrived before the answer to WAIT")

    def _wait(self, body: Any) -> Any:
        if not isinstance(body, list) or len(body) != 2:
            raise ProtocolError("WAIT body is [timeout_ns, [token, ...]]")
        tns = _int(body[0], "timeout_ns")
        toks = _tokens(body[1], "WAIT tokens")
        deadline = None if tns >= _FOREVER else time.monotonic_ns() + tns
        return [self._wait_one(t, deadline) for t in toks]

    def _release(self, body: Any) -> Any:
        return self.scope.release_many(_tokens(body, "RELEASE"))

    def _read(self, body: Any) -> Any:
        if not isinstance(body, list) or len(body) != 3:
            raise ProtocolError("READ body is [addr, len, area_offset]")
        dst = self._area(body[2], body[1], "READ")
        at = self._raw(_int(body[0], "addr"), dst.size)
        if at < 0:
            return at
        try:
            return self.d.dev.read_into(at, dst)
        except ChmError as exc:
            return -(exc.errno or errno.EIO)

    def _write(self, body: Any) -> Any:
        items = _list(body, "WRITE", 3)
        srcs = [self._area(e[1], e[2], "WRITE") for e in items]
        ats = [self._raw(_int(e[0], "addr"), src.size) for e, src in zip(items, srcs, strict=True)]
        out = list(ats)  # -EACCES outside the raw region, the device's answer inside
        ok = [j for j, at in enumerate(ats) if at >= 0]
        if not ok:
            return out
        try:  # one device call; a status per element
            res = [
                _wrc(r) for r in self.d.dev.write_many([ats[j] for j in ok], [srcs[j] for j in ok])
            ]
        except ChmError as exc:
            res = [-(exc.errno or errno.EIO)] * len(ok)
        for j, r in zip(ok, res, strict=True):
            out[j] = r
        return out

    def _flush(self, body: Any) -> Any:
        t = _int(body, "FLUSH timeout_ns")
        return self._flushed(lambda: self.d.dev.flush(None if t >= _FOREVER else t / 1e9))

    def _flushed(self, flush: Any) -> int:
        """A flush's rc: 0, or -ETIMEDOUT (the client asks again); any other
        failure is raised, so a version 3 client gets its message (which
        file, what is full) in a non-fatal ERROR."""
        try:
            flush()
        except ChmError as exc:
            if isinstance(exc, TimeoutError) or self.version < 3:
                return -(exc.errno or errno.EIO)
            raise
        return 0

    def _stats(self, body: Any) -> Any:
        return self.d.stats()

    # ---- the shared KV index

    def _store(self) -> Any:
        if self.d.store is None:
            raise ProtocolError("this daemon serves no KV store (mode is not prefetch)")
        return self.d.store

    def _writable(self, what: str) -> Any:
        st = self._store()
        if not self.kv_write:
            raise ChmError(
                errno.EACCES,
                f"{what}: this client (uid {self.uid}) may only read the shared store; "
                "the daemon's kv_writers setting names who may put and remove",
            )
        return st

    def _kv_put(self, body: Any) -> Any:
        st = self._writable("KV_PUT")
        items = _list(body, "KV_PUT")
        for e in items:  # [hi, lo, area_offset, len] or, version 2, with metadata
            if not isinstance(e, list) or len(e) not in (4, 5) or (len(e) == 5 and (
                self.version < 2 or not isinstance(e[4], bytes) or len(e[4]) > MAX_META
            )):  # fmt: skip
                raise ProtocolError(
                    f"KV_PUT: every element is [key_hi, key_lo, area_offset, len] or "
                    f"(version 2) the same with metadata of at most {MAX_META} bytes"
                )
        ks = _keys(items, "KV_PUT key")
        srcs = [self._area(e[2], e[3], "KV_PUT") for e in items]
        meta = [e[4] if len(e) == 5 else None for e in items]
        try:
            status = st.put(ks, srcs, meta)
        except ChmError as exc:
            return -(exc.errno or errno.EIO)
        if self.d.node is not None:  # a storage node: the Master learns of them
            self.d.node.stored(ks, status)
        return [int(s) for s in status]

    def _kv_entries(self, body: Any) -> Any:
        if self.version < 2:
            raise ProtocolError("KV_ENTRIES is a version 2 request")
        ents = self._store().entries(_keys(_list(body, "KV_ENTRIES", 2), "key"))
        return [
            None
            if e is None
            else [e["addr"], e["length"], e["checksum"], e["epoch"], e["state"], e["meta"]]
            for e in ents
        ]

    def _kv_lookup(self, body: Any) -> Any:
        st = self._store()
        if not isinstance(body, list) or len(body) != 2 or not isinstance(body[1], bool):
            raise ProtocolError("KV_LOOKUP body is [[[hi, lo], ...], prefix]")
        ks = _keys(_list(body[0], "KV_LOOKUP", 2), "KV_LOOKUP key")
        prefix = body[1]
        if prefix:
            n = st.prefix_len(ks)
            ks = ks[:n]
        got = self.scope.pin(ks)
        ents = st.entries(ks)  # digests: no hashing again
        infos = [ents[j] if ok else None for j, ok in enumerate(got)]
        cut = len(infos)
        if prefix:  # the leading hits only
            cut = next((j for j, info in enumerate(infos) if info is None), cut)
        want = [j for j in range(cut) if infos[j] is not None]
        # the store's admission picks the blocks the device keeps resident in
        # its DRAM after release (a device with a resident region), as for an
        # embedded store's loads
        addrs = [infos[j]["addr"] for j in want]  # type: ignore[index]
        keep = st._retain_mask(addrs) or [False] * len(want)
        issued = self.scope.prefetch_many(  # one device call for the batch
            [
                (infos[j]["addr"], infos[j]["length"], RETAIN if k else 0)  # type: ignore[index]
                for j, k in zip(want, keep, strict=True)
            ]
        )
        res = dict(zip(want, issued, strict=True))
        out: list[list[int]] = []
        stop = False
        unpin: list[tuple[int, int]] = []
        release: list[int] = []
        for j, info in enumerate(infos):
            r = res.get(j)
            if info is None or r is None or r[0] or stop:
                if got[j]:
                    unpin.append((int(ks[j]["hi"]), int(ks[j]["lo"])))
                if r is not None and not r[0]:  # issued past the end of the prefix
                    release.append(r[1])
                if prefix:
                    stop = True
                    continue
                out.append([-errno.ENOENT if r is None else r[0], 0, 0, 0])
                continue
            out.append([0, r[1], info["length"], info["checksum"]])
        if release:
            self.scope.release_many(release)
        self._unpin(unpin)
        hits = sum(1 for e in out if e[0] == 0)
        self.d.count("kv_lookup_hits", hits)
        return out

    def _kv_load(self, body: Any) -> Any:
        """KV_LOOKUP and WAIT in one request (version 4): a hit not staged
        by the deadline keeps its token and pin (its rc says why), which
        the client waits for or hands back with KV_DONE."""
        if self.version < 4:
            raise ProtocolError("KV_LOAD is a version 4 request")
        if not isinstance(body, list) or len(body) != 3:
            raise ProtocolError("KV_LOAD body is [timeout_ns, [[hi, lo], ...], prefix]")
        deadline = self._deadline(body[0], "KV_LOAD")
        out: list[list[int]] = []
        for rc, tok, n, csum in self._kv_lookup([body[1], body[2]]):
            if rc:
                out.append([rc, 0, 0, 0, 0])
                continue
            wrc, off, _n, _addr = self._wait_one(tok, deadline)
            out.append([wrc, tok, n, csum, off])
        return out

    def _unpin(self, pairs: list[tuple[int, int]]) -> None:
        """One pin of each key, in one store call (a key twice: one call each)."""
        if len(set(pairs)) == len(pairs):
            self.scope.unpin(pairs)
        else:
            for pair in pairs:
                self.scope.unpin([pair])

    def _kv_done(self, body: Any) -> Any:
        self._store()
        items = _list(body, "KV_DONE", 4)
        pairs = [(_int(e[0], "hi"), _int(e[1], "lo")) for e in items]
        out = self.scope.release_many([_int(e[2], "token") for e in items])
        self._unpin(pairs)
        bad = [pair for pair, e in zip(pairs, items, strict=True) if e[3]]
        if bad:  # the client found the block torn or corrupt: a miss from now on
            self.d.count("kv_checksum_errors", len(bad))
            if self.kv_write:  # dropped now, or once no other client holds it
                self.d.condemn(bad)
            else:
                self.d.count("kv_checksum_reports_ignored", len(bad))
                self.d.log.warning(
                    "checksum failure reported by a read-only client: block kept",
                    extra={"event": "bad_block", "client": self.cid, "keys": len(bad)},
                )
        self.d.retry_condemned()
        return out

    def _kv_contains(self, body: Any) -> Any:
        return self._store().contains(_keys(_list(body, "KV_CONTAINS", 2), "key"))

    def _kv_prefix_len(self, body: Any) -> Any:
        return self._store().prefix_len(_keys(_list(body, "KV_PREFIX_LEN", 2), "key"))

    def _kv_remove(self, body: Any) -> Any:
        ks = _keys(_list(body, "KV_REMOVE", 2), "key")
        seqs = self._writable("KV_REMOVE").remove_seqs(ks)
        if self.d.node is not None:  # a storage node: no longer a hit in the Master
            self.d.node.removed(ks, seqs)
        return [s is not None for s in seqs]

    def _kv_staging(self, body: Any) -> Any:
        if not isinstance(body, dict) or set(body) != set(STAGING_COUNTERS):
            raise ProtocolError(f"KV_STAGING body is a map of {', '.join(STAGING_COUNTERS)}")
        report = {k: _int(body[k], f"KV_STAGING {k}", 0, 2**63 - 1) for k in STAGING_COUNTERS}
        with self.d.staging_lock:
            self.staging = report
        return 0

    def _kv_flush(self, body: Any) -> Any:
        t = _int(body, "KV_FLUSH timeout_ns")
        st = self._store()
        return self._flushed(lambda: st.flush(None if t >= _FOREVER else t / 1e9))


_HANDLERS = {
    Op.PREFETCH: Client._prefetch,
    Op.WAIT: Client._wait,
    Op.RELEASE: Client._release,
    Op.READ: Client._read,
    Op.WRITE: Client._write,
    Op.FLUSH: Client._flush,
    Op.STATS: Client._stats,
    Op.KV_PUT: Client._kv_put,
    Op.KV_LOOKUP: Client._kv_lookup,
    Op.KV_DONE: Client._kv_done,
    Op.KV_CONTAINS: Client._kv_contains,
    Op.KV_PREFIX_LEN: Client._kv_prefix_len,
    Op.KV_REMOVE: Client._kv_remove,
    Op.KV_FLUSH: Client._kv_flush,
    Op.KV_ENTRIES: Client._kv_entries,
    Op.KV_STAGING: Client._kv_staging,
    Op.STAGE: Client._stage,
    Op.KV_LOAD: Client._kv_load,
    Op.RELEASE_QUIET: Client._release,
    Op.KV_DONE_QUIET: Client._kv_done,
}
