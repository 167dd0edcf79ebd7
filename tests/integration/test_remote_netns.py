"""Redis, a storage node and a worker, each in its own network namespace.

The namespaces are made and removed here (:class:`chm.testing.netns.Network`:
veth pairs to a bridge in a hub namespace). Where namespaces cannot be made
(no CAP_NET_ADMIN, no iproute2) the same processes run on loopback and the
test says so in its skip-free output (a warning naming the reason).

The worker saves blocks to the node, loads them back byte-exact across the
link, then the node is killed with SIGKILL and the worker's next load is a
miss within its timeout.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

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

_WORKER = r"""
import json, sys, time
import numpy as np
from chm.kv.keys import Namespace
from chm.remote.master import RedisMaster
from chm.remote.node import RemoteTier, read_secret
from chm.remote.transfer import Engine

url, host, secret_file = sys.argv[1], sys.argv[2], sys.argv[3]
tier = RemoteTier(RedisMaster(url, lease=1.0), Engine.get(host), read_secret(secret_file),
                  buffer=8 << 20, timeout=3.0)
rng = np.random.default_rng(7)
keys = Namespace(model="netns").keys(range(12))
data = [rng.integers(0, 256, 256 << 10, dtype=np.uint8) for _ in range(12)]
saved = [int(s) for s in tier.save("req", keys[:8], data[:8])]
outs = [np.zeros(256 << 10, np.uint8) for _ in range(12)]
n = tier.load(keys, outs)
exact = all(np.array_equal(outs[j], data[j]) for j in range(n))
untouched = not any(o.any() for o in outs[n:])
print(json.dumps({"saved": saved, "loaded": n, "exact": exact, "untouched": untouched,
                  "engine": tier.engine.endpoint}), flush=True)
sys.stdin.readline()  # the node is killed now
t0 = time.monotonic()
n2 = tier.load(keys, [np.zeros(256 << 10, np.uint8) for _ in range(12)])
print(json.dumps({"loaded": n2, "seconds": time.monotonic() - t0}), flush=True)
tier.close()
"""


def test_redis_node_worker_in_separate_namespaces(tmp_path: Path) -> None:
    net = Network(["redis", "node", "worker"], fallback=True)
    if net.loopback:
        warnings.warn(
            f"network namespaces unavailable ({net.reason}): running on loopback",
            stacklevel=1,
        )
    secret = tmp_path / "secret"
    write_secret(secret)
    with (
        net,
        RedisServer(
            net.host("redis"), 6379 if not net.loopback else 0, prefix=net.prefix("redis")
        ) as srv,
    ):
        node = NodeProcess(
            srv.url,
            "n1",
            tmp_path / "n1",
            secret,
            host=net.host("node"),
            prefix=net.prefix("node"),
            options=["--capacity", "64M", "--dram", "24M", "--wbuf", "8M", "--lease", "1.0"],
        ).start()
        worker = None
        try:
            assert node.info["data"].startswith(net.host("node") + ":")
            argv = [*net.prefix("worker"), sys.executable, "-c", _WORKER]
            worker = subprocess.Popen(
                [*argv, srv.url, net.host("worker"), str(secret)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            assert worker.stdin is not None and worker.stdout is not None
            first = json.loads(worker.stdout.readline())
            assert first["saved"] == [0] * 8  # PutStatus.STORED
            assert first["loaded"] == 8 and first["exact"] and first["untouched"]
            assert first["engine"].startswith(net.host("worker") + ":")
            node.kill()
            worker.stdin.write("\n")
            worker.stdin.flush()
            second = json.loads(worker.stdout.readline())
            assert second["loaded"] == 0
            assert second["seconds"] < 3.0 + 1.0
            assert worker.wait(30) == 0
        finally:
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.wait(10)
            node.kill()
    if not net.loopback:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert net.tag not in listed  # everything made was removed


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
