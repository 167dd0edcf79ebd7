"""``chm.connect(path)``: a client of the chm-emu daemon, usable as a device.

    with chm.connect("/run/chm/chm.sock") as dev:      # a DeviceLike
        hs = dev.prefetch_many(addrs, lens)  # one round trip; Handle or error each
        views = dev.wait_many(hs)            # one round trip, zero-copy
        ...
        dev.release_many(hs)                 # sent unanswered: no round trip
        hs = dev.prefetch_many(addrs, lens, wait=True)  # prefetch and wait: one
        kv = dev.kv()                                   # the daemon's shared KV index

Staged objects are read-only memoryviews into the daemon's DRAM pool, mapped
read-only in this process (no copy). Writes go through this connection's
shared area. One request is in flight per connection (calls from several
threads take turns); use one connection per thread for parallel waits. If
the daemon dies, every call (including a blocked wait) raises
:class:`DaemonGone`.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import operator
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from chm import _lowlevel as _ll
from chm._robuf import ReadOnlyBuffer
from chm.config import Config
from chm.device import timeout_ns
from chm.errors import Cancelled, ChmError, InvalidArgument, ViewInUse, error_for
from chm.kv.buffers import as_dst, as_src
from chm.kv.keys import Namespace
from chm.kv.store import MAX_META, PutStatus, check_meta
from chm.remote.protocol import (
    HELLO_VERSION,
    MAX_BATCH,
    MAX_FRAME,
    STAGING_COUNTERS,
    VERSION,
    Framed,
    Op,
    ProtocolError,
    auth_digest,
    decode,
    encode,
    read_secret,
    recv_fds,
)
from chm.stats import Stats

__all__ = ["DaemonGone", "RemoteDevice", "RemoteHandle", "RemoteStore", "connect"]

_hash = xxhash.xxh3_64_intdigest
_WIRE_BUDGET = MAX_FRAME - 8192  # bytes of metadata a request or an answer may carry
_ENTRY_NAMES = ("addr", "length", "checksum", "epoch", "state", "meta")
_WAIT_SLICE = 20_000_000  # ns: a load hands staged blocks back at least this often
_TCP_DATA = 60_000  # bytes of the area or pool in one TCP data request
_WAIT_CHUNK = 1_000_000_000  # ns: the longest WAIT or FLUSH a client asks in one round trip
# ns a Unix-socket client polls for an answer before it sleeps: a CPU woken
# from idle costs tens of us on a VM, more than a short request takes
# (docs/daemon.md, "The request path")
SPIN_NS = 100_000
# a try of that poll that comes back this late found the CPU wanted by
# something else: the client sleeps in recv instead
_CONTENDED_NS = 50_000


class DaemonGone(Cancelled, ConnectionError):
    """The connection to the daemon is over: it exited, was killed, refused
    us (full), closed it (idle, a protocol error), or stopped answering
    within the call's deadline. The message says which."""

    def __str__(self) -> str:
        return f"{self.strerror} ({_errname(self.errno or errno.ECANCELED)})"


def _timeval(seconds: float) -> bytes:
    """A struct timeval (SO_RCVTIMEO, SO_SNDTIMEO)."""
    sec = int(seconds)
    return struct.pack("@ll", sec, int((seconds - sec) * 1e6))


def _errname(err: int) -> str:
    return errno.errorcode.get(err, f"errno {err}")


def _oserr(exc: OSError) -> str:
    """An OSError of the socket, its errno spelled out."""
    return f"{exc.strerror or exc} ({_errname(exc.errno or 0)})"


_LOST = {
    errno.EPIPE: "the daemon closed the connection",
    errno.ECONNRESET: "the daemon reset the connection",
    errno.ECONNREFUSED: "no daemon is serving on the socket",
}


def _raise(rc: int, call: str, what: str = "") -> None:
    """Raises the exception of a -errno answer (nothing for rc >= 0)."""
    if rc < 0:
        raise _err(rc, call, what)


class RemoteHandle:
    """One prefetch issued through the daemon (a ``HandleLike``, used as
    ``chm.Handle``: ``wait()``, ``release()``, a context manager)."""

    # _buf: the ReadOnlyBuffer over the object's bytes in the shared pool
    # (it counts what exports it, so a release under a live array is
    # refused); _mv: a weak reference to the memoryview of it that wait()
    # hands out (weak, as chm.Handle's: an array made from that memoryview
    # once it is dropped counts as an export of _buf).
    # _own: issued by this connection's PREFETCH or STAGE (not adopt()ed),
    # so its release needs no answer; _ready: (pool_offset, len, dev_addr)
    # when a STAGE answered it staged, so wait() needs no round trip.
    __slots__ = (
        "__weakref__",
        "_buf",
        "_dev",
        "_mv",
        "_own",
        "_ready",
        "place",
        "released",
        "token",
    )

    def __init__(self, dev: RemoteDevice, token: int, own: bool = False) -> None:
        self._dev = dev
        self.token = token
        self._own = own
        self._ready: tuple[int, int, int] | None = None
        self._buf: ReadOnlyBuffer | None = None
        self._mv: weakref.ref[memoryview] | None = None
        self.place: tuple[int, int, int] | None = None  # (dev_addr, length, pool_offset)
        self.released = False

    def _live_view(self) -> memoryview | None:
        ref = self._mv
        mv = ref() if ref is not None else None
        if mv is None:
            return None
        try:
            len(mv)  # raises once released
        except ValueError:
            return None
        return mv

    def _exported(self) -> bool:
        """True while something other than the memoryview wait() handed out
        (an array, a memoryview of ``.obj``) exports the bytes."""
        buf = self._buf
        if buf is None or buf.released:
            return False
        return buf.exports > (1 if self._live_view() is not None else 0)

    def _in_use(self) -> ViewInUse:
        return ViewInUse(
            None,
            f"handle {self.token:#x}: its view is still exported (slices, numpy "
            "arrays or memoryviews derived from it are alive); drop them first",
            call="release",
        )

    def _end_view(self) -> bool:
        """Ends the view; False (nothing ended) while anything but the
        memoryview wait() handed out still exports the bytes."""
        buf = self._buf
        if buf is None:
            return True
        mv = self._live_view()
        if buf.exports > (1 if mv is not None else 0):
            return False
        try:
            if mv is not None:
                mv.release()
            buf.release()
        except BufferError:  # a slice of the view keeps it exported
            return False
        self._buf = self._mv = None
        return True

    def wait(self, timeout: float | None = None) -> memoryview:
        """The staged object's read-only view into the shared pool (waits up
        to ``timeout`` seconds); raises as ``chm.Handle.wait``."""
        if self._dev.closed:
            raise Cancelled(None, "chm_prefetch_wait: connection is closed")
        mv = self._live_view()
        if mv is not None:
            return mv
        (mv,) = self._dev.wait_many([self], timeout)
        return mv

    def release(self) -> None:
        """Releases the slot (a second call is a no-op); raises ViewInUse
        (keeping it) while the view is exported, StaleHandle if the daemon
        no longer knows the token."""
        if not self.released:
            (err,) = self._dev.release_many([self])
            if err is not None:
                raise err

    close = release

    @property
    def device(self) -> RemoteDevice:
        return self._dev

    def __enter__(self) -> RemoteHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else ("held" if self._buf is not None else "issued")
        return f"<chm.remote.RemoteHandle {self.token:#x} {state}>"


class RemoteDevice:
    """The daemon's device, as seen by one client (see the module doc)."""

    def __init__(
        self,
        path: str,
        timeout: float = 10.0,
        request_timeout: float = 30.0,
        secret_file: str | None = None,
    ) -> None:
        if not timeout > 0 or not request_timeout > 0:
            raise InvalidArgument(
                None,
                f"connect: timeout={timeout!r}, request_timeout={request_timeout!r}: "
                "expected seconds > 0",
            )
        self.path = path
        self.request_timeout = float(request_timeout)
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self._broken: str | None = None  # why the connection can no longer be used
        # Handles that were handed a view (weakly: a view keeps its handle
        # alive), so close() can refuse or end them as Device.close() does;
        # _vlock orders wait_many()'s publishing of a view with close().
        self._viewed: weakref.WeakSet[RemoteHandle] = weakref.WeakSet()
        self._vlock = threading.Lock()
        self._ending = False
        self.tcp = path.startswith("tcp://")
        # version 3 with max_version: a version 3 daemon ignores the latter
        hello: dict[str, Any] = {
            "version": HELLO_VERSION,
            "max_version": VERSION,
            "pid": os.getpid(),
        }
        self.round_trips = 0  # requests sent that waited for an answer
        self.spin_ns = SPIN_NS  # 0: sleep at once in recv (a TCP client never polls)
        self.quiet_sent = 0  # requests sent that have no answer (RELEASE_QUIET, KV_DONE_QUIET)
        self._armed: float | None = None  # the receive timeout set on the socket
        s: Any
        if self.tcp:
            s, hello["auth"] = _dial_tcp(path, timeout, secret_file)
        else:
            s = _dial(path, timeout)
        fds: list[int] = []
        data = b""
        try:
            s.settimeout(max(0.001, timeout))
            # refused at once: the daemon's ERROR, if any, is still to be read
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.send(encode(Op.HELLO, 0, hello))
            try:
                if self.tcp:
                    data = s.recv()
                else:
                    data, fds = recv_fds(s, 2)
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise DaemonGone(None, f"{path}: {_LOST[exc.errno or 0]} during HELLO") from None
            s.settimeout(None)
        except TimeoutError:
            s.close()
            raise DaemonGone(None, f"{path}: no answer to HELLO within {timeout} s") from None
        except BaseException:
            s.close()
            raise
        self._sock = s
        self.pool_fd = self.area_fd = -1
        self._pool: mmap.mmap | None = None
        self._area: mmap.mmap | None = None
        self._area_np: np.ndarray[Any, Any]
        # the shared area holds one call's bytes at a time: calls that copy
        # through it (read_into, write_many, RemoteStore.put) take this lock
        # for the whole call, so threads sharing a connection never mix
        # their bytes (the request lock alone does not cover the copies)
        self._area_lock = threading.RLock()
        try:
            if not data:
                raise DaemonGone(None, f"{path}: the daemon closed the connection during HELLO")
            op, _, body = decode(data)
            if op == Op.ERROR:
                err = int(body.get("errno") or errno.ECANCELED)
                raise DaemonGone(err, f"{path}: refused by the daemon: {body.get('message')}")
            self.welcome = body
            if self.tcp:  # no descriptors over TCP: the area's bytes travel
                self._pool_mv = memoryview(b"")
                self._area_np = np.zeros(int(body["area_bytes"]), np.uint8)
            else:
                if len(fds) != 2:
                    raise ProtocolError(f"WELCOME carried {len(fds)} descriptors, expected 2")
                self.pool_fd, self.area_fd = fds
                self._pool = mmap.mmap(
                    self.pool_fd, body["pool_bytes"], mmap.MAP_SHARED, mmap.PROT_READ
                )
                self._pool_mv = memoryview(self._pool)
                self._area = mmap.mmap(self.area_fd, body["area_bytes"], mmap.MAP_SHARED)
                self._area_np = np.frombuffer(self._area, dtype=np.uint8)
        except BaseException:
            for fd in fds:
                os.close(fd)
            s.close()
            raise
        self._config = Config(body["config"])
        # the addresses raw calls may use: a daemon with a KV store keeps its
        # segments out of them (raw_bytes, 0 by default)
        self._capacity = int(body.get("raw_bytes", self._config.capacity))
        self.area_bytes = int(body["area_bytes"])
        self.session = int(body["session"])
        self.instance = str(body["instance"])
        self.version = int(body["version"])
        self._engine: _EngineLink | None = None  # use_engine(): a storage node's data path

    # ---- transport

    def _call(self, op: Op, body: Any, wait: float = 0.0) -> Any:
        """One request and its answer. The daemon has ``wait`` seconds (the
        request's own timeout) plus ``request_timeout`` to answer; past that,
        or if the call is interrupted between the request and its answer,
        the connection is closed (it can no longer be trusted to pair
        answers with requests) and DaemonGone raised."""
        with self._lock:
            if self._closed:
                raise Cancelled(None, f"{op.name}: connection is closed")
            if self._broken:
                raise DaemonGone(None, f"{op.name}: {self._broken}")
            seq = self._seq + 1
            packet = encode(op, seq, body)  # too large: raised here, nothing sent
            self._seq = seq
            limit = wait + self.request_timeout
            done = False
            try:
                self._arm(limit)
                self.round_trips += 1
                try:
                    self._sock.send(packet)
                except OSError as exc:
                    if exc.errno not in _LOST:
                        raise
                    data = self._said_before_closing()
                    if not data:
                        self._break(_LOST[exc.errno or 0])
                        raise DaemonGone(
                            None, f"{op.name}: {self._broken} ({_oserr(exc)})"
                        ) from None
                else:
                    data = self._answer()
                done = True
            except (TimeoutError, BlockingIOError):  # SO_RCVTIMEO ends a blocking recv so
                self._break(
                    f"no answer to {op.name} within {limit:g} s: the daemon is stopped or "
                    "hung; the connection is closed"
                )
                raise DaemonGone(None, f"{op.name}: {self._broken}") from None
            except OSError as exc:
                if isinstance(exc, DaemonGone):
                    raise
                raise self._failed(op, exc) from None
            finally:
                if not done and not self._broken:  # interrupted (KeyboardInterrupt, ...)
                    self._break(f"{op.name} was interrupted before its answer")
            if not data:
                self._break("the daemon closed the connection")
                raise DaemonGone(None, f"{op.name}: {self._broken}")
            rop, rseq, rbody = decode(data)
            if rop == Op.ERROR:
                err = int(rbody.get("errno") or errno.EIO)
                msg = str(rbody.get("message"))
                if rbody.get("fatal", True) or rseq != seq:
                    self._break(f"the daemon ended the connection: {msg}")
                    raise DaemonGone(
                        errno.ECANCELED if err == errno.EPROTO else err,
                        f"{op.name}: {self._broken}",
                    )
                raise error_for(err)(err, msg, call=op.name, detail=msg)
            if rop != op or rseq != seq:
                self._break(f"answer {rop.name}/{rseq} to {op.name}/{seq}")
                raise ProtocolError(self._broken)
            return rbody

    def _failed(self, op: Op, exc: OSError) -> DaemonGone:
        """Breaks the connection after a socket error on ``op``; the error to raise."""
        self._break(f"{_LOST.get(exc.errno or 0, 'the connection failed')}")
        return DaemonGone(None, f"{op.name}: {self._broken} ({_oserr(exc)})")

    def _answer(self) -> bytes:
        """The next packet: polled for up to ``spin_ns`` (a Unix socket),
        then waited for in a blocking recv with the armed deadline. The poll
        yields the CPU between tries (on a busy machine the daemon's thread
        may be waiting for this very CPU to answer) and stops as soon as a
        try comes back late because something else ran."""
        sock = self._sock
        if self.spin_ns > 0 and not self.tcp:
            last = time.perf_counter_ns()
            end = last + self.spin_ns
            while True:
                try:
                    return bytes(sock.recv(MAX_FRAME + 1, socket.MSG_DONTWAIT))
                except BlockingIOError:
                    now = time.perf_counter_ns()
                    if now >= end or now - last > _CONTENDED_NS:
                        break
                    last = now
                    os.sched_yield()
        return bytes(sock.recv(MAX_FRAME + 1))

    def _arm(self, limit: float) -> None:
        """The socket's deadline for one request's answer: a Unix socket
        stays blocking with SO_RCVTIMEO, set only when the limit changes (a
        Python socket timeout costs a poll per send and recv; SO_SNDTIMEO is
        request_timeout, set once); a TCP one keeps Python's timeout, also
        set only on a change."""
        if limit == self._armed:
            return
        if self.tcp:
            self._sock.settimeout(limit)
        else:
            if self._armed is None:  # first use: blocking, sends bounded
                self._sock.settimeout(None)
                self._sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(self.request_timeout)
                )
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(limit))
        self._armed = limit

    def _tell(self, op: Op, body: Any) -> None:
        """A request without an answer (version 4: RELEASE_QUIET,
        KV_DONE_QUIET): one packet, no round trip. The daemon applies it
        before it reads this connection's next request."""
        with self._lock:
            if self._closed:
                raise Cancelled(None, f"{op.name}: connection is closed")
            if self._broken:
                raise DaemonGone(None, f"{op.name}: {self._broken}")
            seq = self._seq + 1
            packet = encode(op, seq, body)
            self._seq = seq
            done = False
            try:
                if self.tcp or self._armed is None:
                    self._arm(self.request_timeout)  # a Unix socket's send is bounded already
                self.quiet_sent += 1
                self._sock.send(packet)
                done = True
            except (TimeoutError, BlockingIOError):
                self._break(f"{op.name} not taken within {self.request_timeout:g} s")
                raise DaemonGone(None, f"{op.name}: {self._broken}") from None
            except OSError as exc:
                if isinstance(exc, DaemonGone):
                    raise
                raise self._failed(op, exc) from None
            finally:
                if not done and not self._broken:  # interrupted (KeyboardInterrupt, ...)
                    self._break(f"{op.name} was interrupted")

    def _said_before_closing(self) -> bytes:
        """After a send failed on a closed connection: the daemon's last
        packet (its ERROR saying why), or b"" if it left none."""
        try:
            self._armed = None
            self._sock.settimeout(0.05)
            return bytes(self._sock.recv(MAX_FRAME + 1))
        except (OSError, ProtocolError):
            return b""

    def _raw_error(self, rc: int, call: str, args: str) -> ChmError:
        """The exception of a raw call's -errno; -EACCES is an address
        outside the daemon's raw region, said so."""
        detail = None
        if rc == -errno.EACCES:
            detail = (
                f"outside the daemon's raw region (raw_bytes={self._capacity}): a daemon "
                "with a KV store keeps its segments out of raw reach; it serves raw "
                "addresses only when started with --raw SIZE"
            )
        err: ChmError = _ll.status_error(rc, call, args, detail)
        return err

    def _push(self, used: int) -> None:
        """Over TCP: sends the first ``used`` bytes of the area to the daemon."""
        if not self.tcp:
            return
        if self._engine is not None:
            self._engine.move("write", used)
            return
        for off in range(0, used, _TCP_DATA):
            part = self._area_np[off : min(used, off + _TCP_DATA)].tobytes()
            _raise(int(self._call(Op.AREA_PUT, [off, part])), "area_put")

    def _pull(self, n: int) -> None:
        """Over TCP: fetches the first ``n`` bytes of the area from the daemon."""
        if not self.tcp:
            return
        if self._engine is not None:
            self._engine.move("read", n)
            return
        for off in range(0, n, _TCP_DATA):
            got = self._call(Op.AREA_GET, [off, min(_TCP_DATA, n - off)])
            if isinstance(got, int):
                _raise(got, "area_get")
            self._area_np[off : off + len(got)] = np.frombuffer(got, np.uint8)

    def _staged(self, token: int, off: int, n: int) -> memoryview:
        """The bytes of a staged object: a view of the shared pool, or over
        TCP a copy fetched from the daemon."""
        if not self.tcp:
            return self._pool_mv[off : off + n]
        if self._engine is not None:
            return self._engine.staged(token, off, n)
        out = bytearray(n)
        for at in range(0, n, _TCP_DATA):
            got = self._call(Op.POOL_GET, [token, at, min(_TCP_DATA, n - at)])
            if isinstance(got, int):
                _raise(got, "pool_get", f"token={token:#x}")
            out[at : at + len(got)] = got
        return memoryview(bytes(out))

    # ---- a storage node's data path (the Transfer Engine)

    def use_engine(self, engine: Any) -> None:
        """Over TCP to a storage node (a daemon with ``--master``, whose
        WELCOME carries ``transfer``): from now on the area's bytes and
        staged objects move with ``engine`` (a :class:`chm.remote.transfer.Engine`)
        instead of AREA_PUT / AREA_GET / POOL_GET: each KV load's staged
        objects in one batched read out of the node's pool, each put's
        blocks in one write into this client's area on the node."""
        t = self.welcome.get("transfer")
        if not self.tcp or not isinstance(t, dict):
            raise InvalidArgument(
                None,
                f"use_engine: {self.path} is not a storage node over TCP "
                "(a daemon started with --listen and --master)",
            )
        if self._engine is None:
            self._engine = _EngineLink(self, engine, t)
            self._area_np = self._engine.area_view

    def _fetch_staged(self, items: Sequence[tuple[int, int, int]]) -> None:
        """With an engine: reads staged objects ``(token, pool offset, len)``
        in one batch, so ``_staged`` finds them read already."""
        if self._engine is not None and items:
            self._engine.drop_fetched()  # what an earlier round left unread
            self._engine.fetch(items)

    def abort(self, why: str = "the connection was aborted") -> None:
        """Ends the connection at once, without taking a lock, so it is safe
        from a signal handler: a call blocked on the daemon raises
        DaemonGone, and so does every later call; ``close()`` still frees
        this side."""
        self._break(why)

    def _break(self, why: str) -> None:
        """The connection cannot be used any more: closes the socket (the
        daemon then releases everything this client held)."""
        self._broken = why
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    # ---- prefetch (batched: one round trip per MAX_BATCH elements)

    def prefetch_many(
        self,
        addrs: Sequence[int],
        lengths: Sequence[int],
        *,
        noqueue: bool = False,
        retain: bool = False,
        wait: bool = False,
        timeout: float | None = None,
        release: Sequence[RemoteHandle] = (),
    ) -> list[RemoteHandle | ChmError]:
        """Issues one prefetch per ``(addrs[i], lengths[i])``, as
        ``chm.Device.prefetch_many``: never blocks; returns, in order, a
        RemoteHandle for each object issued and, for each one refused, the
        exception :meth:`prefetch` would have raised for it (not raised: the
        others are issued regardless). Raises InvalidArgument only for the
        call as a whole (lengths of the sequences differ, more than
        CHM_BATCH_MAX elements, a bool or negative value), TypeError (not an
        integer), Cancelled (closed). One round trip per MAX_BATCH elements.

        ``wait=True`` also waits, in the same round trip (a version 4
        daemon's STAGE), up to ``timeout`` seconds (None: up to 1 s in this
        call) for the issued objects to be staged: then :meth:`wait_many`
        of those staged needs no round trip of its own. An object not staged
        by then is returned issued as without ``wait`` (no wait error is
        raised here: :meth:`wait_many` says it).

        ``release``: handles to release first, as :meth:`release_many`
        would (raising its first error instead of returning it), carried by
        the same request when the daemon speaks version 4 (a window of
        loads moves with one round trip: hand back the oldest, issue the
        next); their slots serve this batch.
        """
        call = "chm_prefetch_objects"
        n = len(addrs)
        _batch_len(call, n, len(lengths))
        a = _u64s(call, "addrs", addrs)
        ln = _u64s(call, "lens", lengths)
        flags = (_ll.PF_NOQUEUE if noqueue else 0) | (_ll.PF_RETAIN if retain else 0)
        end = None if timeout is None else time.monotonic_ns() + timeout_ns(timeout)
        if self._closed:
            raise Cancelled(None, f"{call}: connection is closed", call=call)
        stage = (wait or bool(release)) and self.version >= 4
        carried: list[int] = []
        if release:
            for h in release:  # refused before anything is released
                if h._dev is not self:
                    raise InvalidArgument(None, f"{h!r} belongs to another connection")
                if not h.released and h._exported():
                    raise h._in_use()
            if not stage:
                for err in self.release_many(release):
                    if err is not None:
                        raise err
            else:  # the handles this connection issued ride along; others as usual
                theirs = [h for h in release if not h._own]
                for err in self.release_many(theirs):
                    if err is not None:
                        raise err
                for h in release:
                    if h._own and not h.released:
                        if not h._end_view():  # a slice of its view still exports it
                            if carried:
                                self._tell(Op.RELEASE_QUIET, carried)
                            raise h._in_use()
                        h.released = True
                        carried.append(h.token)
        out: list[RemoteHandle | ChmError] = []
        for i in range(0, n, MAX_BATCH):
            part = zip(a[i : i + MAX_BATCH], ln[i : i + MAX_BATCH], strict=True)
            body = [[x, y, flags] for x, y in part]
            if not stage:
                for j, (rc, tok) in enumerate(self._call(Op.PREFETCH, body), i):
                    if rc == 0:
                        out.append(RemoteHandle(self, tok, own=True))
                    else:
                        out.append(self._raw_error(rc, call, f"addr={a[j]:#x}, len={ln[j]}"))
                continue
            left = _WAIT_CHUNK if end is None else max(0, end - time.monotonic_ns())
            chunk = min(left, _WAIT_CHUNK) if wait else 0  # 0: a poll, never blocks
            req: list[Any] = [chunk, body]
            if carried:
                req.append(carried[:MAX_BATCH])
                carried = carried[MAX_BATCH:]
            res = self._call(Op.STAGE, req, wait=chunk / 1e9)
            for j, (rc, tok, off, size, addr) in enumerate(res, i):
                if tok == 0:  # refused: nothing issued
                    out.append(self._raw_error(rc, call, f"addr={a[j]:#x}, len={ln[j]}"))
                    continue
                h = RemoteHandle(self, tok, own=True)
                if rc == 0:
                    h._ready = (off, size, addr)
                out.append(h)
        if carried:  # more than one request's worth
            self._tell(Op.RELEASE_QUIET, carried)
        return out

    def prefetch(
        self, addr: int, length: int, *, noqueue: bool = False, retain: bool = False
    ) -> RemoteHandle:
        """Issues a prefetch of ``[addr, addr+length)`` (as ``chm.Device.prefetch``)."""
        call = "chm_prefetch_object"
        args = f"addr={addr!r}, len={length!r}"
        (a,) = _u64s(call, "addr", [addr])
        (n,) = _u64s(call, "len", [length])
        flags = (_ll.PF_NOQUEUE if noqueue else 0) | (_ll.PF_RETAIN if retain else 0)
        ((rc, tok),) = self._call(Op.PREFETCH, [[a, n, flags]])
        if rc:
            raise self._raw_error(rc, call, args)
        return RemoteHandle(self, tok, own=True)

    def wait_many(
        self, handles: Sequence[RemoteHandle], timeout: float | None = None
    ) -> list[memoryview]:
        """Zero-copy views of the staged objects (``timeout`` for the whole
        call); raises the first failure (WaitTimeout, DeviceIOError,
        StaleHandle, ...). One round trip per MAX_BATCH handles."""
        out = [memoryview(b"")] * len(handles)
        timeout_ns(timeout)  # refuses what chm.Handle.wait refuses
        end = None if timeout is None else time.monotonic_ns() + timeout_ns(timeout)
        todo = []
        for j, h in enumerate(handles):
            if h._dev is not self:
                raise InvalidArgument(None, f"{h!r} belongs to another connection")
            mv = h._live_view()
            if mv is not None:
                out[j] = mv
            elif h.released:
                raise _err(-errno.ESTALE, "chm_prefetch_wait", f"handle={h.token:#x} released")
            else:
                todo.append(j)
        ready = [j for j in todo if handles[j]._ready is not None]  # STAGE said where
        if ready:
            todo = [j for j in todo if handles[j]._ready is None]
            places = [handles[j]._ready or (0, 0, 0) for j in ready]
            self._publish(handles, ready, [[0, *p] for p in places], out)
        for i in range(0, len(todo), MAX_BATCH):
            part = todo[i : i + MAX_BATCH]
            got = self._wait_tokens([handles[j].token for j in part], end)
            self._publish(handles, part, got, out)
        return out

    def _publish(
        self,
        handles: Sequence[RemoteHandle],
        part: list[int],
        got: list[list[int]],
        out: list[memoryview],
    ) -> None:
        """Hands out the views of staged handles (WAIT answers ``[rc,
        pool_offset, len, dev_addr]``); raises the first failure."""
        with self._vlock:  # a view is either ended by close() or never handed out
            if self._ending:
                raise Cancelled(None, "chm_prefetch_wait: connection is closed")
            for j, (rc, off, n, addr) in zip(part, got, strict=True):
                if rc:
                    raise _err(rc, "chm_prefetch_wait", f"handle={handles[j].token:#x}")
                h = handles[j]
                h._buf = ReadOnlyBuffer(self._staged(h.token, off, n), h)
                mv = memoryview(h._buf)
                h._mv = weakref.ref(mv)
                h.place = (addr, n, off)
                self._viewed.add(h)
                out[j] = mv

    def _wait_tokens(self, tokens: list[int], end: int | None) -> list[list[int]]:
        """WAIT answers for the tokens by ``end`` (monotonic ns; None:
        forever), asked in slices of at most _WAIT_CHUNK, so each round trip
        has a deadline even when the wait has none."""
        got: dict[int, list[int]] = {}
        rest = list(range(len(tokens)))
        while rest:
            left = None if end is None else max(0, end - time.monotonic_ns())
            chunk = _WAIT_CHUNK if left is None else min(left, _WAIT_CHUNK)
            last = left is not None and chunk >= left  # this slice reaches the deadline
            res = self._call(Op.WAIT, [chunk, [tokens[k] for k in rest]], wait=chunk / 1e9)
            nxt = []
            for k, r in zip(rest, res, strict=True):
                if r[0] == -errno.ETIMEDOUT and not last:
                    nxt.append(k)
                else:
                    got[k] = r
            rest = nxt
        return [got[k] for k in range(len(tokens))]

    def release_many(self, handles: Sequence[RemoteHandle]) -> list[ChmError | None]:
        """Releases several handles, as ``chm.Device.release_many``: returns,
        in order, None for each released (or already released) handle and
        the exception :meth:`RemoteHandle.release` would have raised
        otherwise: ViewInUse (the slot is kept) while its view is still
        exported, InvalidArgument for a handle of another connection, or
        what the daemon answers (StaleHandle, ...). One round trip per
        MAX_BATCH handles; none with a version 4 daemon for the handles this
        connection issued (their release is sent unanswered: the daemon
        holds them for this connection alone, so it has nothing to refuse,
        and applies it before it reads the next request)."""
        out: list[ChmError | None] = [None] * len(handles)
        live: list[int] = []
        for i, h in enumerate(handles):
            if h._dev is not self:
                out[i] = InvalidArgument(None, f"{h!r} belongs to another connection")
                continue
            if h.released:
                continue
            if not h._end_view():
                out[i] = h._in_use()
                continue
            h.released = True
            live.append(i)
        if self._closed:
            return out  # the daemon released everything of this connection
        if self.version >= 4:
            own = [i for i in live if handles[i]._own]
            for k in range(0, len(own), MAX_BATCH):
                self._tell(Op.RELEASE_QUIET, [handles[i].token for i in own[k : k + MAX_BATCH]])
            live = [i for i in live if not handles[i]._own]  # adopt()ed: the daemon says
        for k in range(0, len(live), MAX_BATCH):
            part = live[k : k + MAX_BATCH]
            rcs = self._call(Op.RELEASE, [handles[i].token for i in part])
            for i, rc in zip(part, rcs, strict=True):
                if rc < 0 and rc != -errno.ECANCELED:
                    out[i] = _ll.status_error(
                        rc, "chm_prefetch_release_many", f"h={handles[i].token:#x}"
                    )
        return out

    def view_info(self, handle: RemoteHandle) -> tuple[int, int, int]:
        """(dev_addr, length, pool_offset) of a staged handle, asked again."""
        ((rc, off, n, addr),) = self._call(Op.WAIT, [0, [handle.token]])
        if rc:
            raise _err(rc, "chm_prefetch_wait", f"handle={handle.token:#x}")
        return addr, n, off

    def adopt(self, token: int) -> RemoteHandle:
        """A handle for a raw token (another client's token is refused on use)."""
        return RemoteHandle(self, int(token))

    # ---- data path

    def read(self, addr: int, length: int) -> bytes:
        out = bytearray(length)
        self.read_into(addr, out)
        return bytes(out)

    def read_into(self, addr: int, buf: Any) -> int:
        dst = as_dst(buf, "read_into buffer")
        n = dst.size
        done = 0
        with self._area_lock:
            while done < n:
                step = min(self.area_bytes, n - done)
                rc = self._call(Op.READ, [int(addr) + done, step, 0])
                if rc < 0:
                    raise self._raw_error(rc, "chm_read", f"addr={addr + done:#x}, len={step}")
                self._pull(step)
                dst[done : done + step] = self._area_np[:step]
                done += step
        return n

    def write(self, addr: int, data: Any) -> bool:
        """Offers an object for writing (as ``chm.Device.write``): True if
        admitted, False if skipped; raises what the device refuses it for."""
        (res,) = self.write_many([addr], [data])
        if isinstance(res, ChmError):
            raise res
        return res

    def write_length(self, addr: int, length: int) -> bool:
        """As ``chm.Device.write_length``, which only the ghost backend
        accepts: a daemon serves backends that move data (``chm-emu serve
        --backend`` is uring or pread), so this is always InvalidArgument,
        the error an embedded device of the same backend raises."""
        raise InvalidArgument(
            None,
            f"write_length(addr={addr}, len={length}): a write without a payload "
            f"needs the ghost backend, not {self.backend!r}",
            call="chm_write_object",
        )

    def write_many(self, addrs: Sequence[int], datas: Sequence[Any]) -> list[bool | ChmError]:
        """Offers several objects for writing, as ``chm.Device.write_many``:
        returns, in order, True (admitted), False (skipped) or the exception
        :meth:`write` would have raised for that object (InvalidArgument for
        a misaligned one, or one larger than this connection's shared area).
        Raises InvalidArgument for the call as a whole (lengths differ, more
        than CHM_BATCH_MAX elements, a bool or negative address). The bytes
        go through the shared area: one round trip per area's worth (or
        MAX_BATCH objects)."""
        call = "chm_write_objects"
        n = len(addrs)
        _batch_len(call, n, len(datas))
        a = _u64s(call, "addrs", addrs)
        srcs = []
        for i, d in enumerate(datas):
            try:
                srcs.append(as_src(d, f"bufs[{i}]"))
            except InvalidArgument as exc:
                raise InvalidArgument(None, f"{call}(bufs[{i}]=...): {exc}", call=call) from None
        out: list[bool | ChmError | None] = [None] * n
        batch: list[list[int]] = []
        where: list[int] = []
        used = 0

        def send() -> None:
            nonlocal used
            self._push(used)
            for i, rc in zip(where, self._call(Op.WRITE, batch), strict=True):
                if rc < 0:
                    out[i] = self._raw_error(rc, call, f"addr={a[i]:#x}, len={srcs[i].size}")
                else:
                    out[i] = rc == 1
            batch.clear()
            where.clear()
            used = 0

        with self._area_lock:
            for i, src in enumerate(srcs):
                if src.size > self.area_bytes:
                    out[i] = InvalidArgument(
                        None,
                        f"{call}(addr={a[i]:#x}, len={src.size}): larger than this connection's "
                        f"shared area ({self.area_bytes} bytes)",
                        call=call,
                    )
                    continue
                if used + src.size > self.area_bytes or len(batch) == MAX_BATCH:
                    send()
                self._area_np[used : used + src.size] = src
                batch.append([a[i], used, int(src.size)])
                where.append(i)
                used += -(-src.size // 4096) * 4096
            if batch:
                send()
        return [x for x in out if x is not None]

    def flush(self, timeout: float | None = None) -> None:
        rc = self._sliced(Op.FLUSH, timeout)
        if rc:
            _raise(rc, "chm_flush")

    def _sliced(self, op: Op, timeout: float | None) -> int:
        """A FLUSH or KV_FLUSH asked in slices of at most _WAIT_CHUNK (a
        flush that times out changes nothing), so each round trip has a
        deadline even when the flush has none; its last rc."""
        end = None if timeout is None else time.monotonic_ns() + timeout_ns(timeout)
        while True:
            left = None if end is None else max(0, end - time.monotonic_ns())
            chunk = _WAIT_CHUNK if left is None else min(left, _WAIT_CHUNK)
            rc = int(self._call(op, chunk, wait=chunk / 1e9))
            if rc != -errno.ETIMEDOUT or (left is not None and chunk >= left):
                return rc

    # ---- introspection

    def ping(self) -> float:
        """One round trip that changes nothing (an empty RELEASE); its
        seconds. A health check, and the request path's floor."""
        t0 = time.perf_counter()
        self._call(Op.RELEASE, [])
        return time.perf_counter() - t0

    def daemon_stats(self) -> dict[str, Any]:
        """Everything the daemon reports: device, kv, held, daemon."""
        return dict(self._call(Op.STATS, {}))

    def stats(self) -> Stats:
        return Stats.from_dict(self.daemon_stats()["device"])

    @property
    def config(self) -> Config:
        return self._config.copy()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def slot_bytes(self) -> int:
        return int(self._config.slot_bytes)

    @property
    def backend(self) -> str:
        return str(self._config.backend)

    @property
    def mode(self) -> str:
        return str(self._config.mode)

    @property
    def closed(self) -> bool:
        return self._closed

    def kv(self, namespace: Namespace | None = None) -> RemoteStore:
        """The daemon's KV store (one index shared by every client)."""
        if not self.welcome.get("kv"):
            raise InvalidArgument(None, "this daemon serves no KV store (started with --no-kv?)")
        return RemoteStore(self, namespace or Namespace())

    def close(self) -> None:
        """Flushes this client's admitted writes (as ``Device.close`` does), then
        disconnects; the daemon releases whatever it still holds. Idempotent.

        As ``Device.close``: the views of its handles end (a memoryview from
        ``wait()`` raises ValueError on use), so none shows bytes the daemon
        stages into the slot afterwards; raises ViewInUse, leaving the
        connection open and every view valid, while any view is still
        exported by something else (e.g. a numpy array)."""
        with self._vlock:
            if self._ending:
                return
            held = [h for h in list(self._viewed) if h._buf is not None and not h.released]
            for h in held:  # all or nothing: refuse before ending any view
                if h._exported():
                    raise h._in_use()
            for h in held:
                if not h._end_view():  # a slice of a view keeps it exported
                    raise h._in_use()
            self._ending = True
        if not self._closed:
            with contextlib.suppress(ChmError, ProtocolError, OSError):
                self.flush(timeout=30.0)
        with self._lock:
            was, self._closed = self._closed, True
            if not was and not self._broken and self.version >= 3:
                with contextlib.suppress(OSError, ProtocolError):  # an orderly close
                    self._sock.settimeout(1.0)
                    self._sock.send(encode(Op.BYE, self._seq + 1, {}))
        if was:
            return
        with contextlib.suppress(OSError):
            self._sock.close()
        self._pool_mv.release()
        self._area_np = np.zeros(0, np.uint8)
        if self._engine is not None:
            self._engine.close()
        for m in (self._pool, self._area):
            if m is not None:
                with contextlib.suppress(BufferError):
                    m.close()
        for fd in (self.pool_fd, self.area_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __enter__(self) -> RemoteDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<chm.remote.RemoteDevice {self.path} session={self.session}>"


class _EngineLink:
    """A TCP client's Transfer Engine data path to a storage node
    (:meth:`RemoteDevice.use_engine`): a registered mirror of the client's
    area and a registered scratch buffer for staged objects."""

    def __init__(self, dev: RemoteDevice, engine: Any, t: dict[str, Any]) -> None:
        from chm.remote.transfer import RegisteredBuffer

        self.dev, self.engine = dev, engine
        self.peer = str(t["engine"])
        self.pool_addr, self.area_addr = int(t["pool_addr"]), int(t["area_addr"])
        self.area = RegisteredBuffer(engine, dev.area_bytes)
        self.area_view = self.area.view(0, dev.area_bytes)
        self.scratch = RegisteredBuffer(engine, max(dev.area_bytes, 64 << 20))
        self.fetched: dict[int, tuple[int, int]] = {}  # token -> (scratch offset, len)

    def _failed(self, what: str, status: str) -> DaemonGone:
        # a late transfer may still land: the connection (and the node's area) goes
        self.dev._break(f"the Transfer Engine's {what} ended {status}")
        return DaemonGone(None, f"{what}: {self.dev._broken}")

    def move(self, what: str, n: int) -> None:
        """The first ``n`` bytes of the area: ``write`` to the node, ``read`` back."""
        from chm.remote.transfer import OK

        if n <= 0:
            return
        fn = self.engine.write if what == "write" else self.engine.read
        status = fn(
            self.peer,
            [self.area.addr],
            [self.area_addr],
            [n],
            timeout=self.dev.request_timeout,
            on_late=lambda: lambda: None,  # the area mirror is this client's alone
        )
        if status != OK:
            raise self._failed(f"area {what}", status)

    def fetch(self, items: Sequence[tuple[int, int, int]]) -> None:
        from chm.remote.transfer import OK

        offs: list[int] = []
        for _, _, n in items:
            try:
                offs.append(self.scratch.take(n))
            except ChmError:
                break  # no room: the rest are read one by one
        if not offs:
            return
        k = len(offs)
        status = self.engine.read(
            self.peer,
            [self.scratch.addr + o for o in offs],
            [self.pool_addr + off for _, off, _ in items[:k]],
            [n for _, _, n in items[:k]],
            timeout=self.dev.request_timeout,
            on_late=self._late(offs, [n for _, _, n in items[:k]]),
        )
        if status != OK:
            for o, (_, _, n) in zip(offs, items, strict=False):
                if status != "timeout":
                    self.scratch.give(o, n)
            return  # read one by one (or POOL_GET) instead
        for o, (tok, _, n) in zip(offs, items, strict=False):
            old = self.fetched.pop(tok, None)
            if old is not None:
                self.scratch.give(*old)
            self.fetched[tok] = (o, n)

    def _late(self, offs: list[int], lens: list[int]) -> Any:
        def quarantine() -> Any:
            backs = [self.scratch.quarantine(o, n) for o, n in zip(offs, lens, strict=True)]
            return lambda: [b() for b in backs]

        return quarantine

    def staged(self, token: int, off: int, n: int) -> memoryview:
        got = self.fetched.pop(token, None)
        if got is None:
            self.fetch([(token, off, n)])
            got = self.fetched.pop(token, None)
        if got is None:
            raise self._failed("staged read", "without the bytes")
        o, ln = got
        try:
            return memoryview(self.scratch.view(o, min(n, ln)).tobytes())
        finally:
            self.scratch.give(o, ln)

    def drop_fetched(self) -> None:
        for o, n in self.fetched.values():
            self.scratch.give(o, n)
        self.fetched.clear()

    def close(self) -> None:
        self.drop_fetched()
        self.area_view = np.zeros(0, np.uint8)
        self.area.close()
        self.scratch.close()


def _dial(path: str, timeout: float) -> socket.socket:
    """A connected socket to the daemon; waits up to ``timeout`` seconds
    while its listen backlog is full, then DaemonGone."""
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            s.settimeout(max(0.001, deadline - time.monotonic()))
            s.connect(path)
            return s
        except FileNotFoundError:
            s.close()
            raise DaemonGone(None, f"no daemon socket at {path}") from None
        except ConnectionRefusedError:
            s.close()
            raise DaemonGone(None, f"no daemon is serving on {path}") from None
        except PermissionError:
            s.close()
            raise PermissionError(
                errno.EACCES,
                f"{path}: not allowed to connect (socket mode 0660: "
                "the daemon's user or group only)",
            ) from None
        except (BlockingIOError, TimeoutError) as exc:  # the backlog is full
            s.close()
            if time.monotonic() + pause > deadline:
                raise DaemonGone(
                    None,
                    f"{path}: the daemon accepted no connection within {timeout} s "
                    f"(its listen backlog is full: {_oserr(exc) if exc.errno else 'timed out'})",
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        except BaseException:
            s.close()
            raise


def _dial_tcp(path: str, timeout: float, secret_file: str | None) -> tuple[Framed, bytes]:
    """A TCP connection to ``tcp://HOST:PORT`` and the proof of the shared
    secret for its AUTH nonce."""
    if not secret_file:
        raise InvalidArgument(None, f"connect({path!r}): a TCP daemon needs secret_file=")
    try:
        secret = read_secret(secret_file)
    except ValueError as exc:
        raise InvalidArgument(None, f"connect: secret_file {exc}") from None
    hostport = path[len("tcp://") :]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgument(None, f"connect({path!r}): expected tcp://HOST:PORT")
    try:
        raw = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except ConnectionRefusedError:
        raise DaemonGone(None, f"{path}: no daemon is listening there") from None
    except TimeoutError:
        raise DaemonGone(None, f"{path}: no connection within {timeout} s") from None
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s = Framed(raw)
    try:
        data = s.recv()
        if not data:
            raise DaemonGone(None, f"{path}: the daemon closed the connection before AUTH")
        op, _, body = decode(data)
        if op == Op.ERROR:
            raise DaemonGone(None, f"{path}: refused by the daemon: {body.get('message')}")
        if op != Op.AUTH or not isinstance(body.get("nonce"), bytes):
            raise ProtocolError(f"{path}: expected AUTH first, got {op.name}")
        return s, auth_digest(secret, body["nonce"])
    except TimeoutError:
        s.close()
        raise DaemonGone(None, f"{path}: no AUTH within {timeout} s") from None
    except BaseException:
        s.close()
        raise


def _batch_len(call: str, n: int, *others: int) -> None:
    """The whole-call checks of the C batch calls, with their messages."""
    if any(m != n for m in others):
        raise InvalidArgument(None, f"{call}(n={n}): array lengths differ: {(n, *others)}")
    if n > _ll.BATCH_MAX:
        raise InvalidArgument(
            None, f"{call}(n={n}): more than CHM_BATCH_MAX ({_ll.BATCH_MAX}) elements"
        )


def _u64s(call: str, name: str, values: Sequence[Any]) -> list[int]:
    """Unsigned 64-bit integers, refused as the C binding refuses them: a
    bool or a value out of range is InvalidArgument, a non-integer TypeError."""
    out = []
    for v in values:
        if isinstance(v, bool):
            raise InvalidArgument(None, f"{call}({name}=...): a bool is not an integer")
        try:
            x = operator.index(v)
        except TypeError:
            raise TypeError(f"{call}({name}=...): an integer is required, not {v!r}") from None
        if not 0 <= x < 2**64:
            raise InvalidArgument(None, f"{call}({name}=...): {x} is out of range")
        out.append(x)
    return out


def _err(rc: int, call: str, what: str = "") -> ChmError:
    """The exception of a -errno answer. Not ``_lowlevel._check``: that adds
    the reason this process's C core last recorded, which is not the daemon's."""
    if rc >= 0:
        raise AssertionError(f"{call}: rc {rc} is not an error")
    err: ChmError = _ll.status_error(rc, call, what)
    return err


def _pairs(ks: np.ndarray[Any, Any]) -> list[list[int]]:
    return [[int(h), int(lo)] for h, lo in zip(ks["hi"].tolist(), ks["lo"].tolist(), strict=True)]


class RemoteStore:
    """The daemon's KV store: contains, prefix_len, put (with metadata),
    get, load_prefix, entries, meta, remove, flush, stats. Loads are
    zero-copy out of the shared pool into the caller's buffers,
    checksum-verified here; one round trip per batch of up to MAX_BATCH keys
    with a version 4 daemon (KV_LOAD, then KV_DONE_QUIET unanswered; more
    only for blocks not staged within the first 20 ms slice), three with an
    older one (KV_LOOKUP, WAIT, KV_DONE)."""

    def __init__(self, dev: RemoteDevice, namespace: Namespace) -> None:
        self.device = dev
        self.namespace = namespace

    def _ks(self, keys: Any) -> np.ndarray[Any, Any]:
        return self.namespace.keys(keys)

    def contains(self, keys: Any) -> list[bool]:
        ks = self._ks(keys)
        out: list[bool] = []
        for i in range(0, ks.size, MAX_BATCH):
            out += self.device._call(Op.KV_CONTAINS, _pairs(ks[i : i + MAX_BATCH]))
        return out

    def prefix_len(self, keys: Any) -> int:
        ks = self._ks(keys)
        n = 0
        for i in range(0, ks.size, MAX_BATCH):
            part = ks[i : i + MAX_BATCH]
            got = int(self.device._call(Op.KV_PREFIX_LEN, _pairs(part)))
            n += got
            if got < part.size:
                break
        return n

    def put(
        self, keys: Any, srcs: Sequence[Any], meta: Sequence[bytes | None] | None = None
    ) -> list[PutStatus]:
        """As ``Store.put``: a status per key; ``meta`` a small bytes field per
        key kept with its entry (see ``Store.put``)."""
        ks = self._ks(keys)
        if len(srcs) != ks.size:
            raise InvalidArgument(None, f"put: {ks.size} keys but {len(srcs)} sources")
        metas = check_meta(meta, ks.size)
        bufs = [as_src(s, f"source {j}") for j, s in enumerate(srcs)]
        with self.device._area_lock:
            return self._put_all(ks, bufs, metas)

    def _put_all(
        self, ks: np.ndarray[Any, Any], bufs: list[Any], metas: list[bytes]
    ) -> list[PutStatus]:
        dev = self.device
        out: list[PutStatus] = []
        batch: list[list[Any]] = []
        used = wire = 0
        for j, b in enumerate(bufs):
            if b.size > dev.area_bytes:
                raise InvalidArgument(None, f"source {j}: larger than the shared area")
            m = metas[j]
            if (
                used + b.size > dev.area_bytes
                or len(batch) == MAX_BATCH
                or wire + len(m) + 64 > _WIRE_BUDGET
            ):
                out += self._put(batch)
                batch, used, wire = [], 0, 0
            dev._area_np[used : used + b.size] = b
            e: list[Any] = [int(ks[j]["hi"]), int(ks[j]["lo"]), used, int(b.size)]
            if m:
                e.append(m)
            batch.append(e)
            used += -(-b.size // 4096) * 4096
            wire += len(m) + 64
        if batch:
            out += self._put(batch)
        return out

    def entries(self, keys: Any) -> list[dict[str, Any] | None]:
        """As ``Store.entries``: per key its index entry (``addr``,
        ``length``, ``checksum``, ``epoch``, ``state``, ``meta``) or None."""
        ks = self._ks(keys)
        out: list[dict[str, Any] | None] = []
        step = _WIRE_BUDGET // (MAX_META + 96)  # an answer always fits a packet
        for i in range(0, ks.size, step):
            for e in self.device._call(Op.KV_ENTRIES, _pairs(ks[i : i + step])):
                out.append(None if e is None else dict(zip(_ENTRY_NAMES, e, strict=True)))
        return out

    def meta(self, keys: Any) -> list[bytes | None]:
        """As ``Store.meta``: per key its metadata (b"" when none), None when absent."""
        return [None if e is None else e["meta"] for e in self.entries(keys)]

    def _put(self, batch: list[list[Any]]) -> list[PutStatus]:
        self.device._push(max((e[2] + e[3] for e in batch), default=0))
        res = self.device._call(Op.KV_PUT, batch)
        if isinstance(res, int):
            _raise(res, "put")
        return [PutStatus(s) for s in res]

    def _load(
        self, ks: np.ndarray[Any, Any], dsts: Sequence[Any], timeout: float | None, prefix: bool
    ) -> list[bool]:
        """Lookup (pins + prefetches in the daemon), then waits in short slices,
        copying and handing back (KV_DONE) whatever is staged after each, so
        slots keep moving even when the batch is larger than this client's
        share of the staging window."""
        dev = self.device
        ok = [False] * ks.size
        end = None if timeout is None else time.monotonic_ns() + timeout_ns(timeout)
        failed = False
        quiet = dev.version >= 4
        done_op = Op.KV_DONE_QUIET if quiet else Op.KV_DONE
        for i in range(0, ks.size, MAX_BATCH):
            part = ks[i : i + MAX_BATCH]
            pairs = _pairs(part)
            res: list[list[int]] | None = None
            if quiet:  # lookup and the first wait slice in one round trip
                left = _WAIT_SLICE if end is None else max(0, end - time.monotonic_ns())
                step = min(left, _WAIT_SLICE)
                got = dev._call(Op.KV_LOAD, [step, pairs, prefix], wait=step / 1e9)
                ents = [[rc, tok, n, csum] for rc, tok, n, csum, _off in got]
                res = [[rc, off, n, 0] for rc, tok, n, _csum, off in got if tok]
            else:
                ents = dev._call(Op.KV_LOOKUP, [pairs, prefix])
            pend = [(j, e) for j, e in enumerate(ents) if e[1] != 0 or e[0] == 0]
            tail_miss = prefix and len(pend) < part.size  # the prefix ends in this batch
            try:
                while pend:
                    left = _WAIT_SLICE if end is None else max(0, end - time.monotonic_ns())
                    step = min(left, _WAIT_SLICE)
                    if res is None:
                        toks = [e[1] for _, e in pend]
                        res = dev._call(Op.WAIT, [step, toks], wait=step / 1e9)
                    ready = zip(pend, res, strict=True)
                    dev._fetch_staged([(e[1], r[1], e[2]) for (_, e), r in ready if r[0] == 0])
                    done, rest = [], []
                    for (j, e), (rc, off, _n, _a) in zip(pend, res, strict=True):
                        if rc == -errno.ETIMEDOUT and left > 0:
                            rest.append((j, e))
                            continue
                        bad = 0
                        if rc == 0 and not (prefix and failed):
                            view = dev._staged(e[1], off, e[2])
                            try:
                                if _hash(view) == e[3]:
                                    d = as_dst(dsts[i + j], f"destination {i + j}")
                                    d[: e[2]] = np.frombuffer(view, np.uint8)
                                    ok[i + j] = True
                                else:
                                    bad = 1
                            finally:
                                view.release()
                        failed = failed or (prefix and not ok[i + j])
                        done.append([*pairs[j], e[1], bad])
                    res = None
                    if done:
                        self._done(done_op, done)
                    pend = rest
            finally:
                if pend:
                    self._done(done_op, [[*pairs[j], e[1], 0] for j, e in pend])
            if prefix and (failed or tail_miss):
                break
        if prefix:
            n = 0
            while n < len(ok) and ok[n]:
                n += 1
            ok[n:] = [False] * (len(ok) - n)
        return ok

    def _done(self, op: Op, items: list[list[int]]) -> None:
        """Hands loaded blocks back: KV_DONE, or unanswered (version 4)."""
        if op == Op.KV_DONE_QUIET:
            self.device._tell(op, items)
        else:
            self.device._call(op, items)

    def get(self, keys: Any, dsts: Sequence[Any], timeout: float | None = None) -> list[bool]:
        ks = self._ks(keys)
        if len(dsts) != ks.size:
            raise InvalidArgument(None, f"get: {ks.size} keys but {len(dsts)} destinations")
        return self._load(ks, dsts, timeout, prefix=False)

    def load_prefix(self, keys: Any, dsts: Sequence[Any], timeout: float | None = None) -> int:
        ks = self._ks(keys)
        ok = self._load(ks, dsts, timeout, prefix=True)
        n = 0
        while n < len(ok) and ok[n]:
            n += 1
        return n

    def remove(self, keys: Any) -> list[bool]:
        ks = self._ks(keys)
        out: list[bool] = []
        for i in range(0, ks.size, MAX_BATCH):
            out += self.device._call(Op.KV_REMOVE, _pairs(ks[i : i + MAX_BATCH]))
        return out

    def flush(self, timeout: float | None = None) -> None:
        rc = self.device._sliced(Op.KV_FLUSH, timeout)
        if rc:
            _raise(rc, "flush")

    def stats(self) -> dict[str, Any]:
        return dict(self.device.daemon_stats()["kv"])

    @property
    def reports_staging(self) -> bool:
        """Whether the daemon takes :meth:`report_staging` (KV_STAGING)."""
        return bool(self.device.welcome.get("staging_report"))

    def report_staging(self, counters: Any) -> bool:
        """Tells the daemon this client's staging-queue counters (a
        ``chm.kv.StagingStats`` or a dict with its fields), which it exports
        in its stats and metrics (``chm_kv_staging_*``). False, and nothing
        sent, when the daemon predates the request."""
        if not self.reports_staging:
            return False
        d = counters if isinstance(counters, dict) else counters.to_dict()
        self.device._call(Op.KV_STAGING, {k: int(d[k]) for k in STAGING_COUNTERS})
        return True


def connect(
    path: str,
    timeout: float = 10.0,
    request_timeout: float = 30.0,
    secret_file: str | None = None,
) -> RemoteDevice:
    """Connects to a chm-emu daemon's socket; the result is a ``DeviceLike``.

    ``path`` is the daemon's Unix socket, or ``tcp://HOST:PORT`` for one
    started with ``--listen`` (then ``secret_file`` holds the shared secret;
    staged objects and area bytes are copied over the connection instead of
    shared).

    ``timeout`` bounds the connection and its handshake (waiting while the
    daemon's listen backlog is full); ``request_timeout`` is how long the
    daemon has to answer any request beyond the request's own timeout (a
    ``wait(timeout=1)`` gives up after 1 s + request_timeout). Past either,
    DaemonGone: no call blocks forever on a stopped or hung daemon."""
    return RemoteDevice(os.fspath(path), timeout, request_timeout, secret_file)
