"""Remote nodes and a worker over the real parts: redis-server, node daemons
(the ``chm-emu serve`` daemon with ``--listen``
and ``--master``, its memfd DRAM pool registered with Mooncake Transfer
Engine), and this test process as the worker (its own Transfer Engine; the
daemon protocol over TCP; all on loopback).

Byte-exact saves and loads across the processes, a wrong secret, a node
killed with SIGKILL mid-load and one stopped with SIGSTOP (misses within the
timeout, never wrong bytes), a restart (a new epoch; what it flushed is
served again), a worker killed while holding staged slots (the daemon's
stats show nothing held after), eviction, and two nodes behind
``chm.kv.AddressSpace``.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import chm
from chm.errors import NoSpace
from chm.kv.keys import Namespace
from chm.kv.store import PutStatus, Store
from chm.remote.master import RedisMaster, key_bytes
from chm.remote.node import NodeGone, RemoteTier, _Link, _pairs, read_secret
from chm.remote.protocol import Op
from chm.remote.transfer import TIMEOUT, Engine
from chm.testing.redisd import RedisServer, redis_server_path
from chm.testing.remote import NodeProcess, write_secret

pytestmark = [
    pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed"),
    pytest.mark.skipif(
        importlib.util.find_spec("redis") is None or importlib.util.find_spec("mooncake") is None,
        reason="the 'remote' extra (redis, mooncake-transfer-engine-non-cuda) is not installed",
    ),
]

BLOCK = 256 << 10
NODE_OPTS = [
    "--capacity",
    "64M",
    "--dram",
    "24M",
    "--wbuf",
    "8M",
    "--slot-size",
    "1M",
    "--lease",
    "1.0",
]


def _node(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path, name: str = "n1"
) -> NodeProcess:
    return NodeProcess(redis_srv.url, name, tmp_path / name, secret_file, options=NODE_OPTS)


def _tier(
    redis_srv: RedisServer, secret_file: Path, timeout: float = 3.0, buffer: int = 8 << 20
) -> RemoteTier:
    master = RedisMaster(redis_srv.url, lease=1.0)
    return RemoteTier(
        master, Engine.get("127.0.0.1"), read_secret(secret_file), buffer=buffer, timeout=timeout
    )


def _stop(pid: int) -> None:
    """SIGSTOP, then waits until the kernel shows the process stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


def _daemon_stats(node: NodeProcess) -> dict[str, Any]:
    """The node daemon's STATS, asked over its Unix socket (not a TCP client)."""
    with chm.connect(node.info["socket"]) as dev:
        return dev.daemon_stats()


def _stage(link: _Link, ents: list[Any], timeout: float = 2.0) -> list[tuple[int, int, int]]:
    """Stages entries on a node over its daemon protocol: ``[(pool addr, length, token)]``."""
    deadline = time.monotonic() + timeout
    ans = link.call(Op.KV_LOOKUP, [_pairs([e.key for e in ents]), False], deadline)
    toks = [int(a[1]) for a in ans if a[0] == 0]
    res = link.call(Op.WAIT, [int(timeout * 1e9), toks], deadline + timeout, wait=timeout)
    return [(link.pool_addr + r[1], r[2], t) for r, t in zip(res, toks, strict=True) if r[0] == 0]


def _blocks(n: int, seed: int) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, BLOCK, dtype=np.uint8) for _ in range(n)]


def test_save_then_load_byte_exact_across_processes(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    keys = Namespace(model="m").keys(range(24))
    data = _blocks(24, 1)
    with _node(redis_srv, tmp_path, secret_file) as node:
        tier = _tier(redis_srv, secret_file)
        assert isinstance(tier, RemoteTier)
        with tier:
            # turn 1 stores 16 blocks; turn 2 asks for 24 and finds the 16
            st = tier.save("req-1", keys[:16], data[:16])
            assert st == [PutStatus.STORED] * 16
            assert tier.save("req-1", keys[:2], data[:2]) == [PutStatus.EXISTS] * 2
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(24)]
            assert tier.load(keys, outs) == 16
            for got, want in zip(outs[:16], data[:16], strict=True):
                assert np.array_equal(got, want)
            assert not outs[16].any()
            # a second load reuses the same registered regions and is exact again
            outs2 = [np.zeros(BLOCK, np.uint8) for _ in range(16)]
            assert tier.load(keys[:16], outs2) == 16
            assert all(np.array_equal(a, b) for a, b in zip(outs2, data[:16], strict=True))
            assert tier.stats["bad_checksums"] == 0
            assert tier.buf.quarantined == 0
        ds = _daemon_stats(node)
        assert ds["node"]["epoch"] == node.info["epoch"] and not ds["node"]["superseded"]
        assert ds["node"]["entries_published"] >= 16
        assert ds["kv"]["entries"] == 16
        assert node.proc is not None and node.proc.poll() is None


def test_wrong_secret_is_refused(redis_srv: RedisServer, tmp_path: Path, secret_file: Path) -> None:
    """A worker without the secret is refused before any command (the
    daemon counts it); one with it is served, and told the node's id."""
    bad = tmp_path / "bad"
    write_secret(bad)
    with _node(redis_srv, tmp_path, secret_file) as node:
        with pytest.raises(NodeGone, match="authentication failed"):
            _Link(node.info["control"], str(bad), 2.0)
        deadline = time.monotonic() + 5  # counted once the refusal is logged
        while _daemon_stats(node)["daemon"]["clients_refused"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _daemon_stats(node)["daemon"]["clients_refused"] == 1
        link = _Link(node.info["control"], str(secret_file), 2.0)
        assert link.node == node.info["node"] and link.epoch == node.info["epoch"]
        link.close()


def test_node_killed_mid_load_gives_misses_not_hangs(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    keys = Namespace(model="k").keys(range(12))
    data = _blocks(12, 2)
    node = _node(redis_srv, tmp_path, secret_file).start()
    try:
        with _tier(redis_srv, secret_file, timeout=3.0) as tier:
            assert tier.save("r", keys, data) == [PutStatus.STORED] * 12
            results: list[int] = []
            outs_all: list[list[np.ndarray[Any, Any]]] = []
            stop = threading.Event()

            def loader() -> None:
                while not stop.is_set():
                    outs = [np.zeros(BLOCK, np.uint8) for _ in range(12)]
                    t0 = time.monotonic()
                    results.append(tier.load(keys, outs))
                    assert time.monotonic() - t0 < 3.0 + 1.0
                    outs_all.append(outs)

            t = threading.Thread(target=loader)
            t.start()
            time.sleep(0.5)
            node.kill()  # SIGKILL under load
            time.sleep(1.0)
            stop.set()
            t.join(10)
            assert not t.is_alive()
            assert results and results[0] == 12 and results[-1] == 0
            # every block any load reported is byte-exact; the rest were untouched
            for n, outs in zip(results, outs_all, strict=True):
                for j in range(12):
                    if j < n:
                        assert np.array_equal(outs[j], data[j])
            t0 = time.monotonic()
            assert tier.load(keys, [np.zeros(BLOCK, np.uint8) for _ in range(12)]) == 0
            assert time.monotonic() - t0 < 3.0
            assert tier.stats["bad_checksums"] == 0
    finally:
        node.kill()


def test_restart_new_epoch_serves_what_it_flushed(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    keys = Namespace(model="r").keys(range(6))
    data = _blocks(6, 3)
    node = _node(redis_srv, tmp_path, secret_file)
    node.start()
    try:
        with _tier(redis_srv, secret_file) as tier:
            assert tier.save("r", keys, data) == [PutStatus.STORED] * 6
            e1 = node.info["epoch"]
            time.sleep(0.6)  # the node flushes every 0.2 s
            node.kill()
            # dead: its entries stop being hits once its lease (1 s) ends
            deadline = time.monotonic() + 5
            while tier.master.prefix_len(keys) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert tier.master.prefix_len(keys) == 0
            node.start()
            assert node.info["epoch"] == e1 + 1
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(6)]
            assert tier.load(keys, outs) == 6
            assert all(np.array_equal(a, b) for a, b in zip(outs, data, strict=True))
    finally:
        node.stop()


_HOLDER = """
import sys, time
from chm.remote.node import _Link, _pairs
from chm.remote.protocol import Op
control, secret_file = sys.argv[1], sys.argv[2]
keys = [bytes.fromhex(k) for k in sys.argv[3].split(",")]
link = _Link(control, secret_file, 5.0)
ans = link.call(Op.KV_LOOKUP, [_pairs(keys), False], time.monotonic() + 5)
toks = [a[1] for a in ans if a[0] == 0]
res = link.call(Op.WAIT, [500_000_000, toks], time.monotonic() + 5, wait=0.5)
print("staged", sum(1 for r in res if r[0] == 0), flush=True)
time.sleep(60)
"""


def test_worker_killed_while_holding_slots_frees_them(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """The node's DRAM has 16 one-MiB slots (24 MiB less the 8 MiB write
    buffer; the device keeps one): while a worker holds all it can get, a
    load stages nothing (misses at its timeout, no hang); once that worker
    is killed the node gives its slots back and the load is whole and
    byte-exact."""
    keys = Namespace(model="h").keys(range(16))
    data = _blocks(16, 4)
    with _node(redis_srv, tmp_path, secret_file) as node, _tier(redis_srv, secret_file) as tier:
        assert tier.save("r", keys, data) == [PutStatus.STORED] * 16
        ents = tier.master.lookup(keys)
        assert len(ents) == 16
        argv = [
            sys.executable,
            "-c",
            _HOLDER,
            node.info["control"],
            str(secret_file),
            ",".join(k.hex() for k in key_bytes(keys)),
        ]
        holder = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None
            word, held = holder.stdout.readline().split()
            # it holds every free slot (the prefix ends when none is left)
            assert word == "staged" and 8 <= int(held) <= 16
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(16)]
            t0 = time.monotonic()
            assert tier.load(keys, outs, timeout=1.0) == 0
            assert time.monotonic() - t0 < 2.0
            assert _daemon_stats(node)["held"]["handles"] >= int(held)
        finally:
            holder.kill()
            holder.wait(10)
        deadline = time.monotonic() + 5
        n = 0
        while time.monotonic() < deadline:
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(16)]
            n = tier.load(keys, outs, timeout=1.0)
            if n == 16:
                break
            time.sleep(0.1)
        assert n == 16
        assert all(np.array_equal(a, b) for a, b in zip(outs, data, strict=True))
        # the dead worker's session and area are gone: nothing held, one TCP
        # client left (the tier hands its own blocks back without an answer,
        # so the count is read until the daemon has taken that message)
        end = time.monotonic() + 2.0
        st = _daemon_stats(node)
        while st["held"]["handles"] + st["held"]["pins"] and time.monotonic() < end:
            time.sleep(0.01)
            st = _daemon_stats(node)
        assert st["held"]["handles"] == 0 and st["held"]["pins"] == 0
        assert st["node"]["tcp_clients"] == 1


def test_secret_file_must_be_private(tmp_path: Path) -> None:
    from chm.errors import InvalidArgument

    p = tmp_path / "s"
    p.write_bytes(b"abc")
    os.chmod(p, 0o644)
    with pytest.raises(InvalidArgument, match="0600"):
        read_secret(p)
    os.chmod(p, 0o600)
    with pytest.raises(InvalidArgument, match="at least 16 bytes"):
        read_secret(p)
    p.write_bytes(b"abc" * 6)
    assert read_secret(p) == b"abc" * 6
    p.write_bytes(b"")
    with pytest.raises(InvalidArgument, match="empty"):
        read_secret(p)


def test_redis_restart_while_node_runs_recovers(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """Redis killed (SIGKILL) under a running node and worker: loads are
    misses within the timeout, not hangs; once Redis is back (empty: it
    keeps nothing on disk) the node registers again and re-publishes, and
    the same blocks are hits again, byte-exact."""
    keys = Namespace(model="rr").keys(range(6))
    data = _blocks(6, 5)
    with _node(redis_srv, tmp_path, secret_file) as node, _tier(redis_srv, secret_file) as tier:
        assert tier.save("r", keys, data) == [PutStatus.STORED] * 6
        redis_srv.kill()
        t0 = time.monotonic()
        assert tier.load(keys, [np.zeros(BLOCK, np.uint8) for _ in range(6)]) == 0
        assert time.monotonic() - t0 < 3.0
        redis_srv.start()
        deadline = time.monotonic() + 10
        n = 0
        while time.monotonic() < deadline:
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(6)]
            n = tier.load(keys, outs, timeout=1.0)
            if n == 6:
                break
            time.sleep(0.1)
        assert n == 6, node.log()[-2000:]
        assert all(np.array_equal(a, b) for a, b in zip(outs, data, strict=True))


def test_stopped_node_times_out_and_quarantines_late_reads(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """A node that stops answering (SIGSTOP: its sockets stay open, so the
    Transfer Engine's read blocks) turns a load into misses at the load's
    timeout; once the node is gone for good the late read ends and its
    buffer memory comes back (it was quarantined, never reused meanwhile)."""
    keys = Namespace(model="st").keys(range(8))
    data = _blocks(8, 6)
    node = _node(redis_srv, tmp_path, secret_file).start()
    try:
        with _tier(redis_srv, secret_file, timeout=1.0) as tier:
            assert tier.save("r", keys, data) == [PutStatus.STORED] * 8
            assert node.proc is not None
            ents = tier.master.lookup(keys)
            link = tier._link(ents[0].node, ents[0].epoch)
            staged = _stage(link, ents)
            assert len(staged) == 8
            _stop(node.proc.pid)
            # the read itself hangs on the stopped peer: TIMEOUT, memory held
            off = tier.buf.take(8 * BLOCK)
            t0 = time.monotonic()
            status = tier.engine.read(
                link.data,
                [tier.buf.addr + off + j * BLOCK for j in range(8)],
                [a for a, _, _ in staged],
                [BLOCK] * 8,
                timeout=0.5,
                on_late=lambda: tier.buf.quarantine(off, 8 * BLOCK),
            )
            assert time.monotonic() - t0 < 1.5
            assert status == TIMEOUT
            assert tier.buf.quarantined == 1
            with pytest.raises(NoSpace):  # the quarantined region is not handed out
                tier.buf.take(tier.buf.nbytes)
            t0 = time.monotonic()
            assert tier.load(keys, [np.zeros(BLOCK, np.uint8) for _ in range(8)]) == 0
            assert time.monotonic() - t0 < 2.5
            node.kill()  # SIGKILL ends a stopped process too: its sockets close
            deadline = time.monotonic() + 10
            while tier.buf.quarantined and time.monotonic() < deadline:
                time.sleep(0.05)
            assert tier.buf.quarantined == 0
    finally:
        node.kill()


def test_save_past_the_write_buffer_skips_not_stalls(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """More blocks in one commit than the node's write buffer (8 MiB) holds:
    the surplus is SKIPPED at once (never a stall, never an error), and every
    block reported STORED loads back byte-exact."""
    keys = Namespace(model="sk").keys(range(48))  # 12 MiB in one save
    data = _blocks(48, 7)
    # SSD writes modeled at 200 MB/s, so the write buffer cannot drain as fast
    # as the save fills it, whatever the disk under the test
    opts = [*NODE_OPTS, "--ssd-write-bw", "200000000"]
    node = NodeProcess(redis_srv.url, "n1", tmp_path / "n1", secret_file, options=opts)
    with node, _tier(redis_srv, secret_file, buffer=16 << 20) as tier:
        t0 = time.monotonic()
        st = tier.save("big", keys, data)
        assert time.monotonic() - t0 < 3.0
        assert PutStatus.ERROR not in st
        assert PutStatus.SKIPPED in st and st[0] == PutStatus.STORED
        assert tier.stats["skipped"] == st.count(PutStatus.SKIPPED)
        stored = [j for j, s in enumerate(st) if s == PutStatus.STORED]
        outs = [np.zeros(BLOCK, np.uint8) for _ in stored]
        assert tier.load(keys[stored], outs) == len(stored)
        assert all(np.array_equal(outs[i], data[j]) for i, j in enumerate(stored))


def test_address_space_places_requests_across_two_nodes(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """chm.kv.AddressSpace over two remote nodes (NodeStore): round-robin
    puts each request whole on one node, in order; loads find each request
    on its node byte-exact; a node killed with SIGKILL turns its request's
    blocks into misses (and is taken out) while the other still loads."""
    from chm.kv.space import AddressSpace
    from chm.remote.nodestore import NodeStore

    ns = Namespace(model="space")
    reqs = {"a": list(range(0, 6)), "b": list(range(100, 106))}
    data = {r: _blocks(6, 10 + i) for i, r in enumerate(reqs)}
    n1 = _node(redis_srv, tmp_path, secret_file, "n1").start()
    n2 = _node(redis_srv, tmp_path, secret_file, "n2").start()
    try:
        with _tier(redis_srv, secret_file, timeout=2.0) as tier:
            ids = [n1.info["node"], n2.info["node"]]
            # AddressSpace is annotated with Store; a NodeStore has the calls it makes
            stores = cast("list[Store]", [NodeStore(tier, i, ns) for i in ids])
            space = AddressSpace(stores, placement="round-robin")
            for r, ks in reqs.items():
                assert space.save(r, ks, data[r]) == [PutStatus.STORED] * 6
            where = {
                r: {e.node for e in tier.master.get(ns.keys(ks)) if e is not None}
                for r, ks in reqs.items()
            }
            assert where["a"] != where["b"] and all(len(w) == 1 for w in where.values())
            both = reqs["a"][:3] + [999] + reqs["b"]
            assert space.contains(both) == [True] * 3 + [False] + [True] * 6
            assert space.prefix_len(both) == 3
            for r, ks in reqs.items():
                outs = [np.zeros(BLOCK, np.uint8) for _ in ks]
                assert space.load(r, ks, outs) == 6
                assert all(np.array_equal(o, d) for o, d in zip(outs, data[r], strict=True))
            dead = n1 if where["a"] == {n1.info["node"]} else n2
            dead.kill()
            gone = "a" if where["a"] == {dead.info["node"]} else "b"
            live = "b" if gone == "a" else "a"
            t0 = time.monotonic()
            outs = [np.zeros(BLOCK, np.uint8) for _ in reqs[gone]]
            assert space.load(gone, reqs[gone], outs, timeout=2.0) == 0
            assert time.monotonic() - t0 < 3.0
            outs = [np.zeros(BLOCK, np.uint8) for _ in reqs[live]]
            assert space.load(live, reqs[live], outs, timeout=2.0) == 6
            assert all(np.array_equal(o, d) for o, d in zip(outs, data[live], strict=True))
    finally:
        n1.kill()
        n2.kill()


def test_superseded_node_stops_serving(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """The node's name registered again (a second process claiming it): the
    old node sees its epoch superseded and publishes nothing more, and its
    old entries are no longer hits, so a worker gets misses, never its old
    blocks."""
    keys = Namespace(model="sup").keys(range(4))
    data = _blocks(4, 8)
    with _node(redis_srv, tmp_path, secret_file) as node, _tier(redis_srv, secret_file) as tier:
        assert tier.save("r", keys, data) == [PutStatus.STORED] * 4
        assert len(tier.master.lookup(keys)) == 4
        tier.master.register("n1")  # another process takes the name: a new epoch
        deadline = time.monotonic() + 5
        while not _daemon_stats(node)["node"]["superseded"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _daemon_stats(node)["node"]["superseded"]
        assert tier.load(keys, [np.zeros(BLOCK, np.uint8) for _ in range(4)]) == 0


def test_node_with_redis_unreachable_fails_clearly_at_start(
    tmp_path: Path, secret_file: Path
) -> None:
    """chm-emu serve --master naming a Redis that does not answer exits 2
    with the reason, not a traceback, and leaves no socket behind."""
    from chm.testing.redisd import free_port

    argv = [sys.executable, "-m", "chm_emu.cli", "serve", "--target", str(tmp_path / "img")]
    argv += ["--create", "--capacity", "64M", "--dram", "64M", "--slot-size", "1M"]
    argv += ["--force", "filesystem"]
    argv += ["--socket", str(tmp_path / "sock"), "--listen", "127.0.0.1:0"]
    argv += ["--secret-file", str(secret_file), "--node-name", "x"]
    argv += ["--master", f"redis://127.0.0.1:{free_port()}/0"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "does not answer" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "sock").exists()


def test_master_without_node_name_or_listen_is_a_usage_error(
    tmp_path: Path, secret_file: Path
) -> None:
    argv = [sys.executable, "-m", "chm_emu.cli", "serve", "--target", str(tmp_path / "img")]
    argv += ["--create", "--capacity", "64M", "--socket", str(tmp_path / "sock")]
    argv += ["--master", "redis://127.0.0.1:1/0"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "--master needs --listen and --node-name" in proc.stderr


def test_a_stopped_node_does_not_stall_another_nodes_loads(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """Reads stuck on a stopped node (SIGSTOP) hold only that node's helper
    threads: loads from another node still complete, byte-exact."""
    k1, k2 = Namespace(model="s1").keys(range(4)), Namespace(model="s2").keys(range(4))
    d1, d2 = _blocks(4, 12), _blocks(4, 13)
    n1 = _node(redis_srv, tmp_path, secret_file, "n1").start()
    n2 = _node(redis_srv, tmp_path, secret_file, "n2").start()
    try:
        with _tier(redis_srv, secret_file, timeout=2.0) as tier:
            assert tier.save(None, k1, d1, node=n1.info["node"]) == [PutStatus.STORED] * 4
            assert tier.save(None, k2, d2, node=n2.info["node"]) == [PutStatus.STORED] * 4
            ents = tier.master.lookup(k1)
            link = tier._link(n1.info["node"])
            staged = _stage(link, ents)
            assert n1.proc is not None
            _stop(n1.proc.pid)
            off = tier.buf.take(BLOCK)
            for _ in range(6):  # more stuck reads than any shared pool would have threads
                status = tier.engine.read(
                    link.data,
                    [tier.buf.addr + off],
                    [staged[0][0]],
                    [BLOCK],
                    timeout=0.2,
                )  # the region stays taken: late reads may still write it
                assert status == TIMEOUT
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(4)]
            t0 = time.monotonic()
            assert tier.load(k2, outs) == 4
            assert time.monotonic() - t0 < 1.5
            assert all(np.array_equal(a, b) for a, b in zip(outs, d2, strict=True))
            n1.kill()
    finally:
        n1.kill()
        n2.kill()


def test_evicted_blocks_leave_the_master(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """More blocks than the node's 64 MiB device holds: its store evicts the
    oldest, and the node unpublishes each victim from the Master in the
    round trip of the put that evicted it, with no worker asking: after the
    fill the Master lists exactly the blocks the node still holds. A load of
    an evicted block is a miss (never wrong bytes)."""
    ns = Namespace(model="ev")
    keys = ns.keys(range(320))  # 80 MiB of 256 KiB blocks
    with _node(redis_srv, tmp_path, secret_file) as node, _tier(redis_srv, secret_file) as tier:
        for at in range(0, 320, 16):
            todo = list(range(at, at + 16))
            deadline = time.monotonic() + 10
            while todo and time.monotonic() < deadline:
                st = tier.save("r", keys[todo], _blocks(len(todo), at))
                assert PutStatus.ERROR not in st
                todo = [j for j, s in zip(todo, st, strict=True) if s == PutStatus.SKIPPED]
                if todo:
                    time.sleep(0.05)
            assert not todo
        with chm.connect(node.info["socket"]) as dev:
            held = dev.kv(ns).contains(keys)
            ds = dev.daemon_stats()
        evicted = {k for k, h in zip(key_bytes(keys), held, strict=True) if not h}
        assert len(evicted) >= 320 - 256  # at least 16 MiB did not fit
        listed = {e.key for e in tier.master.entries_of(node.info["node"])}
        assert listed == set(key_bytes(keys)) - evicted  # no evicted key left, no held one lost
        assert ds["node"]["entries_evicted_unpublished"] == len(evicted)
        assert tier.stats["dropped"] == 0  # no worker had to drop any
        first = keys[:1]
        assert key_bytes(first)[0] in evicted
        assert tier.load(first, [np.zeros(BLOCK, np.uint8)]) == 0
        assert tier.stats["bad_checksums"] == 0
        last = keys[-16:]
        outs = [np.zeros(BLOCK, np.uint8) for _ in range(16)]
        assert tier.load(last, outs) == 16


class _HeldMaster(RedisMaster):
    """The real Master on the test's redis-server, with a hook on its lookup
    round trips: the last round of a lookup of ``rounds`` rounds is asked
    only once the tier has started staging a window (``tier.stats
    ["windows"]``), or after 3 s. ``seen`` says whether staging had begun."""

    def __init__(self, url: str, rounds: int) -> None:
        super().__init__(url, lease=1.0)
        self.tier: RemoteTier | None = None
        self.asked = 0
        self.seen: bool | None = None
        inner = self._lookup

        def round_trip(keys: Any, args: Any) -> Any:
            self.asked += 1
            if self.asked == rounds:
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    if self.tier is not None and self.tier.stats.get("windows", 0) > 0:
                        break
                    time.sleep(0.005)
                self.seen = self.tier is not None and self.tier.stats.get("windows", 0) > 0
            return inner(keys=keys, args=args)

        self._lookup = round_trip


def test_load_stages_while_later_lookup_rounds_are_asked(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """100 keys are 4 Master rounds (32 keys each): the load stages the
    first round's hits on the node before the last round is even asked (the
    hook holds that round until a window started), the later rounds' hits
    join that window (no extra one), and the result is the same byte-exact
    prefix."""
    keys = Namespace(model="early").keys(range(100))
    data = _blocks(100, 9)
    with _node(redis_srv, tmp_path, secret_file):
        master = _HeldMaster(redis_srv.url, rounds=4)
        with RemoteTier(
            master, Engine.get("127.0.0.1"), read_secret(secret_file), buffer=64 << 20, timeout=10
        ) as tier:
            todo = list(range(100))
            deadline = time.monotonic() + 20
            while todo:  # the node's 8 MiB write buffer: what it skipped is offered again
                assert time.monotonic() < deadline
                st = tier.save("r", keys[todo], [data[j] for j in todo])
                assert PutStatus.ERROR not in st
                todo = [j for j, s in zip(todo, st, strict=True) if s == PutStatus.SKIPPED]
                time.sleep(0.05 if todo else 0)
            master.tier, master.asked = tier, 0
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(100)]
            assert tier.load(keys, outs) == 100
            assert master.asked == 4 and master.seen is True
            # one window, grown by the later rounds as they came (25 MiB fit half the buffer)
            assert tier.stats["windows"] == tier.stats["early_windows"] == 1
            assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
            # a prefix that ends in a later round: the leading hits, exact
            assert tier.remove(tier.master.get(keys[70:71])[0].node, keys[70:71]) == [True]  # type: ignore[union-attr]
            for o in outs:
                o[:] = 0
            assert tier.load(keys, outs) == 70
            assert all(np.array_equal(o, d) for o, d in zip(outs[:70], data[:70], strict=True))
            assert not outs[70].any()


def test_address_space_flush_is_durable_on_the_node(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """AddressSpace.flush over a remote node (NodeStore) flushes the node's
    store: with the node's own flusher off (every 100,000 s), what was saved
    before it survives SIGKILL of the node and its restart, byte-exact."""
    from chm.kv.space import AddressSpace
    from chm.remote.nodestore import NodeStore

    ns = Namespace(model="space-flush")
    data = _blocks(6, 21)
    node = NodeProcess(
        redis_srv.url,
        "nf",
        tmp_path / "nf",
        secret_file,
        options=[*NODE_OPTS, "--flush-interval", "100000"],
    ).start()
    try:
        with _tier(redis_srv, secret_file, timeout=3.0) as tier:
            space = AddressSpace(cast("list[Store]", [NodeStore(tier, node.info["node"], ns)]))
            assert space.save("r", list(range(6)), data) == [PutStatus.STORED] * 6
            space.flush(10)
            assert tier.stats["flushes"] == 1
            node.kill()
            node.start()
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(6)]
            deadline = time.monotonic() + 10
            while space.load("r", list(range(6)), outs, timeout=2.0) < 6:
                assert time.monotonic() < deadline, "the restarted node does not serve them"
                time.sleep(0.1)
            assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
    finally:
        node.kill()
