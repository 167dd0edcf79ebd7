"""Redis, storage nodes and workers, each in its own network namespace.

The namespaces are made and removed here (:class:`chm.testing.netns.Network`:
veth pairs to a bridge in a hub namespace). Where namespaces cannot be made
(no CAP_NET_ADMIN, no iproute2) the same processes run on loopback and the
test says so (a warning naming the reason).

Nodes are ``chm-emu serve`` daemons with ``--listen`` and ``--master``
(:class:`chm.testing.remote.NodeProcess`); workers are
``python -m chm.testing.remote worker`` processes (a ``RemoteTier`` driven
over stdin). The fast test: two nodes, two workers, byte-exact multi-turn
loads across both nodes, then one node killed (SIGKILL) under load: its
blocks are misses within the timeout while the other node keeps serving.
The slow one adds a restart (a new epoch serving what the node flushed) and
a worker killed while holding slots (the node's daemon holds nothing after).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chm
from chm.testing.netns import Network
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
TIMEOUT = 2.0
NODE_OPTS = ["--capacity", "64M", "--dram", "24M", "--wbuf", "8M", "--slot-size", "1M"]
NODE_OPTS += ["--lease", "1.0"]


class Worker:
    """A worker process on a host of the network (chm.testing.remote.worker)."""

    def __init__(self, net: Network, host: str, url: str, secret: Path) -> None:
        argv = [*net.prefix(host), sys.executable, "-m", "chm.testing.remote", "worker"]
        self.proc = subprocess.Popen(
            [*argv, url, net.host(host), str(secret), str(TIMEOUT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def ask(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the worker died"
        out: dict[str, Any] = json.loads(line)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(30)


@contextlib.contextmanager
def _fleet(tmp_path: Path) -> Iterator[tuple[Network, dict[str, NodeProcess], list[Worker]]]:
    """Redis, nodes n1 and n2, workers w1 and w2: five namespaces."""
    net = Network(["redis", "n1", "n2", "w1", "w2"], fallback=True)
    if net.loopback:
        warnings.warn(
            f"network namespaces unavailable ({net.reason}): running on loopback", stacklevel=3
        )
    secret = tmp_path / "secret"
    write_secret(secret)
    with (
        net,
        RedisServer(
            net.host("redis"), 6379 if not net.loopback else 0, prefix=net.prefix("redis")
        ) as srv,
    ):
        nodes = {
            h: NodeProcess(
                srv.url,
                h,
                tmp_path / h,
                secret,
                host=net.host(h),
                prefix=net.prefix(h),
                options=NODE_OPTS,
            )
            for h in ("n1", "n2")
        }
        workers: list[Worker] = []
        try:
            for nd in nodes.values():
                nd.start()
            workers = [Worker(net, h, srv.url, secret) for h in ("w1", "w2")]
            yield net, nodes, workers
        finally:
            for w in workers:
                w.kill()
            for nd in nodes.values():
                nd.kill()
    if not net.loopback:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert net.tag not in listed  # everything made was removed


def _turns(w: Worker, model: str, node: int) -> None:
    """Two turns of one request on a node: 4 blocks, then 4 more; a load of
    all 8 after each (a prefix of 4, then the whole) is byte-exact."""
    assert w.ask(op="save", model=model, blocks=[0, 4], bytes=BLOCK, node=node)["status"] == [0] * 4
    got = w.ask(op="load", model=model, blocks=[0, 8], bytes=BLOCK)
    assert got["loaded"] == 4 and got["exact"] and got["untouched"]
    assert w.ask(op="save", model=model, blocks=[4, 8], bytes=BLOCK, node=node)["status"] == [0] * 4
    got = w.ask(op="load", model=model, blocks=[0, 8], bytes=BLOCK)
    assert got["loaded"] == 8 and got["exact"]


def _load_both(workers: list[Worker], models: dict[str, int]) -> None:
    """Every worker loads every request (each on its own node) byte-exact."""
    for w in workers:
        for m in models:
            got = w.ask(op="load", model=m, blocks=[0, 8], bytes=BLOCK)
            assert got["loaded"] == 8 and got["exact"], (m, got)


def _kill_under_load(workers: list[Worker], nodes: dict[str, NodeProcess]) -> None:
    """w1 loads n1's request in a loop while n1 is killed (SIGKILL): every
    load is whole-and-exact or a shorter exact prefix, the last ones misses
    within the timeout; n2's request still loads whole from w2 meanwhile."""
    results: list[dict[str, Any]] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            results.append(workers[0].ask(op="load", model="req-1", blocks=[0, 8], bytes=BLOCK))

    t = threading.Thread(target=loop)
    t.start()
    time.sleep(0.5)
    nodes["n1"].kill()
    time.sleep(1.5)
    other = workers[1].ask(op="load", model="req-2", blocks=[0, 8], bytes=BLOCK)
    stop.set()
    t.join(30)
    assert not t.is_alive()
    assert other["loaded"] == 8 and other["exact"] and other["seconds"] < TIMEOUT
    assert results[0]["loaded"] == 8 and results[-1]["loaded"] == 0
    for r in results:
        assert r["exact"] and r["untouched"] and r["seconds"] < TIMEOUT + 1.0, r
    dead = workers[0].ask(op="load", model="req-1", blocks=[0, 8], bytes=BLOCK)
    assert dead["loaded"] == 0 and dead["seconds"] < TIMEOUT + 1.0
    assert workers[0].ask(op="stats")["bad_checksums"] == 0


def test_two_nodes_two_workers_in_separate_namespaces(tmp_path: Path) -> None:
    with _fleet(tmp_path) as (net, nodes, workers):
        for nd in nodes.values():
            assert nd.info["data"].startswith(net.host(nd.name) + ":")
        models = {"req-1": nodes["n1"].info["node"], "req-2": nodes["n2"].info["node"]}
        _turns(workers[0], "req-1", models["req-1"])
        _turns(workers[1], "req-2", models["req-2"])
        _load_both(workers, models)
        _kill_under_load(workers, nodes)
        assert workers[1].close() == 0


@pytest.mark.slow
def test_fleet_restart_and_a_worker_killed_holding_slots(tmp_path: Path) -> None:
    """The fast test's fleet, then: n1 restarts (a new epoch) and serves what
    it flushed to both workers; w2 stages n2's blocks and is killed (SIGKILL)
    while holding them: n2's daemon holds nothing after, and w1 loads them."""
    with _fleet(tmp_path) as (_net, nodes, workers):
        models = {"req-1": nodes["n1"].info["node"], "req-2": nodes["n2"].info["node"]}
        _turns(workers[0], "req-1", models["req-1"])
        _turns(workers[1], "req-2", models["req-2"])
        time.sleep(0.6)  # the nodes flush every 0.2 s
        _kill_under_load(workers, nodes)
        e1 = nodes["n1"].info["epoch"]
        nodes["n1"].start()
        assert nodes["n1"].info["epoch"] == e1 + 1
        _load_both(workers, models)
        got = workers[1].ask(op="hold", model="req-2", blocks=[0, 8], node=models["req-2"])
        assert got["held"] == 8
        with chm.connect(nodes["n2"].info["socket"]) as dev:
            assert dev.daemon_stats()["held"]["handles"] >= 8
            workers[1].kill()
            deadline = time.monotonic() + 10
            while dev.daemon_stats()["held"]["handles"]:
                assert time.monotonic() < deadline, dev.daemon_stats()["held"]
                time.sleep(0.05)
            assert dev.daemon_stats()["held"]["pins"] == 0
            assert dev.daemon_stats()["node"]["tcp_clients"] == 1  # w1's connection only
        got = workers[0].ask(op="load", model="req-2", blocks=[0, 8], bytes=BLOCK)
        assert got["loaded"] == 8 and got["exact"]


@pytest.mark.slow
def test_remote_bench_quick_runs(tmp_path: Path) -> None:
    """tools/bench/remote_bench.py --quick end to end (namespaces, Redis, a
    node, a worker): exit 0, every load whole and exact, the JSON written."""
    out = tmp_path / "remote_bench.json"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(root / "tools/bench/remote_bench.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["verdicts"]["all_met"]
    assert res["result"]["exact"] and set(res["result"]["hits"]) == {8}


def test_network_refuses_bad_hosts_and_removes_what_it_made() -> None:
    from chm.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        Network(["a", "a"], fallback=True)
    with pytest.raises(InvalidArgument):
        Network([], fallback=True)
    net = Network(["a", "b"], fallback=True)
    with pytest.raises(InvalidArgument):
        net.host("c")
    if net.loopback:
        assert net.prefix("a") == [] and net.host("b") == "127.0.0.1"
        return
    with net:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert net.ns("a") in listed and net.ns("b") in listed
        ping = [*net.prefix("a"), sys.executable, "-c"]
        code = "import socket, sys; s = socket.create_connection((sys.argv[1], 9), timeout=2)"
        # b listens on nothing: a connection from a is refused by b's own stack
        r = subprocess.run([*ping, code, net.host("b")], capture_output=True, text=True)
        assert "ConnectionRefusedError" in r.stderr
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.tag not in listed
