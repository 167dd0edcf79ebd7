"""The daemon's wire protocol (specified in ``fw_spec/protocol.md``).

One message is one SOCK_SEQPACKET packet holding one msgpack array
``[op, seq, body]``. The client's first message is HELLO; the daemon answers
with WELCOME and two file descriptors (SCM_RIGHTS): the DRAM pool (read-only)
and the client's shared area (read-write). After that the client sends one
request at a time, with ``seq`` one more than the last; the daemon answers
each with the same op and seq, or (version 3) with a non-fatal ERROR of the
same seq when the request failed as a whole (the connection stays open). A
protocol violation (a frame that does not decode, an unknown op, a wrong seq,
a second request before the answer, a frame over MAX_FRAME bytes) is answered
with a fatal ERROR and closes that client's connection. A version 3 client
ends with BYE.
"""

from __future__ import annotations

import array
import enum
import hashlib
import hmac
import os
import socket
import struct
from typing import Any

import msgpack

from chm.errors import InvalidArgument

__all__ = [
    "HELLO_VERSION",
    "MAX_BATCH",
    "MAX_FRAME",
    "QUIET",
    "STAGING_COUNTERS",
    "VERSION",
    "VERSIONS",
    "Framed",
    "Op",
    "ProtocolError",
    "auth_digest",
    "config_options",
    "decode",
    "encode",
    "read_secret",
    "recv_fds",
    "released_by",
    "send_fds",
    "staged_by",
]

# 2: KV_PUT metadata, KV_ENTRIES; 3: non-fatal ERROR answers, BYE; 4: STAGE,
# KV_LOAD (prefetch or lookup and wait in one request), RELEASE_QUIET and
# KV_DONE_QUIET (no answer: no round trip of their own)
VERSION = 4
VERSIONS = (1, 2, 3, 4)  # what a daemon accepts in HELLO (a version 1 client sends neither)
# A client sends HELLO version 3 with "max_version": 4, which a version 3
# daemon ignores (it answers WELCOME version 3); a version 4 daemon answers
# the highest version both speak.
HELLO_VERSION = 3
MAX_FRAME = 64 * 1024  # bytes in one packet, either way
MAX_BATCH = 256  # elements in one batched request


class Op(enum.IntEnum):
    ERROR = 0
    HELLO = 1
    PREFETCH = 2
    WAIT = 3
    RELEASE = 4
    READ = 5
    WRITE = 6
    FLUSH = 7
    STATS = 8
    KV_PUT = 9
    KV_LOOKUP = 10
    KV_DONE = 11
    KV_CONTAINS = 12
    KV_FLUSH = 13
    KV_REMOVE = 14
    KV_PREFIX_LEN = 15
    KV_ENTRIES = 16
    BYE = 17
    # TCP only (answered by the daemon's TCP front end, see Framed):
    AUTH = 18  # daemon -> client, first: {"nonce": bytes}
    AREA_PUT = 19  # [area_offset, bytes] -> 0
    AREA_GET = 20  # [area_offset, len] -> bytes
    POOL_GET = 21  # [token, offset, len] -> bytes of that token's staged object
    KV_STAGING = 22  # {counter: int, ...} -> 0: the client's staging-queue counters
    # version 4:
    # [timeout_ns, [[addr, len, flags], ...](, [token, ...] released first)]
    # -> [[rc, token, off, len, addr], ...]
    STAGE = 23
    KV_LOAD = 24  # [timeout_ns, [[hi, lo], ...], prefix] -> [[rc, token, len, xxh3, off], ...]
    RELEASE_QUIET = 25  # [token, ...]; no answer
    KV_DONE_QUIET = 26  # [[hi, lo, token, bad], ...]; no answer


# requests the daemon does not answer (nothing to wait for; BYE ends the connection)
QUIET = frozenset({Op.RELEASE_QUIET, Op.KV_DONE_QUIET})


def staged_by(op: Op, req: Any, ans: Any) -> list[tuple[int, int, int]]:
    """``(token, pool_offset, len)`` of each object an answer says is staged
    for the client (WAIT, STAGE, KV_LOAD); for a relay that serves its bytes."""
    out: list[tuple[int, int, int]] = []
    if not isinstance(ans, list):
        return out
    if op == Op.WAIT and isinstance(req, list) and len(req) == 2:
        for tok, e in zip(req[1], ans, strict=False):
            if isinstance(e, list) and len(e) == 4 and e[0] == 0:
                out.append((int(tok), int(e[1]), int(e[2])))
    elif op == Op.STAGE:
        out += [(int(e[1]), int(e[2]), int(e[3])) for e in ans if _ok(e, 5)]
    elif op == Op.KV_LOAD:
        out += [(int(e[1]), int(e[4]), int(e[2])) for e in ans if _ok(e, 5)]
    return out


def released_by(op: Op, req: Any) -> list[int]:
    """The tokens a request hands back (RELEASE, KV_DONE, their quiet forms,
    and those a STAGE releases before it prefetches)."""
    if not isinstance(req, list):
        return []
    if op in (Op.RELEASE, Op.RELEASE_QUIET):
        return [t for t in req if isinstance(t, int)]
    if op == Op.STAGE and len(req) == 3 and isinstance(req[2], list):
        return [t for t in req[2] if isinstance(t, int)]
    if op in (Op.KV_DONE, Op.KV_DONE_QUIET):
        return [e[2] for e in req if isinstance(e, list) and len(e) == 4 and isinstance(e[2], int)]
    return []


def _ok(e: Any, width: int) -> bool:
    return isinstance(e, list) and len(e) == width and e[0] == 0


# the counters a KV_STAGING report carries (chm.kv.StagingStats field names)
STAGING_COUNTERS = (
    "capacity_bytes",
    "queued_bytes",
    "submitted_blocks",
    "stored_blocks",
    "skipped_full",
    "skipped_timeout",
)


class ProtocolError(Exception):
    """A message that breaks the protocol; the connection is closed."""


def encode(op: int, seq: int, body: Any) -> bytes:
    data: bytes = msgpack.packb([int(op), seq, body], use_bin_type=True)
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"a {Op(op).name} message of {len(data)} bytes exceeds {MAX_FRAME}")
    return data


def decode(data: bytes) -> tuple[Op, int, Any]:
    """[op, seq, body] from one packet; ProtocolError naming what is wrong."""
    if not data:
        raise ProtocolError("empty packet")
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"packet of {len(data)} bytes exceeds {MAX_FRAME}")
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable packet ({type(exc).__name__}: {exc})") from None
    if not isinstance(msg, list) or len(msg) != 3:
        raise ProtocolError("a message is an array [op, seq, body]")
    op, seq, body = msg
    if not isinstance(op, int) or isinstance(op, bool) or op not in Op._value2member_map_:
        raise ProtocolError(f"unknown op {op!r}")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 2**63:
        raise ProtocolError(f"bad seq {seq!r}")
    return Op(op), seq, body


def send_fds(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def recv_fds(sock: socket.socket, maxfds: int) -> tuple[bytes, list[int]]:
    """One packet and the descriptors it carries (closed on a truncated packet)."""
    fds = array.array("i")
    data, anc, _flags, _ = sock.recvmsg(MAX_FRAME + 1, socket.CMSG_LEN(maxfds * fds.itemsize))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def auth_digest(secret: bytes, nonce: bytes) -> bytes:
    """What a TCP client answers the daemon's AUTH nonce with: HMAC-SHA256
    of the nonce under the shared secret (the secret never travels)."""
    return hmac.new(secret, b"chm-hello\0" + nonce, hashlib.sha256).digest()


def read_secret(path: str | os.PathLike[str]) -> bytes:
    """The shared secret of a TCP daemon or a remote node: the file's bytes,
    surrounding whitespace stripped. Refused (InvalidArgument) when others
    may read the file (mode must be 0600 or stricter), when it is empty, or
    when it holds fewer than 16 bytes."""
    name = os.fspath(path)
    if os.stat(path).st_mode & 0o077:
        raise InvalidArgument(None, f"secret file {name!r}: mode must be 0600 or stricter")
    with open(path, "rb") as f:
        secret = f.read().strip()
    if not secret:
        raise InvalidArgument(None, f"secret file {name!r} is empty")
    if len(secret) < 16:
        raise InvalidArgument(
            None, f"secret file {name!r}: at least 16 bytes are needed, not {len(secret)}"
        )
    return secret


class Framed:
    """A TCP stream as a packet socket: each packet is a 4-byte big-endian
    length and that many bytes (at most MAX_FRAME). Has the calls of a
    SOCK_SEQPACKET socket the protocol uses (send, recv, settimeout,
    fileno, shutdown, close); ``recv`` returns b"" at the end of the stream
    and raises ProtocolError for a length over MAX_FRAME."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()

    def fileno(self) -> int:
        return self.sock.fileno()

    def settimeout(self, t: float | None) -> None:
        self.sock.settimeout(t)

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> int:
        self.sock.sendall(struct.pack(">I", len(data)) + data)
        return len(data)

    def pending(self) -> bool:
        """Whether a packet (or part of one) is already buffered here."""
        return bool(self._buf)

    def _fill(self, n: int) -> bool:
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                return False
            self._buf += chunk
        return True

    def recv(self, bufsize: int = MAX_FRAME + 1) -> bytes:
        if not self._fill(4):
            return b""
        (n,) = struct.unpack(">I", self._buf[:4])
        if n > MAX_FRAME:
            raise ProtocolError(f"a packet of {n} bytes exceeds {MAX_FRAME}")
        if not self._fill(4 + n):
            return b""
        data = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        return data


_TIMING = (
    "ssd_read_lat_ns",
    "ssd_write_lat_ns",
    "ssd_read_bw_bps",
    "ssd_write_bw_bps",
    "ssd_channels",
    "dram_bw_bps",
    "link_bw_bps",
    "link_lat_ns",
)
_RENAMED = {
    "dram_bytes": "dram",
    "wbuf_bytes": "wbuf",
    "pool_kind": "pool",
    "slot_bytes": "slot_size",
    "slot_count": "slots",
    "lru_line_bytes": "lru_line",
    "resident_bytes": "resident",
    "object_bytes": "object_size",
}
# fields of Config.to_dict() that no option sets: derived from the targets
# (n_targets) or meaningful only to the daemon that opened them (create)
_DERIVED = ("create", "n_targets")
_SAME = (
    "capacity",
    "targets",
    "stripe_unit",
    "backend",
    "mode",
    "queue_depth",
    "sqpoll",
    "max_io",
    "numa_node",
    "pool_path",
    "refill_queue",
    "clock",
    "flush_high_water_pct",
    "time_dilation",
)


def config_options(effective: dict[str, Any]) -> dict[str, Any]:
    """Device options that rebuild an effective configuration (``Config.to_dict()``)."""
    out: dict[str, Any] = {k: effective[k] for k in _SAME if k in effective}
    for k, v in _RENAMED.items():
        if k in effective:
            out[v] = effective[k]
    for k in _TIMING:
        if k in effective.get("timing", {}):
            out[k] = effective["timing"][k]
    if not out.get("pool_path"):
        out.pop("pool_path", None)
    return out
