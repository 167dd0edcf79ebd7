"""chm-emu serve as a real process: clients over its Unix socket.

Zero-copy views into a read-only, sealed pool; writes through the shared
area; another client's handle refused; a shared KV index across processes;
chm.kv.Store unchanged on chm.connect(); stats; SIGTERM flushes and exits 0.
"""

from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm._robuf import ReadOnlyBuffer
from chm.errors import ChmError, StaleHandle
from chm.kv import PutStatus, Store
from chm.remote import RemoteHandle
from chm.testing.daemon_proc import DaemonProcess


def _handles(out: list[RemoteHandle | ChmError]) -> list[RemoteHandle]:
    """The handles of a prefetch_many that issued every element."""
    assert all(isinstance(h, RemoteHandle) for h in out), out
    return [h for h in out if isinstance(h, RemoteHandle)]


BLOCK = 256 << 10


def serve_args(tmp: Path, *extra: str) -> list[str]:
    return [
        "--target", str(tmp / "t0.img"), "--create", "--capacity", "256M",
        "--dram", "48M", "--slot-size", "1M", "--backend", "pread", "--raw", "64M", *extra,
    ]  # fmt: skip


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with DaemonProcess(serve_args(tmp_path), tmp_path / "chm.sock") as d:
        yield d


def _block(i: int, n: int = BLOCK) -> np.ndarray[Any, Any]:
    return ((np.arange(n, dtype=np.uint32) * 2654435761 + i) >> 7).astype(np.uint8)


def test_socket_mode_and_zero_copy_reads(daemon: DaemonProcess) -> None:
    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o660
    with chm.connect(daemon.socket) as dev:
        data = _block(1, 64 << 10).tobytes()
        assert dev.write(1 << 20, data) is True
        dev.flush()
        hs = _handles(dev.prefetch_many([1 << 20, (1 << 20) + 4096], [len(data), 100]))
        views = dev.wait_many(hs)
        assert views[0].readonly
        assert bytes(views[0]) == data
        assert bytes(views[1]) == data[4096:4196]
        # the view is the client's read-only mapping of the pool: same memory
        assert dev._pool is not None
        pool = np.frombuffer(dev._pool, np.uint8).ctypes.data
        at = np.frombuffer(views[0], np.uint8).ctypes.data
        assert pool <= at < pool + dev.welcome["pool_bytes"]
        assert isinstance(views[0].obj, ReadOnlyBuffer)
        with pytest.raises(ValueError):  # no writable export, whoever asks
            np.frombuffer(memoryview(views[0].obj), np.uint8).setflags(write=True)
        dev.release_many(hs)
        assert all(h.released for h in hs)
        assert dev.read((1 << 20) + 7, 9) == data[7:16]
        # a released handle cannot be waited on
        with pytest.raises(StaleHandle):
            hs[0].wait()


def test_pool_is_sealed_and_read_only(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as dev:
        flags = fcntl.fcntl(dev.pool_fd, fcntl.F_GETFL)
        assert flags & os.O_ACCMODE == os.O_RDONLY
        seals = fcntl.fcntl(dev.pool_fd, 1034)  # F_GET_SEALS
        assert seals & 0x10, "F_SEAL_FUTURE_WRITE"
        assert seals & (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        with pytest.raises(PermissionError):
            mmap.mmap(dev.pool_fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(OSError):
            os.pwrite(dev.pool_fd, b"x", 0)


def test_foreign_handle_refused(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as a, chm.connect(daemon.socket) as b:
        h = a.prefetch(0, 4096)
        a.wait_many([h])
        stolen = b.adopt(h.token)
        with pytest.raises(StaleHandle):
            stolen.wait(timeout=1.0)
        with pytest.raises(StaleHandle):
            stolen.release()
        assert a.daemon_stats()["held"]["handles"] == 1
        h.release()
        assert a.daemon_stats()["held"]["handles"] == 0


def test_disconnect_releases_handles_and_pins(daemon: DaemonProcess) -> None:
    a = chm.connect(daemon.socket)
    hs = _handles(a.prefetch_many([i << 20 for i in range(8)], [4096] * 8))
    a.wait_many(hs)
    with chm.connect(daemon.socket) as b:
        assert b.daemon_stats()["held"]["handles"] == 8
        assert b.stats().slots_held == 8
        a.close()  # without releasing
        for _ in range(100):
            held = b.daemon_stats()["held"]
            if held["clients"] == 1:
                break
        assert held == {"clients": 1, "handles": 0, "pins": 0}
        assert b.stats().slots_held == 0
    for _ in range(500):
        ev = [e for e in daemon.events() if e.get("event") == "disconnect"]
        if any(e["released_handles"] == 8 for e in ev):
            break
        time.sleep(0.01)
    assert [e["released_handles"] for e in ev if e["released_handles"]] == [8]


_WRITER = """
import sys, json, numpy as np, chm
sock, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def block(i):
    return ((np.arange(size, dtype=np.uint32) * 2654435761 + i) >> 7).astype(np.uint8)
with chm.connect(sock) as dev:
    kv = dev.kv()
    st = kv.put([f"blk{i}".encode() for i in range(n)], [block(i) for i in range(n)])
    kv.flush()
    print(json.dumps([int(s) for s in st]))
"""


def test_kv_index_shared_between_processes(daemon: DaemonProcess) -> None:
    n = 40  # more than one 32-key batch
    r = subprocess.run(
        [sys.executable, "-c", _WRITER, daemon.socket, str(n), str(BLOCK)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [PutStatus.STORED] * n
    with chm.connect(daemon.socket) as dev:
        kv = dev.kv()
        keys = [f"blk{i}".encode() for i in range(n)] + [b"absent"]
        assert kv.prefix_len(keys) == n
        outs = [np.zeros(BLOCK, np.uint8) for _ in range(n + 1)]
        assert kv.load_prefix(keys, outs) == n
        for i in range(n):
            assert np.array_equal(outs[i], _block(i)), i
        assert kv.get([b"blk3", b"absent"], [outs[0], outs[1]]) == [True, False]
        assert kv.put([b"blk3"], [_block(3)]) == [PutStatus.EXISTS]
        assert dev.daemon_stats()["held"] == {"clients": 1, "handles": 0, "pins": 0}
        assert kv.remove([b"blk0"]) == [True]
        assert kv.prefix_len(keys) == 0


def test_kv_store_runs_unchanged_on_connect(daemon: DaemonProcess, tmp_path: Path) -> None:
    with chm.connect(daemon.socket) as dev:
        st = Store(dev, journal=tmp_path / "client.kvjournal", segment_bytes=8 << 20)
        keys = [f"k{i}".encode() for i in range(12)]
        assert st.put(keys, [_block(i) for i in range(12)]) == [PutStatus.STORED] * 12
        st.flush()
        outs = [np.zeros(BLOCK, np.uint8) for _ in keys]
        assert st.load_prefix(keys, outs) == 12
        assert all(np.array_equal(outs[i], _block(i)) for i in range(12))
        st.close()
        assert dev.daemon_stats()["held"]["handles"] == 0


def test_stats_command_and_sigterm(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as dev:
        dev.kv().put([b"x"], [_block(9)])
    r = subprocess.run(
        [sys.executable, "-m", "chm_emu.cli", "stats", "--socket", daemon.socket, "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["kv"]["entries"] == 1
    assert s["held"]["handles"] == 0
    assert s["daemon"]["pid"] == daemon.pid
    r = subprocess.run(
        [sys.executable, "-m", "chm_emu.cli", "stats", "--socket", daemon.socket],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "prefetch_issued" in r.stdout
    assert daemon.stop(signal.SIGTERM) == 0
    events = [e["event"] for e in daemon.events() if "event" in e]
    assert events[-3:] == ["signal", "flush", "exit"]
    assert not os.path.exists(daemon.socket)
    flush = [e for e in daemon.events() if e.get("event") == "flush"]
    assert flush[-1]["entries"] == 1


def test_wrong_version_refused(daemon: DaemonProcess) -> None:
    import socket

    from chm.remote.protocol import Op, decode, encode

    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(daemon.socket)
    s.send(encode(Op.HELLO, 0, {"version": 99}))
    op, _, body = decode(s.recv(65536))
    assert op == Op.ERROR
    assert body["errno"] == errno.EPROTO
    assert "version 99 is not supported" in body["message"]
    assert s.recv(65536) == b""
    s.close()
    with chm.connect(daemon.socket) as dev:  # the daemon serves on
        assert dev.config.capacity == 256 << 20 and dev.capacity == 64 << 20  # the raw region


def test_prometheus_endpoint_on_loopback(tmp_path: Path) -> None:
    import socket
    import urllib.request

    with socket.socket() as probe:  # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = serve_args(tmp_path, "--metrics", f"127.0.0.1:{port}")
    with DaemonProcess(args, tmp_path / "chm.sock") as d:
        with chm.connect(d.socket) as dev:
            dev.kv().put([b"m"], [_block(1)])
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        body = text.decode()
        assert "chm_device_prefetch_issued" in body
        assert "chm_kv_puts_stored 1.0" in body
        assert 'chm_request_seconds_count{op="KV_PUT"} 1.0' in body
        assert "chm_held_handles 0.0" in body


def test_file_pool_shared_read_only(tmp_path: Path) -> None:
    """A file pool (how a devdax device is used; there is none on this host,
    so a regular file stands in) is passed to clients read-only too."""
    pool = tmp_path / "pool.img"
    with pool.open("wb") as f:
        f.truncate(48 << 20)
    args = serve_args(tmp_path, "--pool", "file", "--pool-path", str(pool))
    with DaemonProcess(args, tmp_path / "chm.sock") as d, chm.connect(d.socket) as dev:
        assert fcntl.fcntl(dev.pool_fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        assert os.fstat(dev.pool_fd).st_ino == os.stat(pool).st_ino
        data = _block(5, 8192).tobytes()
        assert dev.write(2 << 20, data)
        dev.flush()
        with dev.prefetch(2 << 20, 8192) as h:
            assert bytes(h.wait()) == data


def test_kv_metadata_through_the_daemon_survives_a_restart(tmp_path: Path) -> None:
    meta = [b'{"shape": [2, 8, 256, 64]}', None, bytes(range(256)) * 4]
    with DaemonProcess(serve_args(tmp_path), tmp_path / "chm.sock") as d:
        with chm.connect(d.socket) as dev:
            kv = dev.kv()
            assert (
                kv.put([b"m0", b"m1", b"m2"], [_block(i) for i in range(3)], meta)
                == [PutStatus.STORED] * 3
            )
            kv.flush()
            assert kv.meta([b"m0", b"m1", b"m2", b"absent"]) == [meta[0], b"", meta[2], None]
            # more metadata than one packet holds is split over several requests
            big = [bytes([i]) * 1024 for i in range(120)]
            keys = [b"big%d" % i for i in range(120)]
            assert (
                kv.put(keys, [_block(i, 4096) for i in range(120)], big) == [PutStatus.STORED] * 120
            )
            kv.flush()
            ents = kv.entries(keys)
            assert [e["meta"] for e in ents if e is not None] == big
            with pytest.raises(chm.errors.InvalidArgument, match="at most 1024"):
                kv.put([b"x"], [_block(9)], [bytes(1025)])
        assert d.stop() == 0
    with (
        DaemonProcess(serve_args(tmp_path), tmp_path / "chm.sock") as d,
        chm.connect(d.socket) as dev,
    ):
        assert dev.kv().meta([b"m0", b"m2", b"big7"]) == [meta[0], meta[2], bytes([7]) * 1024]


def test_version_1_clients_are_served_without_the_version_2_requests(
    daemon: DaemonProcess,
) -> None:
    import socket

    from chm.remote.protocol import Op, decode, encode, recv_fds

    def hello(version: int) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(daemon.socket)
        s.send(encode(Op.HELLO, 0, {"version": version}))
        data, fds = recv_fds(s, 2)
        for fd in fds:
            os.close(fd)
        assert decode(data)[0] == Op.HELLO
        return s

    s = hello(1)
    s.send(encode(Op.KV_CONTAINS, 1, [[1, 2]]))
    assert decode(s.recv(65536))[2] == [False]
    s.send(encode(Op.KV_ENTRIES, 2, [[1, 2]]))
    op, _, body = decode(s.recv(65536))
    assert op == Op.ERROR and "version 2 request" in body["message"]
    s.close()
    s = hello(1)
    s.send(encode(Op.KV_PUT, 1, [[1, 2, 0, 4096, b"meta"]]))
    op, _, body = decode(s.recv(65536))
    assert op == Op.ERROR and "KV_PUT" in body["message"]
    s.close()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(daemon.socket)
    s.send(encode(Op.HELLO, 0, {"version": True}))  # not a version, though True == 1
    op, _, body = decode(s.recv(65536))
    assert op == Op.ERROR and "not supported" in body["message"]
    s.close()
