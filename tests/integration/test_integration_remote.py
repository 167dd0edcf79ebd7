"""The adapters' tier on remote nodes (``open_tier`` with ``master``), against
the real parts: a ``redis-server`` as the Master (started and killed here)
and ``chm-emu serve --master`` processes, read over Mooncake Transfer
Engine (TCP on loopback).

Clear errors at start, each naming what is wrong: a bad URL, a missing or
insecure secret file, Redis unreachable, no node registered, an unknown
node name, settings that belong to the nodes. Running: a node stopped with
SIGSTOP (it neither answers nor closes its connections) turns its blocks
into misses within the timeout, and puts go on to the nodes still live;
puts and loads do not take each other's transfer buffer; Redis killed is
misses (never a hang), and service resumes when it is back.
The engines' own entry points on remote nodes are in
``test_integration_lmcache.py`` and ``test_integration_vllm_e2e.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import Busy, InvalidArgument, NotFound
from chm.integrations._tier import TierOptions, open_tier
from chm.kv import Namespace, PutStatus
from chm.remote.master import MasterUnreachable, key_bytes
from chm.remote.node import NodeGone, _Link, _pairs
from chm.remote.protocol import Op
from chm.remote.tierstore import NodesStore
from chm.testing.redisd import RedisServer, free_port, redis_server_path
from chm.testing.remote import NodeProcess

pytestmark = [
    pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed"),
    pytest.mark.skipif(
        importlib.util.find_spec("redis") is None or importlib.util.find_spec("mooncake") is None,
        reason="the 'remote' extra (redis, mooncake-transfer-engine-non-cuda) is not installed",
    ),
]

NODE_OPTS = ["--capacity", "64M", "--dram", "24M", "--wbuf", "8M", "--slot-size", "1M"]
NS = Namespace(model="remote-config")
BLOCK = 128 << 10


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@contextlib.contextmanager
def _node_and_store(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path, **kw: Any
) -> Iterator[tuple[NodeProcess, NodesStore]]:
    """The node "node-a" and a NodesStore of this process on it."""
    with NodeProcess(
        redis_srv.url, "node-a", tmp_path / "a", secret_file, options=NODE_OPTS
    ) as node:
        store = NodesStore.open(redis_srv.url, secret_file, namespace=NS, host="127.0.0.1", **kw)
        try:
            yield node, store
        finally:
            store.close()


def _open(log: logging.Logger | None = None, **kw: Any) -> Any:
    opts = TierOptions(host="127.0.0.1", remote_timeout=2.0, **kw)
    return open_tier(opts, namespace=NS, log=log, what="test", key_prefix="chm.")


def test_bad_configurations_are_clear_errors_at_start(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path
) -> None:
    log = logging.getLogger("chm.test.remote-config")
    h = Lines()
    log.addHandler(h)
    try:
        sf = str(secret_file)
        with pytest.raises(InvalidArgument, match=r"chm\.master='http://h:1/0': expected a redis"):
            _open(log, master="http://h:1/0", secret_file=sf)
        with pytest.raises(InvalidArgument, match=r"chm\.master='redis://h:port/0'"):
            _open(log, master="redis://h:port/0", secret_file=sf)
        with pytest.raises(InvalidArgument, match=r"no host"):
            _open(log, master="redis:///0", secret_file=sf)
        with pytest.raises(InvalidArgument, match=r"chm\.secret_file' .* is required"):
            _open(log, master=redis_srv.url)
        with pytest.raises(NotFound, match=r"no such file"):
            _open(log, master=redis_srv.url, secret_file=str(tmp_path / "none"))
        os.chmod(secret_file, 0o644)
        with pytest.raises(InvalidArgument, match=r"mode must be 0600"):
            _open(log, master=redis_srv.url, secret_file=sf)
        os.chmod(secret_file, 0o600)
        short = tmp_path / "short"
        short.write_bytes(b"abc")
        short.chmod(0o600)
        with pytest.raises(InvalidArgument, match=r"at least 16 bytes"):
            _open(log, master=redis_srv.url, secret_file=str(short))
        with pytest.raises(InvalidArgument, match=r"exactly one of 'chm\.path'"):
            _open(log, master=redis_srv.url, path=str(tmp_path / "kv"), secret_file=sf)
        with pytest.raises(InvalidArgument, match=r"'chm\.wbuf' is the nodes' setting"):
            _open(log, master=redis_srv.url, secret_file=sf, wbuf="8M")
        with pytest.raises(InvalidArgument, match=r"'chm\.nodes' is a setting of remote nodes"):
            _open(log, path=str(tmp_path / "kv"), nodes="a")
        # Redis answers, but no node ever registered
        with pytest.raises(NotFound, match=r"no live node is registered"):
            _open(log, master=redis_srv.url, secret_file=sf)
        # nothing listens there
        dead = f"redis://127.0.0.1:{free_port()}/0"
        t0 = time.monotonic()
        with pytest.raises(MasterUnreachable, match=rf"Redis at {dead} does not answer"):
            _open(log, master=dead, secret_file=sf)
        assert time.monotonic() - t0 < 5
    finally:
        log.removeHandler(h)
    errors = [ln for ln in h.lines if ln.startswith("ERROR chm: tier not in use")]
    assert len(errors) == 12, h.lines  # every failure leaves the line engines' logs show
    assert any(dead in ln and "does not answer" in ln for ln in errors), errors


def test_nodes_names_registered_nodes(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path
) -> None:
    with NodeProcess(
        redis_srv.url, "node-a", tmp_path / "a", secret_file, options=NODE_OPTS
    ) as node:
        with pytest.raises(NotFound, match=r"\['node-x'\] are not registered .* \['node-a'\]"):
            _open(master=redis_srv.url, secret_file=str(secret_file), nodes="node-a,node-x")
        tier = _open(master=redis_srv.url, secret_file=str(secret_file), nodes=["node-a"])
        try:
            assert tier.nodes and tier.where == redis_srv.url
            data = np.arange(BLOCK, dtype=np.uint32).astype(np.uint8)
            assert tier.staging.put([b"k"], [data]) == [PutStatus.STORED]
            out = np.zeros(BLOCK, np.uint8)
            assert tier.store.load_prefix([b"k"], [out]) == 1 and np.array_equal(out, data)
            assert tier.stats()["staging_stored_blocks"] == 1
        finally:
            tier.close()
        node.stop()
        with pytest.raises(NotFound, match=r"none of the nodes \['node-a'\] is live"):
            _open(master=redis_srv.url, secret_file=str(secret_file), nodes="node-a")


def test_a_stopped_node_is_a_miss_within_the_timeout(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path
) -> None:
    """SIGSTOP: the node holds its connections open and answers nothing."""
    with (
        NodeProcess(redis_srv.url, "node-a", tmp_path / "a", secret_file, options=NODE_OPTS) as a,
        NodeProcess(redis_srv.url, "node-b", tmp_path / "b", secret_file, options=NODE_OPTS) as b,
    ):
        store = NodesStore.open(
            redis_srv.url, secret_file, namespace=NS, host="127.0.0.1", timeout=1.5
        )
        try:
            rng = np.random.default_rng(3)
            data = [rng.integers(0, 256, BLOCK, dtype=np.uint8) for _ in range(8)]
            # one put call per block: round-robin puts them on both nodes
            for j in range(8):
                assert store.put([j], [data[j]]) == [PutStatus.STORED]
            on = {e["node"] for e in store.entries(list(range(8))) if e is not None}
            assert len(on) == 2, on
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(8)]
            assert store.load_prefix(list(range(8)), outs) == 8
            assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
            assert a.proc is not None
            os.kill(a.proc.pid, signal.SIGSTOP)
            try:
                a_id = int(a.info["node"])
                first_a = next(
                    j
                    for j, e in enumerate(store.entries(list(range(8))))
                    if e and e["node"] == a_id
                )
                for o in outs:
                    o[:] = 0
                t0 = time.monotonic()
                n = store.load_prefix(list(range(8)), outs)
                took = time.monotonic() - t0
                assert n == first_a and took < 1.5 + 1.0, (n, first_a, took)
                assert all(np.array_equal(outs[j], data[j]) for j in range(n))
                # per-key loads: node b's blocks are still hits
                got = store.get(list(range(8)), outs, timeout=1.5)
                on_b = [e is not None and e["node"] != a_id for e in store.entries(list(range(8)))]
                assert [g for g, ob in zip(got, on_b, strict=True) if ob] == [True] * sum(on_b)
                assert not any(g for g, ob in zip(got, on_b, strict=True) if not ob)
            finally:
                os.kill(a.proc.pid, signal.SIGCONT)
            assert b.proc is not None and b.proc.poll() is None
        finally:
            store.close()


def test_puts_and_loads_do_not_take_each_others_buffer(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path
) -> None:
    """Puts have a transfer buffer of their own: while it is all in use (a
    put call in flight, held here by taking it), a put ends at once, not
    stored (SKIPPED, or ERROR where RemoteTier counts a busy buffer as a
    failed save), and loads are served in full."""
    with _node_and_store(redis_srv, secret_file, tmp_path, buffer=2 << 20) as (_, store):
        data = [np.full(BLOCK, j, np.uint8) for j in range(8)]
        assert store.put(list(range(8)), data) == [PutStatus.STORED] * 8
        held = store.save_tier.buf.take(store.save_tier.buf.nbytes)
        t0 = time.monotonic()
        (busy,) = store.put([100], [data[0]])
        assert busy in (PutStatus.SKIPPED, PutStatus.ERROR), busy
        assert time.monotonic() - t0 < 1.0 and store.contains([100]) == [False]
        outs = [np.zeros(BLOCK, np.uint8) for _ in range(8)]
        assert store.load_prefix(list(range(8)), outs) == 8
        assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
        store.save_tier.buf.give(held, store.save_tier.buf.nbytes)
        assert store.put([100], [data[0]]) == [PutStatus.STORED]
        st = store.stats()
        assert st["skipped_blocks"] + st["error_blocks"] == 1, st


def test_redis_down_while_running_is_misses_then_service_again(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path
) -> None:
    """The Master's Redis killed under a running tier: lookups and loads are
    misses, each within about the Master's timeout, never a hang; when Redis
    is back (empty: a restarted server without
    persistence) the node registers again and re-publishes, and the same
    tier serves the same bytes without being reopened."""
    with NodeProcess(
        redis_srv.url, "node-a", tmp_path / "a", secret_file, options=[*NODE_OPTS, "--lease", "1.0"]
    ):
        tier = _open(master=redis_srv.url, secret_file=str(secret_file))
        store = tier.store
        try:
            data = [np.full(BLOCK, j + 1, np.uint8) for j in range(4)]
            assert store.put(list(range(4)), data) == [PutStatus.STORED] * 4
            redis_srv.kill()
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(4)]
            t0 = time.monotonic()
            assert store.contains(list(range(4))) == [False] * 4
            assert store.load_prefix(list(range(4)), outs) == 0
            # a put goes to the node directly: stored there while the worker
            # still knows the node (published when Redis is back), else ERROR
            (put,) = store.put([9], [data[0]])
            assert put in (PutStatus.STORED, PutStatus.ERROR), put
            took = time.monotonic() - t0
            assert took < 5.0, took
            assert store.stats()["master_errors"] > 0
            redis_srv.start()
            deadline = time.monotonic() + 20
            want = list(range(4)) + ([9] if put == PutStatus.STORED else [])
            while store.contains(want) != [True] * len(want):
                assert time.monotonic() < deadline, "the node did not re-publish in 20 s"
                time.sleep(0.1)
            assert store.load_prefix(list(range(4)), outs) == 4
            assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
        finally:
            tier.close()


def test_a_remove_right_after_a_load_is_not_busy_with_its_own_pins(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path
) -> None:
    """A load hands its blocks back unanswered (KV_DONE_QUIET) on the load
    connection, and a remove goes on the node's control connection: the
    remove first settles the load connection (one answered request), so it
    never finds the caller's own just-loaded blocks pinned (Busy 1 time in a
    full run before). Loads and removes back to back, 40 rounds; the settling
    request is seen on the load connection's counters (the race itself is
    too rare to catch on a quiet machine)."""
    with _node_and_store(redis_srv, secret_file, tmp_path, timeout=5.0) as (node, store):
        for r in range(40):
            keys = [1000 * r + j for j in range(4)]
            data = [np.full(BLOCK, (r + j) % 251 + 1, np.uint8) for j in range(4)]
            assert store.put(keys, data) == [PutStatus.STORED] * 4
            outs = [np.zeros(BLOCK, np.uint8) for _ in range(4)]
            assert store.load_prefix(keys, outs) == 4
            assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
            link = store.tier._links[int(node.info["node"])]
            told = [link.told]  # the blocks went back unanswered
            n0 = link.dev.round_trips
            assert store.remove(keys) == [True] * 4, r
            told.append(link.told)
            assert told == [True, False] and link.dev.round_trips == n0 + 1
            n0 = link.dev.round_trips
            assert store.remove(keys) == [False] * 4  # nothing to settle now
            assert link.dev.round_trips == n0


def test_remove_removes_the_blocks_on_their_node(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path
) -> None:
    """NodesStore.remove removes the blocks from the node's store itself
    (KV_REMOVE), not only the Master's entries; a key another client of the
    node is loading (pinned by its KV_LOOKUP) is Busy, as on one daemon:
    nothing of that request is removed, and once it is handed back the
    remove goes through."""
    with _node_and_store(redis_srv, secret_file, tmp_path, timeout=2.0) as (node, store):
        data = [np.full(BLOCK, j + 1, np.uint8) for j in range(4)]
        assert store.put(list(range(4)), data) == [PutStatus.STORED] * 4
        assert store.remove([0, 1, 7]) == [True, True, False]
        assert store.contains(list(range(4))) == [False, False, True, True]
        with chm.connect(node.info["socket"]) as dev:
            assert dev.kv(NS).contains(list(range(4))) == [False, False, True, True]
        # another client loads key 2: its KV_LOOKUP pins it on the node
        other = _Link(node.info["control"], str(secret_file), 5.0)
        try:
            k2 = key_bytes(NS.keys([2]))
            ans = other.call(Op.KV_LOOKUP, [_pairs(k2), False], time.monotonic() + 5)
            assert ans[0][0] == 0 and ans[0][1]
            with pytest.raises(Busy):
                store.remove([2, 3])
            assert store.contains([2, 3]) == [True, True]
            with chm.connect(node.info["socket"]) as dev:
                assert dev.kv(NS).contains([2, 3]) == [True, True]
            other.call(Op.KV_DONE, [[*_pairs(k2)[0], ans[0][1], 0]], time.monotonic() + 5)
        finally:
            other.close()
        assert store.remove([2, 3]) == [True, True]
        with chm.connect(node.info["socket"]) as dev:
            assert dev.kv(NS).contains(list(range(4))) == [False] * 4
        assert store.contains(list(range(4))) == [False] * 4


def test_flush_is_a_barrier_across_a_node_kill(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path
) -> None:
    """The node flushes on its own only every 100,000 s here: what
    NodesStore.flush returned for survives SIGKILL of the node daemon and a
    restart on the same files, byte-exact (a block a put found there already
    included). Puts a node took before it was
    killed and restarted without a flush cannot be vouched for: flush raises
    NodeGone (once), then flushes again as usual. close() flushes too."""
    node = NodeProcess(
        redis_srv.url,
        "node-a",
        tmp_path / "a",
        secret_file,
        options=[*NODE_OPTS, "--flush-interval", "100000", "--lease", "1.0"],
    ).start()
    store = NodesStore.open(redis_srv.url, secret_file, namespace=NS, host="127.0.0.1", timeout=3)
    try:
        rng = np.random.default_rng(5)
        data = [rng.integers(0, 256, BLOCK, dtype=np.uint8) for _ in range(6)]
        assert store.put(list(range(5)), data[:5]) == [PutStatus.STORED] * 5
        store.flush(10)
        assert store.stats()["remote_flushes"] == 1
        # key 5 put by this store, not flushed; another worker's put of it is
        # EXISTS, and that worker's flush makes it durable all the same
        assert store.put([5], [data[5]]) == [PutStatus.STORED]
        other = NodesStore.open(
            redis_srv.url, secret_file, namespace=NS, host="127.0.0.1", timeout=3
        )
        try:
            assert other.put([5], [data[5]]) == [PutStatus.EXISTS]
            other.flush(10)
        finally:
            other.close()
        node.kill()
        node.start()
        outs = [np.zeros(BLOCK, np.uint8) for _ in range(6)]
        deadline = time.monotonic() + 10
        while store.load_prefix(list(range(6)), outs) < 6:
            assert time.monotonic() < deadline, "the restarted node does not serve the blocks"
            time.sleep(0.1)
        assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
        # put, not flushed, node killed and restarted: the barrier says so
        # (the first put after the restart may find its old connection dead: ERROR)
        assert store.put([10], [data[0]]) == [PutStatus.STORED] or store.put([10], [data[0]]) == [
            PutStatus.STORED
        ]
        node.kill()
        node.start()
        with pytest.raises(NodeGone, match=r"node \d+ restarted \(epoch \d+ -> \d+\)"):
            store.flush(10)
        store.flush(10)  # reported once; nothing else to flush
        with chm.connect(node.info["socket"]) as dev:
            assert dev.kv(NS).contains([10]) == [False]  # lost with the kill, as reported
        # close() flushes, as a Store's does
        for _ in range(2):  # (the first put after the restart may find its old connection dead)
            if store.put([11], [data[1]]) == [PutStatus.STORED]:
                break
        store.close()
        node.kill()
        node.start()
        store = NodesStore.open(
            redis_srv.url, secret_file, namespace=NS, host="127.0.0.1", timeout=3
        )
        out = [np.zeros(BLOCK, np.uint8)]
        deadline = time.monotonic() + 10
        while store.load_prefix([11], out) < 1:
            assert time.monotonic() < deadline, "a block closed with flush is lost"
            time.sleep(0.1)
        assert np.array_equal(out[0], data[1])
    finally:
        store.close()
        node.stop()


def test_metadata_is_kept_with_the_block_on_its_node(
    redis_srv: RedisServer, secret_file: Path, tmp_path: Path
) -> None:
    """put(..., meta) sends each key's metadata with its block in one KV_PUT:
    one put is one block in the node's store and one entry in the Master,
    and meta() reads it back from the node (b"" for a key put without,
    None for an absent key); a removed key's metadata goes with it."""
    with _node_and_store(redis_srv, secret_file, tmp_path, timeout=2.0) as (node, store):
        data = [np.full(BLOCK, j + 1, np.uint8) for j in range(4)]
        metas = [b"m0", bytes(range(256)) * 4, None, b"\x00three"]
        assert store.put(list(range(4)), data, metas) == [PutStatus.STORED] * 4
        assert store.meta(list(range(5))) == [
            b"m0",
            bytes(range(256)) * 4,
            b"",
            b"\x00three",
            None,
        ]
        with chm.connect(node.info["socket"]) as dev:
            assert dev.daemon_stats()["kv"]["entries"] == 4  # no block of its own per metadata
            assert dev.kv(NS).meta([0, 3]) == [b"m0", b"\x00three"]
        assert len(list(store.master.entries_of(int(node.info["node"])))) == 4
        outs = [np.zeros(BLOCK, np.uint8) for _ in range(4)]
        assert store.load_prefix(list(range(4)), outs) == 4
        assert all(np.array_equal(o, d) for o, d in zip(outs, data, strict=True))
        assert store.remove([0]) == [True]
        assert store.meta([0, 1]) == [None, bytes(range(256)) * 4]
