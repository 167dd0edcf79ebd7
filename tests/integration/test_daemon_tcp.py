"""The daemon over TCP (``--listen HOST:PORT --secret-file F``), on loopback.

A client proves the shared secret (HMAC of the daemon's nonce) in its HELLO
or is refused before any request is read. An authenticated client is served
as a local one: raw reads and writes, views of staged objects and KV puts and
loads (their bytes copied over the connection: no descriptors cross TCP),
the same quota, and the same cleanup when it is killed.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chm
from chm.errors import WouldBlock
from chm.remote import DaemonGone, RemoteHandle
from chm.remote.protocol import MAX_FRAME, VERSION, Framed, Op, decode, encode
from chm.testing.daemon_proc import DaemonProcess

QUOTA = 4


@pytest.fixture
def secret(tmp_path: Path) -> str:
    p = tmp_path / "secret"
    p.write_bytes(os.urandom(24).hex().encode())
    p.chmod(0o600)
    return str(p)


@pytest.fixture
def daemon(tmp_path: Path, secret: str) -> Iterator[tuple[DaemonProcess, str]]:
    args = ["--target", str(tmp_path / "t0.img"), "--create", "--capacity", "128M",
            "--dram", "40M", "--slot-size", "1M", "--backend", "pread", "--raw", "32M",
            "--client-quota", str(QUOTA), "--listen", "127.0.0.1:0",
            "--secret-file", secret]  # fmt: skip
    with DaemonProcess(args, tmp_path / "chm.sock") as d:
        (start,) = [e for e in d.events() if e.get("event") == "start"]
        yield d, "tcp://" + start["listen"]


def test_served_over_tcp(daemon: tuple[DaemonProcess, str], secret: str) -> None:
    d, url = daemon
    with chm.connect(url, secret_file=secret) as c:
        assert c.tcp and c.welcome["transport"] == "tcp"
        data = (np.arange(73 * 4096, dtype=np.uint32) * 2654435761 >> 13).astype(np.uint8)
        assert c.write(1 << 20, data) is True
        c.flush()
        assert c.read(1 << 20, data.size) == data.tobytes()
        h = c.prefetch(1 << 20, data.size)
        view = h.wait(timeout=10)
        assert view.readonly and bytes(view) == data.tobytes()
        del view
        h.release()
        kv = c.kv()
        n = QUOTA  # a load pins and stages every block at once: within the quota
        blocks = [np.full(200_000, i, np.uint8) for i in range(n)]
        keys = [f"t{i}".encode() for i in range(n)]
        assert [int(s) for s in kv.put(keys, blocks)] == [0] * n
        kv.flush()
        outs = [np.zeros(200_000, np.uint8) for _ in range(n + 1)]
        assert kv.load_prefix([*keys, b"missing"], outs) == n
        assert all((outs[i] == i).all() for i in range(n))
        assert c.daemon_stats()["daemon"]["kv_checksum_errors"] == 0
        with chm.connect(d.socket) as local:  # one store for local and TCP clients
            got = np.zeros(200_000, np.uint8)
            assert local.kv().get([b"t3"], [got]) == [True] and (got == 3).all()
        deadline = time.monotonic() + 10  # the local client's disconnect is seen
        while c.daemon_stats()["held"]["clients"] > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c.daemon_stats()["held"] == {"clients": 1, "handles": 0, "pins": 0}
    deadline = time.monotonic() + 10  # logged as each connection's thread ends
    while time.monotonic() < deadline:
        reasons = [e["reason"] for e in d.events() if e.get("event") == "disconnect"]
        if len(reasons) == 2:
            break
        time.sleep(0.02)
    assert reasons == ["closed by the client"] * 2, reasons


def test_wrong_or_no_secret_is_refused_before_any_request(
    daemon: tuple[DaemonProcess, str], tmp_path: Path
) -> None:
    d, url = daemon
    wrong = tmp_path / "wrong"
    wrong.write_bytes(os.urandom(24).hex().encode())
    wrong.chmod(0o600)
    with pytest.raises(DaemonGone) as ei:
        chm.connect(url, secret_file=str(wrong))
    assert ei.value.errno == errno.EACCES and "authentication failed" in str(ei.value)
    host, port = url[len("tcp://") :].rsplit(":", 1)
    for first in (
        encode(Op.STATS, 1, {}),  # a request instead of HELLO
        encode(Op.HELLO, 0, {"version": VERSION}),  # HELLO without the proof
    ):
        s = Framed(socket.create_connection((host, int(port)), timeout=10))
        op, _, body = decode(s.recv())
        assert op == Op.AUTH and len(body["nonce"]) == 32
        s.send(first)
        op, _, body = decode(s.recv())
        assert op == Op.ERROR and body["errno"] == errno.EACCES and body["fatal"]
        assert s.recv() == b""
        s.close()
    junk = socket.create_connection((host, int(port)), timeout=10)
    junk.recv(MAX_FRAME)  # AUTH
    junk.sendall(struct.pack(">I", 1 << 30))  # an absurd frame: refused, not read
    junk.settimeout(10)
    while junk.recv(MAX_FRAME):
        pass
    junk.close()
    with chm.connect(d.socket) as local:
        # the daemon counts the last refusal when that connection's thread
        # ends, which may be just after the close above returned
        deadline = time.monotonic() + 10
        while (st := local.daemon_stats())["daemon"]["clients_refused"] < 4:
            assert time.monotonic() < deadline, st["daemon"]
            time.sleep(0.01)
        assert st["held"]["clients"] == 1 and st["device"]["prefetch_issued"] == 0
        assert st["daemon"]["clients_refused"] == 4
    refusals = [e for e in d.events() if e.get("event") == "refuse"]
    assert len(refusals) == 4


def test_no_secret_file_no_tcp(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "chm_emu.cli", "serve", "--target", str(tmp_path / "t.img"),
         "--create", "--capacity", "64M", "--listen", "127.0.0.1:0",
         "--socket", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "--secret-file" in p.stderr and "Traceback" not in p.stderr
    with pytest.raises(chm.errors.InvalidArgument, match="secret_file"):
        chm.connect("tcp://127.0.0.1:1")


_HOLDER = """
import sys, chm
dev = chm.connect(sys.argv[1], secret_file=sys.argv[2])
hs = dev.prefetch_many([i << 20 for i in range(3)], [4096] * 3)
dev.wait_many(hs)
print("holding", flush=True)
sys.stdin.read()
"""


def test_quota_and_cleanup_as_for_local_clients(
    daemon: tuple[DaemonProcess, str], secret: str
) -> None:
    d, url = daemon
    with chm.connect(url, secret_file=secret) as c:
        out = c.prefetch_many([i << 20 for i in range(QUOTA + 1)], [4096] * (QUOTA + 1))
        assert all(isinstance(h, RemoteHandle) for h in out[:QUOTA])
        assert isinstance(out[QUOTA], WouldBlock)
        c.release_many([h for h in out if isinstance(h, RemoteHandle)])
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url, secret],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert p.stdout is not None and p.stdout.readline() == "holding\n"
    with chm.connect(d.socket) as local:
        assert local.daemon_stats()["held"]["handles"] == 3
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        deadline = time.monotonic() + 10
        while local.daemon_stats()["held"]["handles"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert local.daemon_stats()["held"] == {"clients": 1, "handles": 0, "pins": 0}
    assert p.stdin is not None and p.stdout is not None
    p.stdin.close()
    p.stdout.close()


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(first=st.binary(max_size=200), later=st.binary(max_size=200))
def test_random_bytes_over_tcp(
    daemon: tuple[DaemonProcess, str], secret: str, first: bytes, later: bytes
) -> None:
    """Random bytes instead of HELLO, and random bytes after a valid HELLO:
    refused or answered, never a hang, never a failure of the daemon."""
    d, url = daemon
    host, port = url[len("tcp://") :].rsplit(":", 1)
    for payload in (first, later):
        s = socket.create_connection((host, int(port)), timeout=15)
        f = Framed(s)
        try:
            nonce = decode(f.recv())[2]["nonce"]
            if payload is later:
                proof = chm.remote.protocol.auth_digest(Path(secret).read_bytes().strip(), nonce)
                f.send(encode(Op.HELLO, 0, {"version": VERSION, "auth": proof}))
                assert decode(f.recv())[0] == Op.HELLO
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            while f.recv():  # answers, an ERROR, then the end; never a hang
                pass
        except (ConnectionResetError, chm.remote.protocol.ProtocolError):
            pass
        finally:
            s.close()
    with chm.connect(d.socket) as local:
        assert local.daemon_stats()["held"]["handles"] == 0
    assert not [e for e in d.events() if e.get("level") == "error"]
