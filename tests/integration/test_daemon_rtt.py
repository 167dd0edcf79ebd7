"""Round trips of the daemon's request path (protocol version 4).

A 32-object prefetch + wait + release costs at most two round trips (PREFETCH,
WAIT; the release is sent unanswered), one with ``prefetch_many(wait=True)``
(STAGE); a 32-key KV load costs one (KV_LOAD; KV_DONE unanswered), counted by
the client (``RemoteDevice.round_trips``) against a real daemon process. The
combined forms keep the deadlines and errors of the requests they replace,
and a client killed while holding what they staged leaves nothing held. A
version 3 client is served by this daemon as before, and this client falls
back to the version 3 requests with a daemon that does not announce version 4.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import chm
import chm.remote.client as client_mod
from chm.remote import DaemonGone, RemoteDevice
from chm.remote.protocol import Op, decode, encode, recv_fds
from chm.testing.daemon_proc import DaemonProcess

K4 = 4096
N = 32
SLOTS, QUEUE = 40, 8


def _daemon(tmp: Path, name: str, *extra: str) -> DaemonProcess:
    cfg = tmp / f"{name}.toml"
    cfg.write_text(f"[device]\nslots = {SLOTS}\nrefill_queue = {QUEUE}\nwbuf = 262144\n")
    args = ["--target", str(tmp / f"{name}.img"), "--create", "--capacity", "64M",
            "--dram", "2M", "--slot-size", "4K", "--backend", "pread", "--raw", "16M",
            "--client-quota", str(SLOTS + QUEUE), "--config", str(cfg), *extra]  # fmt: skip
    return DaemonProcess(args, tmp / f"{name}.sock")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with _daemon(tmp_path, "d") as d:
        yield d


def _pattern(i: int) -> bytes:
    return ((np.arange(K4, dtype=np.uint32) * 2654435761 + i) >> 7).astype(np.uint8).tobytes()


def _written(dev: RemoteDevice) -> list[int]:
    addrs = [i * K4 for i in range(N)]
    assert dev.write_many(addrs, [_pattern(i) for i in range(N)]) == [True] * N
    dev.flush()
    return addrs


def _held(dev: RemoteDevice) -> dict[str, int]:
    return dict(dev.daemon_stats()["held"])


def _batch(dev: RemoteDevice, addrs: list[int], wait: bool = False) -> None:
    hs = dev.prefetch_many(addrs, [K4] * len(addrs), wait=wait, timeout=10.0)
    views = dev.wait_many(hs, 10.0)  # type: ignore[arg-type]
    assert [bytes(v) for v in views] == [_pattern(i) for i in range(len(addrs))]
    del views
    assert dev.release_many(hs) == [None] * len(hs)  # type: ignore[arg-type]


def test_a_32_object_batch_is_two_round_trips(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as dev:
        assert dev.version == 4 and dev.welcome["version"] == 4
        addrs = _written(dev)
        for wait, trips in ((False, 2), (True, 1)):
            for _ in range(3):
                n0, q0 = dev.round_trips, dev.quiet_sent
                _batch(dev, addrs, wait)
                assert dev.round_trips - n0 == trips  # PREFETCH + WAIT, or STAGE
                assert dev.quiet_sent - q0 == 1  # RELEASE_QUIET: no round trip
        # the releases went before the next request was read
        assert _held(dev) == {"clients": 1, "handles": 0, "pins": 0}


def test_ping_is_one_round_trip_that_changes_nothing(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as dev:
        (h,) = dev.prefetch_many([0], [K4], wait=True)
        n0 = dev.round_trips
        secs = [dev.ping() for _ in range(20)]
        assert dev.round_trips - n0 == 20 and all(0 < t < 10 for t in secs)
        assert _held(dev)["handles"] == 1  # nothing released
        dev.release_many([h])  # type: ignore[list-item]


def test_a_client_that_does_not_poll_is_served_alike(daemon: DaemonProcess) -> None:
    """spin_ns = 0: every answer is waited for in a blocking recv (the
    polling client's fallback once its budget is spent), same answers."""
    with chm.connect(daemon.socket) as dev:
        dev.spin_ns = 0
        addrs = _written(dev)
        _batch(dev, addrs)
        assert all(0 < dev.ping() < 10 for _ in range(5))
        assert _held(dev)["handles"] == 0


def test_a_32_key_load_is_one_round_trip(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as dev:
        kv = dev.kv()
        keys = [f"k{i}".encode() for i in range(N)]
        blocks = [np.frombuffer(_pattern(i), np.uint8) for i in range(N)]
        kv.put(keys, blocks)
        kv.flush()
        for turn in range(4):
            outs = [np.zeros(K4, np.uint8) for _ in range(N + 1)]
            n0, q0 = dev.round_trips, dev.quiet_sent
            assert kv.load_prefix([*keys, b"absent"], outs, timeout=10.0) == N
            # the first load reads the blocks from the backing file: on a
            # busy machine that can outlast KV_LOAD's wait slice, and a WAIT
            # follows; the later ones find them in device DRAM
            trips = dev.round_trips - n0
            assert trips == 1 if turn else 1 <= trips <= 3, (turn, trips)  # KV_LOAD
            assert dev.quiet_sent - q0 == 1  # KV_DONE_QUIET
            assert all(outs[i].tobytes() == _pattern(i) for i in range(N))
            n0 = dev.round_trips
            got = kv.get([keys[0], b"absent", keys[5]], outs[:3], timeout=10.0)
            assert got == [True, False, True] and dev.round_trips - n0 == 1
        assert _held(dev) == {"clients": 1, "handles": 0, "pins": 0}


def test_a_window_moves_with_one_round_trip_a_step(daemon: DaemonProcess) -> None:
    """prefetch_many(release=...) hands back the oldest and issues the next
    in one request; a handle whose view is still exported is refused
    before anything is released."""
    with chm.connect(daemon.socket) as dev:
        addrs = _written(dev)
        hs = dev.prefetch_many(addrs[:8], [K4] * 8)
        for k in range(8, N, 8):
            views = dev.wait_many(hs, 10.0)  # type: ignore[arg-type]
            assert [bytes(v) for v in views] == [_pattern(k - 8 + i) for i in range(8)]
            del views
            n0, q0 = dev.round_trips, dev.quiet_sent
            nxt = dev.prefetch_many(addrs[k : k + 8], [K4] * 8, release=hs)  # type: ignore[arg-type]
            assert (dev.round_trips - n0, dev.quiet_sent - q0) == (1, 0)
            assert all(h.released for h in hs)  # type: ignore[union-attr]
            assert _held(dev)["handles"] == 8
            hs = nxt
        arr = np.frombuffer(dev.wait_many(hs[:1], 10.0)[0], np.uint8)  # type: ignore[arg-type]
        with pytest.raises(chm.errors.ViewInUse):
            dev.prefetch_many(addrs[:1], [K4], release=hs)  # type: ignore[arg-type]
        assert not any(h.released for h in hs) and _held(dev)["handles"] == 8  # type: ignore[union-attr]
        del arr
        assert dev.prefetch_many([], [], release=hs) == []  # type: ignore[arg-type]
        assert _held(dev)["handles"] == 0


def test_stage_keeps_its_deadline(daemon: DaemonProcess) -> None:
    """Every slot held: a staged prefetch waits in the refill queue; STAGE
    answers when its deadline passes, and the handle stays issued (its
    wait finishes once a slot is handed back)."""
    with chm.connect(daemon.socket) as dev:
        addrs = _written(dev)
        hold = dev.prefetch_many([(N + i) * K4 for i in range(SLOTS)], [K4] * SLOTS, wait=True)
        assert all(h._ready is not None for h in hold)  # type: ignore[union-attr]
        t0 = time.monotonic()
        (late,) = dev.prefetch_many([addrs[3]], [K4], wait=True, timeout=0.3)
        took = time.monotonic() - t0
        assert 0.3 <= took < 5.0
        assert isinstance(late, client_mod.RemoteHandle) and late._ready is None
        with pytest.raises(chm.errors.WaitTimeout):
            late.wait(0.05)
        dev.release_many([hold[0]])  # type: ignore[list-item]
        assert bytes(late.wait(10.0)) == _pattern(3)
        late.release()
        dev.release_many(hold)  # type: ignore[arg-type]
        assert _held(dev)["handles"] == 0


def test_kv_load_keeps_its_deadline(daemon: DaemonProcess) -> None:
    """A KV load whose blocks cannot stage in time (every slot held) ends at
    its timeout with nothing loaded and nothing held."""
    with chm.connect(daemon.socket) as dev:
        kv = dev.kv()
        kv.put([b"a", b"b"], [np.frombuffer(_pattern(i), np.uint8) for i in range(2)])
        kv.flush()
        hold = dev.prefetch_many([i * K4 for i in range(SLOTS)], [K4] * SLOTS, wait=True)
        outs = [np.zeros(K4, np.uint8) for _ in range(2)]
        t0 = time.monotonic()
        assert kv.load_prefix([b"a", b"b"], outs, timeout=0.2) == 0
        assert 0.2 <= time.monotonic() - t0 < 5.0
        assert _held(dev) == {"clients": 1, "handles": SLOTS, "pins": 0}
        dev.release_many(hold)  # type: ignore[arg-type]
        assert kv.load_prefix([b"a", b"b"], outs, timeout=10.0) == 2
        assert _held(dev) == {"clients": 1, "handles": 0, "pins": 0}


def test_bad_tokens_and_bodies(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as a, chm.connect(daemon.socket) as b:
        addrs = _written(a)
        (h,) = a.prefetch_many([addrs[1]], [K4], wait=True)
        assert isinstance(h, client_mod.RemoteHandle)
        # b hands back a's token and one nobody holds: no answer, no effect
        b._tell(Op.RELEASE_QUIET, [h.token, 12345])
        b._tell(Op.KV_DONE_QUIET, [[1, 2, h.token, 0]])
        assert b.stats() is not None  # b's connection stays
        assert bytes(h.wait(5.0)) == _pattern(1) and _held(a)["handles"] == 1
        h.release()
        # an element outside the raw region is refused alone, nothing held for it
        out = a.prefetch_many([addrs[0], 1 << 40], [K4, K4], wait=True)
        assert isinstance(out[0], client_mod.RemoteHandle)
        assert isinstance(out[1], chm.errors.ChmError) and out[1].errno == errno.EACCES
        a.release_many([out[0]])
        assert _held(a)["handles"] == 0
        # a malformed body is a protocol error, and only that connection ends
        with pytest.raises(DaemonGone, match="STAGE body"):
            a._call(Op.STAGE, [[0, K4, 0]])
        with pytest.raises(DaemonGone):
            b._tell(Op.RELEASE_QUIET, ["x"])
            b.stats()
    with chm.connect(daemon.socket) as c:
        assert _held(c) == {"clients": 1, "handles": 0, "pins": 0}


_HOLDER = """
import sys, numpy as np, chm
dev = chm.connect(sys.argv[1])
hs = dev.prefetch_many([i * 4096 for i in range(8)], [4096] * 8, wait=True, timeout=10)
assert all(h._ready is not None for h in hs)
toks = dev._call(chm.remote.protocol.Op.KV_LOAD, [10**9, [[1, 2]], False])
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_client_killed_holding_staged_objects_leaves_nothing_held(
    daemon: DaemonProcess,
) -> None:
    with chm.connect(daemon.socket) as dev:
        kv = dev.kv()
        kv.put([b"pinned"], [np.frombuffer(_pattern(0), np.uint8)])
        kv.flush()
        ks = kv.namespace.keys([b"pinned"])
        pair = [int(ks[0]["hi"]), int(ks[0]["lo"])]
        script = _HOLDER.replace("[[1, 2]]", repr([pair]))
        p = subprocess.Popen(
            [sys.executable, "-c", script, daemon.socket],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            assert _held(dev) == {"clients": 2, "handles": 9, "pins": 1}
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
        deadline = time.monotonic() + 10.0
        while _held(dev) != {"clients": 1, "handles": 0, "pins": 0}:
            assert time.monotonic() < deadline, _held(dev)
            time.sleep(0.02)


def test_a_version_3_client_is_served_as_before(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a bare version 3 HELLO (no max_version), as a client before version 4 sends it
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10.0)
    s.connect(daemon.socket)
    s.send(encode(Op.HELLO, 0, {"version": 3, "pid": os.getpid()}))
    data, fds = recv_fds(s, 2)
    for fd in fds:
        os.close(fd)
    op, _, welcome = decode(data)
    assert op == Op.HELLO and welcome["version"] == 3
    s.send(encode(Op.STAGE, 1, [0, [[0, K4, 0]]]))
    op, _, body = decode(s.recv(65537))
    assert op == Op.ERROR and body["fatal"] and body["errno"] == errno.EPROTO
    assert "version 4" in body["message"]
    s.close()
    # the library at version 3: the requests it has always sent
    monkeypatch.setattr(client_mod, "VERSION", 3)
    with chm.connect(daemon.socket) as dev:
        assert dev.version == 3
        addrs = _written(dev)
        n0, q0 = dev.round_trips, dev.quiet_sent
        _batch(dev, addrs, wait=True)  # no STAGE: PREFETCH, WAIT, RELEASE
        assert (dev.round_trips - n0, dev.quiet_sent - q0) == (3, 0)
        kv = dev.kv()
        kv.put([b"v3"], [np.frombuffer(_pattern(2), np.uint8)])
        out = np.zeros(K4, np.uint8)
        n0 = dev.round_trips
        assert kv.load_prefix([b"v3"], [out], timeout=10.0) == 1 and out.tobytes() == _pattern(2)
        assert dev.round_trips - n0 == 3  # KV_LOOKUP, WAIT, KV_DONE
        assert _held(dev) == {"clients": 1, "handles": 0, "pins": 0}


def test_against_a_daemon_without_version_4(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon process runs with its highest version set to 3 (the
    module constant, patched at its start by a ``sitecustomize``): its
    WELCOME says 3 and it refuses the version 4 requests, as a daemon from
    before version 4 does. This client then sends only version 3 requests."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import chm.daemon.connection as c\nc.VERSION = 3\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    with _daemon(tmp_path, "old") as d, chm.connect(d.socket) as dev:
        assert dev.version == 3 and dev.welcome["version"] == 3
        addrs = _written(dev)
        for wait in (False, True):
            n0, q0 = dev.round_trips, dev.quiet_sent
            _batch(dev, addrs, wait)
            assert (dev.round_trips - n0, dev.quiet_sent - q0) == (3, 0)
        kv = dev.kv()
        kv.put([b"old"], [np.frombuffer(_pattern(4), np.uint8)])
        out = np.zeros(K4, np.uint8)
        assert kv.load_prefix([b"old"], [out], timeout=10.0) == 1 and out.tobytes() == _pattern(4)
        assert _held(dev) == {"clients": 1, "handles": 0, "pins": 0}
        with pytest.raises(DaemonGone, match="version 4"):
            dev._call(Op.STAGE, [0, []])


def test_tcp_client(tmp_path: Path) -> None:
    """Over TCP the front end forwards the version 4 requests (renumbering
    seq), serves what STAGE and KV_LOAD staged, and stops serving a token as
    soon as its unanswered release passes through."""
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(24).hex().encode())
    secret.chmod(0o600)
    with _daemon(tmp_path, "t", "--listen", "127.0.0.1:0", "--secret-file", str(secret)) as d:
        (start,) = [e for e in d.events() if e.get("event") == "start"]
        with chm.connect("tcp://" + start["listen"], secret_file=str(secret)) as dev:
            assert dev.tcp and dev.version == 4
            addrs = _written(dev)
            n0 = dev.round_trips
            hs = dev.prefetch_many(addrs[:4], [K4] * 4, wait=True, timeout=10.0)
            assert dev.round_trips - n0 == 1
            views = dev.wait_many(hs, 10.0)  # type: ignore[arg-type]
            assert [bytes(v) for v in views] == [_pattern(i) for i in range(4)]
            del views
            tok = hs[0].token  # type: ignore[union-attr]
            dev.release_many(hs)  # type: ignore[arg-type]
            assert dev._call(Op.POOL_GET, [tok, 0, 16]) == -errno.ESTALE
            hs = dev.prefetch_many(addrs[:2], [K4] * 2, wait=True, timeout=10.0)
            tok = hs[0].token  # type: ignore[union-attr]
            assert dev._call(Op.POOL_GET, [tok, 0, 16]) == _pattern(0)[:16]
            assert dev.prefetch_many([], [], release=hs) == []  # type: ignore[arg-type]
            assert dev._call(Op.POOL_GET, [tok, 0, 16]) == -errno.ESTALE
            kv = dev.kv()
            keys = [f"t{i}".encode() for i in range(4)]
            kv.put(keys, [np.frombuffer(_pattern(i), np.uint8) for i in range(4)])
            outs = [np.zeros(K4, np.uint8) for _ in range(4)]
            assert kv.load_prefix(keys, outs, timeout=10.0) == 4
            assert all(outs[i].tobytes() == _pattern(i) for i in range(4))
            assert _held(dev) == {"clients": 1, "handles": 0, "pins": 0}


def test_a_lookup_past_the_quota(daemon: DaemonProcess) -> None:
    """KV_LOOKUP and KV_LOAD prefetch a batch in one device call: the keys
    past this client's quota are refused (-EAGAIN) each, a prefix stops at
    the first, and nothing is left pinned or issued for them."""
    with chm.connect(daemon.socket) as dev:
        kv = dev.kv()
        keys = [f"q{i}".encode() for i in range(4)]
        kv.put(keys, [np.frombuffer(_pattern(i), np.uint8) for i in range(4)])
        kv.flush()
        ks = kv.namespace.keys(keys)
        pairs = [[int(k["hi"]), int(k["lo"])] for k in ks]
        quota = SLOTS + QUEUE
        hold = dev.prefetch_many([i * K4 for i in range(quota - 2)], [K4] * (quota - 2))
        got = dev._call(Op.KV_LOOKUP, [pairs, False])
        assert [e[0] for e in got] == [0, 0, -errno.EAGAIN, -errno.EAGAIN]
        assert _held(dev) == {"clients": 1, "handles": quota, "pins": 2}
        dev._call(Op.KV_DONE, [[*pairs[j], got[j][1], 0] for j in range(2)])
        got = dev._call(Op.KV_LOAD, [0, pairs, True])
        assert [e[0] in (0, -errno.ETIMEDOUT) and e[1] != 0 for e in got] == [True, True]
        assert _held(dev) == {"clients": 1, "handles": quota, "pins": 2}
        dev._call(Op.KV_DONE, [[*pairs[j], got[j][1], 0] for j in range(2)])
        dev.release_many(hold)  # type: ignore[arg-type]
        assert _held(dev) == {"clients": 1, "handles": 0, "pins": 0}
