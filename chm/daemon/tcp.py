"""The daemon's TCP front end (``chm-emu serve --listen HOST:PORT --secret-file F``).

A TCP client is served exactly as a local one: the front end authenticates
it, then connects it to the daemon through a private socket pair, so it gets
a :class:`~chm.daemon.connection.Client` of its own (session, quota, cleanup
when it goes) and speaks the same protocol, with these differences
(``fw_spec/protocol.md``, "TCP"):

- packets are framed (:class:`chm.remote.protocol.Framed`);
- the daemon's first packet is AUTH with a random nonce; the client's HELLO
  must carry ``auth`` = HMAC-SHA256(secret, nonce), or the connection is
  refused (a fatal ERROR, EACCES) before any request is read;
- descriptors cannot cross TCP: the front end keeps the client's shared area
  and the pool mapped here and moves their bytes over the socket (AREA_PUT,
  AREA_GET, and POOL_GET for the staged object of a token the client holds).
  Their seq is counted as any request's; the front end renumbers what it
  forwards.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import mmap
import os
import secrets
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from chm.remote.protocol import (
    MAX_FRAME,
    QUIET,
    Framed,
    Op,
    ProtocolError,
    auth_digest,
    decode,
    encode,
    recv_fds,
    released_by,
    staged_by,
)

if TYPE_CHECKING:
    from .options import Host

__all__ = ["TcpFront", "parse_hostport"]

_DATA = MAX_FRAME - 1024  # bytes of data in one AREA_GET / POOL_GET answer


def parse_hostport(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (ValueError naming what is wrong)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{text!r}: expected HOST:PORT, e.g. 0.0.0.0:7464")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: port {int(port)} is not in 0..65535")
    return host.strip("[]"), int(port)


class TcpFront:
    def __init__(self, daemon: Host, listen: str, secret: bytes) -> None:
        self.d = daemon
        self.secret = secret
        host, port = parse_hostport(listen)
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(64)
        s.settimeout(0.2)
        self.listener = s
        self.address = s.getsockname()[:2]
        self._thread = threading.Thread(target=self._serve, name="chm-tcp", daemon=True)
        self._relays: set[_Relay] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        while not self.d.stopping.is_set():
            try:
                conn, peer = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            conn.setblocking(True)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            r = _Relay(self, Framed(conn), f"{peer[0]}:{peer[1]}")
            with self._lock:
                self._relays.add(r)
            threading.Thread(target=r.run, name=f"chm-tcp-{peer[1]}", daemon=True).start()

    def done(self, r: _Relay) -> None:
        with self._lock:
            self._relays.discard(r)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            live = list(self._relays)
        for r in live:
            r.stop()
        self._thread.join(timeout=5.0)


class _Relay:
    """One TCP client: authentication, then packets to and from its Client."""

    def __init__(self, front: TcpFront, net: Framed, peer: str) -> None:
        self.front = front
        self.net = net
        self.peer = peer
        self.inner: socket.socket | None = None
        self.area: mmap.mmap | None = None
        self.pool: mmap.mmap | None = None
        self.skip = 0  # requests answered here: the Client's seq lags by this
        self.staged: dict[int, tuple[int, int]] = {}  # token -> (pool offset, len)
        self.last: tuple[Op, Any] | None = None  # the request forwarded, unanswered
        self.area_addr: int | None = None  # the area's address, registered with the engine

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.net.shutdown(socket.SHUT_RDWR)

    def _refuse(self, err: int, message: str) -> None:
        with contextlib.suppress(OSError, ProtocolError):
            self.net.send(encode(Op.ERROR, 0, {"errno": err, "message": message, "fatal": True}))
            # read what it sent until it hangs up (at most 1 s): closing with
            # bytes unread would reset the connection before it reads why
            self.net.shutdown(socket.SHUT_WR)
            end = time.monotonic() + 1.0
            while (left := end - time.monotonic()) > 0:
                self.net.settimeout(left)
                if not self.net.sock.recv(65536):
                    break
        self.front.d.log.warning(
            "tcp client refused", extra={"event": "refuse", "peer": self.peer, "reason": message}
        )
        self.front.d.count("clients_refused")

    def run(self) -> None:
        try:
            self._run()
        except ProtocolError as exc:  # after HELLO: the client broke the framing
            with contextlib.suppress(OSError, ProtocolError):
                body = {"errno": errno.EPROTO, "message": f"protocol error: {exc}", "fatal": True}
                self.net.send(encode(Op.ERROR, 0, body))
        except OSError:
            pass  # the Client logs the disconnect; a refusal was logged above
        except Exception:  # a bug here: logged; the other clients are served on
            self.front.d.log.exception("tcp front end failed", extra={"peer": self.peer})
        finally:
            node = self.front.d.node
            if self.area_addr is not None and node is not None:
                node.detach(self.area_addr)  # before the area is unmapped
            for m in (self.area, self.pool):
                if m is not None:
                    with contextlib.suppress(BufferError):
                        m.close()
            if self.inner is not None:
                self.inner.close()
            self.net.close()
            self.front.done(self)

    def _run(self) -> None:
        d = self.front.d
        nonce = secrets.token_bytes(32)
        self.net.send(encode(Op.AUTH, 0, {"nonce": nonce}))
        self.net.settimeout(d.opts.hello_timeout)
        try:
            data = self.net.recv()
        except TimeoutError:
            self._refuse(errno.EPROTO, f"no HELLO within {d.opts.hello_timeout:g} s")
            return
        except ProtocolError as exc:
            self._refuse(errno.EPROTO, f"protocol error: {exc}")
            return
        self.net.settimeout(None)
        if not data:
            return
        try:
            op, seq, body = decode(data)
        except ProtocolError as exc:
            self._refuse(errno.EPROTO, f"protocol error: {exc}")
            return
        auth = body.get("auth") if isinstance(body, dict) else None
        want = auth_digest(self.front.secret, nonce)
        if op != Op.HELLO or not isinstance(auth, bytes) or not hmac.compare_digest(auth, want):
            self._refuse(errno.EACCES, "authentication failed: HELLO without the shared secret")
            return
        inner, mine = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.inner = inner
        if not d.adopt(mine, peer=self.peer):
            self._refuse(errno.EBUSY, "the daemon is full (max_clients)")
            return
        fwd = {k: v for k, v in body.items() if k != "auth"}
        inner.send(encode(Op.HELLO, seq, fwd))
        data, fds = recv_fds(inner, 2)
        try:
            if not data:
                return
            wop, _, welcome = decode(data)
            if wop == Op.HELLO and len(fds) == 2:
                self.pool = mmap.mmap(
                    fds[0], welcome["pool_bytes"], mmap.MAP_SHARED, mmap.PROT_READ
                )
                self.area = mmap.mmap(fds[1], welcome["area_bytes"], mmap.MAP_SHARED)
                welcome = {**welcome, "transport": "tcp"}
                node = self.front.d.node
                if node is not None:  # the engine moves its bytes: chm.daemon.node
                    self.area_addr, extra = node.attach(self.area)
                    welcome.update(extra)
                data = encode(Op.HELLO, 0, welcome)
        finally:
            for fd in fds:
                os.close(fd)
        self.net.send(data)
        self._pump()

    def _pump(self) -> None:
        assert self.inner is not None
        inner, net = self.inner, self.net
        while True:
            if net.pending():
                r = [net.fileno()]
            else:
                r, _, _ = select.select([net.fileno(), inner.fileno()], [], [])
            if inner.fileno() in r:  # an answer (or an ERROR of the daemon's own)
                data = inner.recv(MAX_FRAME + 1)
                if not data:
                    return
                net.send(self._answer(data))
                continue
            data = net.recv()
            if not data:
                return
            op, seq, body = decode(data)
            if op in (Op.AREA_PUT, Op.AREA_GET, Op.POOL_GET):
                net.send(encode(op, seq, self._data(op, body)))
                self.skip += 1
                continue
            for tok in released_by(op, body):  # handed back: no longer served here
                self.staged.pop(int(tok), None)
            if op in QUIET:  # unanswered
                inner.send(encode(op, seq - self.skip, body))
                continue
            self.last = (op, body)
            inner.send(encode(op, seq - self.skip, body))

    def _answer(self, data: bytes) -> bytes:
        op, seq, body = decode(data)
        last, self.last = self.last, None
        if last is not None and op == last[0] and isinstance(body, list):
            self._track(op, last[1], body)
        return encode(op, seq + self.skip, body)

    def _track(self, op: Op, req: Any, ans: list[Any]) -> None:
        """The pool ranges of the tokens this client holds, for POOL_GET,
        and the bytes staged for TCP clients (a storage node's health)."""
        staged = 0
        for tok, off, n in staged_by(op, req, ans):  # WAIT, STAGE, KV_LOAD
            self.staged[tok] = (off, n)
            staged += n
        if staged:
            self.front.d.count("tcp_bytes_staged", staged)
        if op == Op.RELEASE:
            for tok in req:
                self.staged.pop(int(tok), None)
        elif op == Op.KV_DONE:
            for e in req:
                self.staged.pop(int(e[2]), None)

    def _data(self, op: Op, body: Any) -> Any:
        """AREA_PUT / AREA_GET / POOL_GET: an answer, or a negative errno."""
        area, pool = self.area, self.pool
        if area is None or pool is None or not isinstance(body, list):
            return -errno.EINVAL
        try:
            if op == Op.AREA_PUT:
                off, blob = int(body[0]), body[1]
                if not isinstance(blob, bytes) or not 0 <= off <= len(area) - len(blob):
                    return -errno.EINVAL
                area[off : off + len(blob)] = blob
                return 0
            off, n = int(body[-2]), int(body[-1])
            if not 0 <= n <= _DATA or off < 0:
                return -errno.EINVAL
            if op == Op.AREA_GET:
                if off + n > len(area):
                    return -errno.EINVAL
                return bytes(area[off : off + n])
            got = self.staged.get(int(body[0]))
            if got is None:
                return -errno.ESTALE  # not a staged object of this client
            base, length = got
            if off + n > length:
                return -errno.EINVAL
            return bytes(pool[base + off : base + off + n])
        except (TypeError, ValueError, IndexError):
            return -errno.EINVAL
