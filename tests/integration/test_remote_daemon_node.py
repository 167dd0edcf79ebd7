"""The daemon as a remote storage node (``chm-emu serve --listen --master``):
a real redis-server, a real daemon process, TCP clients on loopback.

What a node tells its TCP clients (WELCOME ``transfer`` and ``node``), what
it publishes and unpublishes in the Master (puts from any client, removes),
its lease (a new epoch per start, ended by a clean stop), and its health in
``chm-emu stats`` and the Prometheus metrics (``chm_node_*``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.kv.keys import Namespace
from chm.kv.store import PutStatus
from chm.remote.master import RedisMaster
from chm.testing.redisd import RedisServer, free_port, redis_server_path
from chm.testing.remote import NodeProcess, write_secret

pytestmark = [
    pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed"),
    pytest.mark.skipif(
        importlib.util.find_spec("redis") is None or importlib.util.find_spec("mooncake") is None,
        reason="the 'remote' extra (redis, mooncake-transfer-engine-non-cuda) is not installed",
    ),
]

OPTS = ["--capacity", "64M", "--dram", "24M", "--wbuf", "8M", "--slot-size", "1M", "--lease", "1"]


def test_welcome_publish_remove_and_lease(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """A TCP client's WELCOME names the engine, the pool and its own area
    and the node; a put through the daemon protocol (in-band, no engine) is
    published under the node's epoch, a remove unpublishes it; a clean stop
    ends the lease at once, and a restart is a new epoch that re-publishes
    what the store holds."""
    master = RedisMaster(redis_srv.url, lease=1.0)
    ns = Namespace(model="w")
    data = [np.full(4096, j, np.uint8) for j in range(4)]
    node = NodeProcess(redis_srv.url, "n1", tmp_path / "n1", secret_file, options=OPTS).start()
    try:
        with chm.connect(f"tcp://{node.info['control']}", secret_file=str(secret_file)) as dev:
            t, n = dev.welcome["transfer"], dev.welcome["node"]
            assert t["engine"] == node.info["data"] and t["protocol"] == "tcp"
            assert t["pool_bytes"] == dev.welcome["pool_bytes"]
            assert t["area_bytes"] == dev.welcome["area_bytes"] and t["area_addr"] > 0
            assert n == {"id": node.info["node"], "epoch": node.info["epoch"], "name": "n1"}
            kv = dev.kv(ns)
            assert kv.put(range(4), data) == [PutStatus.STORED] * 4
            hits = master.lookup(ns.keys(range(4)))
            assert len(hits) == 4
            assert {(h.node, h.epoch) for h in hits} == {(n["id"], n["epoch"])}
            assert [h.length for h in hits] == [4096] * 4
            assert kv.remove([3]) == [True]
            assert master.get(ns.keys([3])) == [None]
            assert len(master.lookup(ns.keys(range(4)))) == 3
        # a local client's put (the Unix socket) is published too
        with chm.connect(node.info["socket"]) as dev:
            assert dev.kv(ns).put([3], [data[3]]) == [PutStatus.STORED]
        assert len(master.lookup(ns.keys(range(4)))) == 4
        e1 = node.info["epoch"]
        assert node.stop() == 0
        assert master.lookup(ns.keys(range(4))) == []  # the lease ended with the stop
        assert not next(x for x in master.nodes() if x.name == "n1").live
        node.start()
        assert node.info["epoch"] == e1 + 1
        hits = master.lookup(ns.keys(range(4)))
        assert len(hits) == 4 and {h.epoch for h in hits} == {e1 + 1}
    finally:
        node.kill()
        master.close()


def test_health_in_stats_and_metrics(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """``chm-emu stats`` (table and JSON) and the Prometheus endpoint show
    the node: Master reachable, epoch, lease time left, entries published,
    TCP clients, bytes staged for TCP clients; with Redis gone, the Master
    is shown unreachable (and the daemon keeps serving)."""
    port = free_port()
    opts = [*OPTS]
    node = NodeProcess(redis_srv.url, "h1", tmp_path / "h1", secret_file, options=opts)
    cfg = node.config.read_text().replace("[device]", f'metrics = "127.0.0.1:{port}"\n\n[device]')
    node.config.write_text(cfg)
    node.start()
    ns = Namespace(model="h")
    try:
        with chm.connect(f"tcp://{node.info['control']}", secret_file=str(secret_file)) as dev:
            kv = dev.kv(ns)
            assert kv.put(range(3), [np.full(8192, 7, np.uint8)] * 3) == [PutStatus.STORED] * 3
            outs = [np.zeros(8192, np.uint8) for _ in range(3)]
            assert kv.load_prefix(range(3), outs) == 3  # staged, then read in-band
            argv = [sys.executable, "-m", "chm_emu.cli", "stats", "--socket", node.info["socket"]]
            js = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True,
                                           timeout=60, check=True).stdout)  # fmt: skip
            nd = js["node"]
            assert nd["name"] == "h1" and nd["id"] == node.info["node"]
            assert nd["epoch"] == node.info["epoch"] and nd["master_reachable"] == 1
            assert 0 < nd["lease_remaining_s"] <= 1.0
            assert nd["entries_published"] == 3 and nd["tcp_clients"] == 1
            assert nd["bytes_staged_tcp"] == 3 * 8192
            table = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
            for row in ("master_reachable", "entries_published", "lease_remaining_s"):
                assert row in table.stdout
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            metrics = {
                line.split()[0]: float(line.split()[1])
                for line in text.decode().splitlines()
                if line.startswith("chm_node_")
            }
            assert metrics["chm_node_epoch"] == node.info["epoch"]
            assert metrics["chm_node_master_reachable"] == 1
            assert metrics["chm_node_entries_published"] == 3
            assert metrics["chm_node_tcp_clients"] == 1
            assert metrics["chm_node_bytes_staged_tcp"] == 3 * 8192
        redis_srv.kill()
        deadline = time.monotonic() + 10
        with chm.connect(node.info["socket"]) as dev:
            while dev.daemon_stats()["node"]["master_reachable"]:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert dev.daemon_stats()["node"]["lease_remaining_s"] == 0
            assert dev.kv(ns).contains([0]) == [True]  # the daemon itself serves on
    finally:
        node.kill()


def test_puts_do_not_wait_on_a_stopped_master(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """Redis stopped (SIGSTOP: its socket open, no answers): a node's puts
    stay fast (only the first waits out one Redis timeout; the next ones
    skip publishing, counted), and the blocks are stored; once Redis answers
    again, a put re-publishes what was skipped, so every block is a hit."""
    import os
    import signal

    node = NodeProcess(redis_srv.url, "s1", tmp_path / "s1", secret_file, options=OPTS).start()
    ns = Namespace(model="stop")
    master = RedisMaster(redis_srv.url, lease=1.0)
    try:
        with chm.connect(node.info["socket"]) as dev:
            kv = dev.kv(ns)
            assert redis_srv.proc is not None
            os.kill(redis_srv.proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                for j in range(8):
                    assert kv.put([j], [np.full(4096, j, np.uint8)]) == [PutStatus.STORED]
                took = time.monotonic() - t0
            finally:
                os.kill(redis_srv.proc.pid, signal.SIGCONT)
            assert took < 2.0, took  # 8 puts, each waiting a 0.5 s Redis timeout: 4 s
            assert dev.daemon_stats()["node"]["publish_skipped"] >= 6
            deadline = time.monotonic() + 10
            j = 8
            while len(master.lookup(ns.keys(range(j)))) < j:
                assert time.monotonic() < deadline
                time.sleep(1.1)
                assert kv.put([j], [np.full(4096, j, np.uint8)]) == [PutStatus.STORED]
                j += 1
            assert len(master.lookup(ns.keys(range(j)))) == j
    finally:
        node.kill()
        master.close()


def test_a_tcp_client_moves_bytes_with_the_transfer_engine(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """``chm.connect("tcp://...")`` plus ``use_engine``: a put's blocks go
    into the client's area on the node with one engine write, a load's
    staged blocks come out of the node's pool with batched engine reads
    (no AREA_PUT / POOL_GET), byte-exact; a daemon that is not a node
    refuses ``use_engine`` with InvalidArgument."""
    from chm.errors import InvalidArgument
    from chm.remote.transfer import Engine

    engine = Engine.get("127.0.0.1")
    ns = Namespace(model="eng")
    data = [np.random.default_rng(j).integers(0, 256, 300_000, dtype=np.uint8) for j in range(6)]
    with NodeProcess(redis_srv.url, "e1", tmp_path / "e1", secret_file, options=OPTS) as node:
        url = f"tcp://{node.info['control']}"
        with chm.connect(url, secret_file=str(secret_file)) as dev:
            dev.use_engine(engine)
            kv = dev.kv(ns)
            before = dict(engine.stats)
            assert kv.put(range(6), data) == [PutStatus.STORED] * 6
            assert engine.stats["writes"] - before["writes"] == 1  # one put, one write
            outs = [np.zeros(300_000, np.uint8) for _ in range(6)]
            mid = dict(engine.stats)
            assert kv.load_prefix(range(6), outs) == 6
            assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
            reads = engine.stats["reads"] - mid["reads"]
            assert 1 <= reads <= 3  # a batch per staged round, not one per block
            assert engine.stats["bytes"] - mid["bytes"] == 6 * 300_000
    plain = tmp_path / "plain"
    args = ["--target", str(plain / "img"), "--create", "--capacity", "64M", "--dram", "64M"]
    args += ["--slot-size", "1M", "--force", "filesystem", "--listen", "127.0.0.1:0"]
    args += ["--secret-file", str(secret_file)]
    from chm.testing.daemon_proc import DaemonProcess

    plain.mkdir()
    with DaemonProcess(args, plain / "sock") as d:
        ev = next(e for e in d.events() if e.get("event") == "start")
        dev = chm.connect(f"tcp://{ev['listen']}", secret_file=str(secret_file))
        with dev, pytest.raises(InvalidArgument, match="not a storage node"):
            dev.use_engine(engine)


def test_wildcard_listen_needs_a_data_host(redis_srv: RedisServer, tmp_path: Path) -> None:
    """--listen 0.0.0.0 does not say which address workers reach the
    Transfer Engine on: refused (exit 2) until --data-host names it."""
    secret = tmp_path / "secret"
    write_secret(secret)
    argv = [sys.executable, "-m", "chm_emu.cli", "serve", "--target", str(tmp_path / "img")]
    argv += ["--create", "--capacity", "64M", "--dram", "64M", "--slot-size", "1M"]
    argv += ["--force", "filesystem", "--socket", str(tmp_path / "sock")]
    argv += ["--listen", "0.0.0.0:0", "--secret-file", str(secret), "--node-name", "w"]
    argv += ["--master", redis_srv.url]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "--data-host" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(n.name == "w" for n in RedisMaster(redis_srv.url).nodes())


def test_loads_through_the_node_keep_hot_blocks_resident(
    redis_srv: RedisServer, tmp_path: Path, secret_file: Path
) -> None:
    """A node with a resident region: the store's admission picks the blocks
    its KV loads keep in device DRAM (as an embedded store's loads do), so
    the blocks a worker reads again are served resident, not staged again
    from the backing file."""
    from chm.remote.node import RemoteTier
    from chm.remote.protocol import read_secret
    from chm.remote.transfer import Engine

    opts = [*OPTS, "--resident", "8M"]
    with (
        NodeProcess(redis_srv.url, "r1", tmp_path / "r1", secret_file, options=opts) as node,
        RemoteTier(
            RedisMaster(redis_srv.url, lease=1.0),
            Engine.get("127.0.0.1"),
            read_secret(secret_file),
            buffer=8 << 20,
            timeout=5.0,
        ) as tier,
    ):
        keys = Namespace(model="res").keys(range(4))
        data = [np.full(256 << 10, j + 1, np.uint8) for j in range(4)]
        assert tier.save("r", keys, data) == [PutStatus.STORED] * 4
        outs = [np.zeros(256 << 10, np.uint8) for _ in range(4)]
        for _ in range(4):
            assert tier.load(keys, outs) == 4
        assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
        with chm.connect(node.info["socket"]) as dev:
            st = dev.daemon_stats()["device"]
        assert st["resident_retained"] >= 4 and st["resident_hits"] >= 4, st


def test_blocks_evicted_while_redis_is_stopped_leave_the_master_after(
    redis_srv: RedisServer, tmp_path: Path
) -> None:
    """Redis stopped (SIGSTOP) while puts overfill the node: the puts do not
    wait on it (each at most one Redis timeout), and the blocks the store
    evicted meanwhile, published before the stop, leave the Master with the
    first put after it answers again (and the skipped publishes go in), with
    no worker asking: the Master then lists exactly what the node holds."""
    import os
    import signal

    from chm.remote.master import key_bytes

    secret = tmp_path / "secret"
    write_secret(secret)
    node = NodeProcess(redis_srv.url, "e1", tmp_path / "e1", secret, options=OPTS).start()
    ns = Namespace(model="stall-evict")
    keys = ns.keys(range(320))  # 80 MiB of 256 KiB blocks on a 64 MiB device
    master = RedisMaster(redis_srv.url, lease=1.0)
    blk = np.arange(256 << 10, dtype=np.uint32).astype(np.uint8)

    def fill(kv: Any, lo: int, hi: int) -> float:
        worst = 0.0
        for j in range(lo, hi):
            deadline = time.monotonic() + 10
            while True:
                t0 = time.monotonic()
                (st,) = kv.put(keys[j : j + 1], [blk])
                worst = max(worst, time.monotonic() - t0)
                if st != PutStatus.SKIPPED:
                    break
                assert time.monotonic() < deadline, "the write buffer never took it"
                time.sleep(0.02)
            assert st == PutStatus.STORED, (j, st)
        return worst

    try:
        with chm.connect(node.info["socket"]) as dev:
            kv = dev.kv(ns)
            fill(kv, 0, 64)
            before = {e.key for e in master.entries_of(int(node.info["node"]))}
            assert before == set(key_bytes(keys[:64]))
            assert redis_srv.proc is not None
            os.kill(redis_srv.proc.pid, signal.SIGSTOP)
            try:
                worst = fill(kv, 64, 320)
            finally:
                os.kill(redis_srv.proc.pid, signal.SIGCONT)
            assert worst < 1.0, worst  # a put waits at most one 0.5 s Redis timeout
            # the rule for a Redis that did not answer: puts skip it for a
            # second, then the next put's publish that works sends what waited
            time.sleep(1.1)
            assert kv.put(keys[319:], [blk]) == [PutStatus.EXISTS]
            held = dict(zip(key_bytes(keys), kv.contains(keys), strict=True))
            assert not all(held[k] for k in before)  # some published blocks were evicted
            want = {k for k, h in held.items() if h}
            deadline = time.monotonic() + 15
            while {e.key for e in master.entries_of(int(node.info["node"]))} != want:
                if time.monotonic() > deadline:
                    got = {e.key for e in master.entries_of(int(node.info["node"]))}
                    raise AssertionError(
                        f"Master lists {len(got - want)} blocks not held, lacks {len(want - got)};"
                        f" stats {dev.daemon_stats()['node']}"
                    )
                time.sleep(0.2)
            assert dev.daemon_stats()["node"]["entries_evicted_unpublished"] >= 1
    finally:
        node.kill()
        master.close()


def test_blocks_removed_while_redis_is_stopped_leave_the_master_after(
    redis_srv: RedisServer, tmp_path: Path
) -> None:
    """Redis stopped (SIGSTOP) while a worker removes published blocks and
    puts one of the keys again: the removes wait on it at most one Redis
    timeout, and once it answers the removed blocks leave the Master (that
    very block: the key put again stays a hit) with no worker asking."""
    import os
    import signal

    from chm.remote.master import key_bytes

    secret = tmp_path / "secret"
    write_secret(secret)
    node = NodeProcess(redis_srv.url, "r1", tmp_path / "r1", secret, options=OPTS).start()
    ns = Namespace(model="stall-remove")
    keys = ns.keys(range(8))
    master = RedisMaster(redis_srv.url, lease=1.0)
    blk = np.arange(256 << 10, dtype=np.uint32).astype(np.uint8)
    nid = int(node.info["node"])

    def listed() -> set[bytes]:
        return {e.key for e in master.entries_of(nid)}

    try:
        with chm.connect(node.info["socket"]) as dev:
            kv = dev.kv(ns)
            assert kv.put(keys, [blk] * 8) == [PutStatus.STORED] * 8
            assert listed() == set(key_bytes(keys))
            assert redis_srv.proc is not None
            os.kill(redis_srv.proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                assert kv.remove(keys[:4]) == [True] * 4
                took = time.monotonic() - t0
                assert kv.put(keys[:1], [blk[::-1].copy()]) == [PutStatus.STORED]
            finally:
                os.kill(redis_srv.proc.pid, signal.SIGCONT)
            assert took < 1.0, took  # at most one 0.5 s Redis timeout
            time.sleep(1.1)  # puts skip a Redis that did not answer for a second
            assert kv.put(keys[7:], [blk]) == [PutStatus.EXISTS]
            want = set(key_bytes(np.concatenate([keys[:1], keys[4:]])))
            deadline = time.monotonic() + 15
            while listed() != want:
                if time.monotonic() > deadline:
                    got = listed()
                    raise AssertionError(
                        f"Master lists {len(got - want)} blocks not held, lacks {len(want - got)};"
                        f" stats {dev.daemon_stats()['node']}"
                    )
                time.sleep(0.2)
            out = np.zeros(blk.size, np.uint8)
            assert kv.get(keys[:1], [out]) == [True]
            assert np.array_equal(out, blk[::-1])  # the block put again, not the removed one
    finally:
        node.kill()
        master.close()
