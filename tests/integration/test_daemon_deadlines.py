"""No client call blocks forever, and client slots are never held for nothing.

- ``chm.connect`` waits up to its timeout while the daemon's listen backlog is
  full (the daemon stopped with SIGSTOP), then raises DaemonGone;
- at ``max_clients`` a new client gets DaemonGone saying the daemon is full;
- silent connections (no HELLO) give way to real clients at ``max_clients``,
  and clients idle past ``--idle-timeout`` are disconnected, their slots
  reclaimed;
- a ``wait(timeout=1)`` against a stopped daemon raises DaemonGone after
  about 1 s plus the connection's ``request_timeout``;
- two requests sent without waiting for the first answer are a protocol
  error, as ``fw_spec/protocol.md`` says;
- DaemonGone says what happened with errno names, and the daemon's log tells
  a client that died from one that closed its connection.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import chm
from chm.remote import DaemonGone, RemoteHandle
from chm.remote.protocol import MAX_FRAME, VERSION, Op, decode, encode
from chm.testing.daemon_proc import DaemonProcess

ARGS = ["--create", "--capacity", "64M", "--dram", "40M", "--slot-size", "1M",
        "--backend", "pread", "--no-kv"]  # fmt: skip


def _serve(tmp: Path, *extra: str) -> DaemonProcess:
    return DaemonProcess(["--target", str(tmp / "t.img"), *ARGS, *extra], tmp / "s")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with _serve(tmp_path) as d:
        yield d


class _Stopped:
    """SIGSTOP for the length of a with block (SIGCONT after, always)."""

    def __init__(self, d: DaemonProcess) -> None:
        self.pid = d.pid

    def __enter__(self) -> _Stopped:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def _raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10.0)
    s.connect(path)
    return s


def _fill_backlog(path: str) -> list[socket.socket]:
    """Connections until the (stopped) daemon's listen backlog refuses more."""
    held: list[socket.socket] = []
    for _ in range(4096):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            return held
        held.append(s)
    raise AssertionError("the listen backlog never filled")


def test_connect_waits_out_a_full_backlog(daemon: DaemonProcess) -> None:
    with _Stopped(daemon):
        held = _fill_backlog(daemon.socket)
        try:
            t0 = time.monotonic()
            with pytest.raises(DaemonGone) as ei:
                chm.connect(daemon.socket, timeout=1.0)
            took = time.monotonic() - t0
        finally:
            for s in held:
                s.close()
    assert 0.9 <= took < 5.0, took
    assert "backlog" in str(ei.value) and "[Errno" not in str(ei.value)


def test_connect_succeeds_once_the_backlog_drains(daemon: DaemonProcess) -> None:
    got: list[object] = []
    with _Stopped(daemon):
        held = _fill_backlog(daemon.socket)
        t = threading.Thread(target=lambda: got.append(chm.connect(daemon.socket, timeout=20)))
        t.start()
        time.sleep(0.5)
        for s in held:
            s.close()
    t.join(30)
    assert len(got) == 1 and isinstance(got[0], chm.remote.RemoteDevice), got
    got[0].close()


def test_full_daemon_says_so(tmp_path: Path) -> None:
    with _serve(tmp_path, "--max-clients", "2") as d:
        a, b = chm.connect(d.socket), chm.connect(d.socket)
        try:
            with pytest.raises(DaemonGone) as ei:
                chm.connect(d.socket)
            assert "daemon is full" in str(ei.value) and "max_clients 2" in str(ei.value)
            assert "EBUSY" in str(ei.value)
        finally:
            a.close()
            b.close()
        with chm.connect(d.socket) as c:  # a slot again
            assert c.daemon_stats()["daemon"]["clients_refused"] == 1


def test_a_client_that_closes_and_reconnects_is_not_refused(tmp_path: Path) -> None:
    """A full daemon does not count connections whose clients have closed
    them: reconnecting right after close() is served (the daemon waits for
    the closed connections' cleanup instead of refusing with EBUSY; 200 of
    200 such reconnects were refused before)."""
    with _serve(tmp_path, "--max-clients", "2") as d:
        for _ in range(50):
            a, b = chm.connect(d.socket), chm.connect(d.socket)
            a.close()
            b.close()
            with chm.connect(d.socket) as c, chm.connect(d.socket) as e:
                assert c.ping() > 0 and e.ping() > 0


def test_silent_connections_give_way(tmp_path: Path) -> None:
    """Connections that never say HELLO fill every slot; a real client still
    gets in at once (the oldest silent one is dropped), well before the
    handshake timeout would have freed a slot."""
    with _serve(tmp_path, "--max-clients", "4", "--hello-timeout", "30") as d:
        silent = [_raw(d.socket) for _ in range(4)]
        try:
            time.sleep(0.3)  # accepted
            t0 = time.monotonic()
            with chm.connect(d.socket, timeout=5) as dev:
                assert time.monotonic() - t0 < 3.0
                assert dev.daemon_stats()["daemon"]["handshakes_dropped"] >= 1
        finally:
            for s in silent:
                s.close()


def test_hello_timeout_frees_the_slot(tmp_path: Path) -> None:
    with _serve(tmp_path, "--hello-timeout", "0.3") as d:
        s = _raw(d.socket)
        data = s.recv(MAX_FRAME + 1)  # the daemon gives up on us
        op, _, body = decode(data)
        assert op == Op.ERROR and body["errno"] == errno.EPROTO and "no HELLO" in body["message"]
        assert s.recv(MAX_FRAME + 1) == b""
        s.close()


def test_idle_clients_time_out(tmp_path: Path) -> None:
    with _serve(tmp_path, "--idle-timeout", "0.5") as d:
        idle = chm.connect(d.socket)
        time.sleep(1.5)
        with chm.connect(d.socket) as dev:
            assert dev.daemon_stats()["held"]["clients"] == 1  # the idle one is gone
            assert dev.daemon_stats()["daemon"]["idle_timeouts"] == 1
        with pytest.raises(DaemonGone) as ei:
            idle.stats()
        assert "idle" in str(ei.value) and "ETIMEDOUT" in str(ei.value)
        idle.close()


def test_idle_clients_give_way_when_the_daemon_is_full(tmp_path: Path) -> None:
    """No idle timeout (the default): an idle client keeps its slot until a
    new client needs one; then the one idle longest gives way."""
    with _serve(tmp_path, "--max-clients", "2", "--idle-reclaim", "0.5") as d:
        a = chm.connect(d.socket)
        b = chm.connect(d.socket)
        time.sleep(0.3)
        b.stats()  # b is active again; a idles on
        time.sleep(0.6)
        with chm.connect(d.socket, timeout=5) as c:
            assert c.daemon_stats()["daemon"]["idle_reclaimed"] == 1
            assert b.stats() is not None
        with pytest.raises(DaemonGone) as ei:
            a.stats()
        assert "daemon is full" in str(ei.value) and "ETIMEDOUT" in str(ei.value)
        a.close()
        b.close()


def test_wait_on_a_stopped_daemon_has_a_deadline(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket, request_timeout=1.0) as dev:
        n = dev.stats().slots_total
        hs = dev.prefetch_many([i << 20 for i in range(n)], [4096] * n)
        dev.wait_many([h for h in hs if isinstance(h, RemoteHandle)])  # every slot held
        h = dev.prefetch(n << 20, 4096)
        with _Stopped(daemon):
            t0 = time.monotonic()
            with pytest.raises(DaemonGone) as ei:
                h.wait(timeout=1)
            took = time.monotonic() - t0
        assert took < 4.0, took
        assert "no answer" in str(ei.value) and "stopped or hung" in str(ei.value)
        with pytest.raises(DaemonGone):  # the connection is over
            dev.stats()
    with chm.connect(daemon.socket) as other:  # its handles were released
        deadline = time.monotonic() + 10
        while other.daemon_stats()["held"]["handles"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert other.daemon_stats()["held"] == {"clients": 1, "handles": 0, "pins": 0}


def test_wait_forever_on_a_stopped_daemon_has_a_deadline(daemon: DaemonProcess) -> None:
    """A wait with no timeout is asked in slices: a stopped daemon is noticed."""
    with chm.connect(daemon.socket, request_timeout=1.0) as dev:
        n = dev.stats().slots_total
        hs = dev.prefetch_many([i << 20 for i in range(n)], [4096] * n)
        dev.wait_many([h for h in hs if isinstance(h, RemoteHandle)])
        h = dev.prefetch(n << 20, 4096)
        got: list[BaseException] = []

        def waiter() -> None:
            try:
                h.wait()
            except BaseException as exc:
                got.append(exc)

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(1.5)  # a few slices answered ETIMEDOUT and asked again
        assert t.is_alive()
        with _Stopped(daemon):
            t.join(6.0)
        assert not t.is_alive()
        assert len(got) == 1 and isinstance(got[0], DaemonGone), got


def test_pipelined_requests_are_a_protocol_error(daemon: DaemonProcess) -> None:
    s = _raw(daemon.socket)
    s.send(encode(Op.HELLO, 0, {"version": VERSION}))
    s.recvmsg(MAX_FRAME + 1, socket.CMSG_LEN(8))
    s.send(encode(Op.STATS, 1, {}))
    s.send(encode(Op.STATS, 2, {}))
    answers = []
    while True:
        try:
            data = s.recv(MAX_FRAME + 1)
        except ConnectionResetError:  # closed with our second request unread
            break
        if not data:
            break
        answers.append(decode(data))
    s.close()
    assert [a[0] for a in answers] == [Op.ERROR], answers
    assert answers[0][2]["errno"] == errno.EPROTO and answers[0][2]["fatal"] is True
    assert "before the answer to STATS" in answers[0][2]["message"]
    with chm.connect(daemon.socket) as dev:  # the others are served on
        assert dev.daemon_stats()["daemon"]["protocol_errors"] == 1


def test_daemon_gone_says_what_happened(daemon: DaemonProcess) -> None:
    dev = chm.connect(daemon.socket)
    daemon.kill()
    with pytest.raises(DaemonGone) as ei:
        dev.stats()
    msg = str(ei.value)
    assert "[Errno" not in msg
    assert "the daemon" in msg and ("ECANCELED" in msg or "ECONNRESET" in msg), msg
    dev.close()


_CLIENT = """
import sys, chm
dev = chm.connect(sys.argv[1])
dev.stats()
print("ready", flush=True)
if sys.argv[2] == "close":
    dev.close()
else:
    sys.stdin.read()  # until killed
"""


def test_log_tells_died_from_closed(daemon: DaemonProcess) -> None:
    def run(how: str) -> None:
        p = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, daemon.socket, how],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        if how == "kill":
            p.kill()
        p.wait(30)
        assert p.stdin is not None
        p.stdin.close()
        p.stdout.close()

    run("close")
    run("kill")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        reasons = [e["reason"] for e in daemon.events() if e.get("event") == "disconnect"]
        if len(reasons) == 2:
            break
        time.sleep(0.05)
    assert reasons[0] == "closed by the client", reasons
    assert reasons[1].startswith("the client died"), reasons
