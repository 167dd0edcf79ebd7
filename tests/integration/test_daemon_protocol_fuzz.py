"""Protocol fuzzing against a real daemon (hypothesis).

Random bytes, truncated and oversized frames, wrong versions, unknown ops,
malformed bodies and out-of-order sequence numbers: each closes only the
offending connection (logged), never hangs the daemon, and a well-behaved
client connected the whole time keeps being served.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chm
from chm.errors import ChmError
from chm.remote import RemoteHandle
from chm.remote.protocol import MAX_FRAME, VERSION, VERSIONS, Op, decode, encode
from chm.testing.daemon_proc import DaemonProcess


def _handles(out: list[RemoteHandle | ChmError]) -> list[RemoteHandle]:
    """The handles of a prefetch_many that issued every element."""
    assert all(isinstance(h, RemoteHandle) for h in out), out
    return [h for h in out if isinstance(h, RemoteHandle)]


# one daemon for the module, and test_no_internal_errors reads its log after
# the others: the module runs on one pytest-xdist worker, in order
pytestmark = pytest.mark.xdist_group("daemon_protocol_fuzz")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("fuzz")
    args = ["--target", str(tmp / "t0.img"), "--create", "--capacity", "128M",
            "--dram", "40M", "--slot-size", "1M", "--backend", "pread", "--raw", "64M"]  # fmt: skip
    with DaemonProcess(args, tmp / "chm.sock") as d:
        yield d


def _raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(15.0)  # a hang fails the test instead of blocking it
    s.connect(path)
    return s


def _hello(s: socket.socket) -> None:
    s.send(encode(Op.HELLO, 0, {"version": VERSION}))
    s.recvmsg(MAX_FRAME + 1, socket.CMSG_LEN(8))  # WELCOME (descriptors closed with s)


def _closed_by_daemon(s: socket.socket) -> bool:
    """Drains answers (an ERROR first, maybe) until the daemon hangs up."""
    for _ in range(4):
        try:
            data = s.recv(MAX_FRAME + 1)
        except ConnectionResetError:  # closed with our unread request in its queue
            return True
        if not data:
            return True
        op, _, _ = decode(data)
        if op != Op.ERROR:
            return False
    return False


def _still_serving(dev: chm.remote.RemoteDevice) -> None:
    assert dev.read(0, 16) == bytes(16)
    assert dev.daemon_stats()["held"]["handles"] == 0


_PROFILE = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_PROFILE
@given(data=st.binary(min_size=1, max_size=512))
def test_random_bytes_before_hello(daemon: DaemonProcess, data: bytes) -> None:
    s = _raw(daemon.socket)
    try:
        s.send(data)
        try:
            op, seq, body = decode(data)
        except Exception:
            op = None
        if (
            op == Op.HELLO
            and seq == 0
            and isinstance(body, dict)
            and type(body.get("version")) is int
            and body["version"] in VERSIONS
        ):
            return  # hypothesis found a valid HELLO: nothing to check
        assert _closed_by_daemon(s)
    finally:
        s.close()


@_PROFILE
@given(
    version=st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=5), st.none()).filter(
        lambda v: not (type(v) is int and v in VERSIONS)
    )
)
def test_wrong_versions(daemon: DaemonProcess, version: object) -> None:
    s = _raw(daemon.socket)
    try:
        s.send(msgpack.packb([int(Op.HELLO), 0, {"version": version}]))
        assert _closed_by_daemon(s)
    finally:
        s.close()


_bodies = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=12,
)


@_PROFILE
@given(op=st.integers(-2, 20), seq=st.integers(-1, 3), body=_bodies, cut=st.integers(0, 64))
def test_bad_requests_after_hello(
    daemon: DaemonProcess, op: int, seq: int, body: object, cut: int
) -> None:
    with chm.connect(daemon.socket) as good:
        s = _raw(daemon.socket)
        try:
            _hello(s)
            frame = msgpack.packb([op, seq, body])
            if cut:
                frame = frame[: max(1, len(frame) - cut)]  # truncated
            s.send(frame)
            # answered (a valid request by chance; a request that failed as a
            # whole gets a non-fatal ERROR) or the connection closed
            data = s.recv(MAX_FRAME + 1)
            if data and decode(data)[0] == Op.ERROR and decode(data)[2]["fatal"]:
                assert _closed_by_daemon(s)
        finally:
            s.close()
        _still_serving(good)


def test_oversized_and_out_of_order(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as good:
        s = _raw(daemon.socket)
        _hello(s)
        s.send(b"\x93" + bytes(MAX_FRAME + 100))
        assert _closed_by_daemon(s)
        s.close()
        s = _raw(daemon.socket)
        _hello(s)
        s.send(encode(Op.STATS, 5, {}))  # seq must be 1
        assert _closed_by_daemon(s)
        s.close()
        s = _raw(daemon.socket)
        _hello(s)
        s.send(encode(Op.HELLO, 1, {"version": VERSION}))  # HELLO twice
        assert _closed_by_daemon(s)
        s.close()
        _still_serving(good)
    reasons = [e.get("reason", "") for e in daemon.events() if e.get("event") == "disconnect"]
    assert any("oversized packet" in r for r in reasons)
    assert any("out-of-order seq 5" in r for r in reasons)
    assert any("HELLO is not a request" in r for r in reasons)


def test_request_while_waiting_closes(daemon: DaemonProcess) -> None:
    """A second request sent before the answer to a blocked WAIT is out of order."""
    with chm.connect(daemon.socket) as holder:
        n = holder.stats().slots_total
        hs = _handles(
            holder.prefetch_many([i << 20 for i in range(min(n, 64))], [4096] * min(n, 64))
        )
        holder.wait_many(hs)
        s = _raw(daemon.socket)
        _hello(s)
        s.send(encode(Op.PREFETCH, 1, [[63 << 20, 4096, 0]]))
        ((rc, tok),) = decode(s.recv(MAX_FRAME + 1))[2]
        assert rc == 0
        s.send(encode(Op.WAIT, 2, [2**64 - 1, [tok]]))  # queued: blocks
        s.send(encode(Op.STATS, 3, {}))
        assert _closed_by_daemon(s)
        s.close()
        holder.release_many(hs)
        _still_serving(holder)


def test_no_internal_errors(daemon: DaemonProcess) -> None:
    """Runs last in this module: every bad input above was a protocol error."""
    assert not [e for e in daemon.events() if e.get("level") == "error"]
    reasons = [e.get("reason", "") for e in daemon.events() if e.get("event") == "disconnect"]
    assert not [r for r in reasons if r.startswith("internal error")]
    assert any(r.startswith("protocol error") for r in reasons)
