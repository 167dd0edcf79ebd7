"""The Master on a real redis-server (started and stopped by the fixture on a free port).

Entries, prefix lookups of at most 32 keys per round trip with early hits,
node leases and epochs (a dead or restarted node's entries are never hits),
and Redis going away (a clear error at start, misses while it is down,
recovery when it is back): the server is killed with SIGKILL to test that.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator

import numpy as np
import pytest

from chm.errors import InvalidArgument
from chm.kv.keys import Namespace
from chm.remote.master import (
    ENTRY_BYTES,
    LOOKUP_BATCH,
    Entry,
    Lease,
    MasterUnreachable,
    RedisMaster,
    key_bytes,
)
from chm.testing.redisd import RedisServer, free_port, redis_server_path

pytestmark = [
    pytest.mark.skipif(
        redis_server_path() is None,
        reason="redis-server is not installed (apt-get install redis-server)",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("redis") is None,
        reason="the 'remote' extra (the redis client) is not installed",
    ),
]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def master(server: RedisServer) -> Iterator[RedisMaster]:
    with RedisMaster(server.url, lease=1.0, timeout=0.3) as m:
        yield m


def _keys(n: int, tag: str = "t") -> list[bytes]:
    return key_bytes(Namespace(model=tag).keys(range(n)))


def _entries(keys: list[bytes], node: int, epoch: int) -> list[Entry]:
    return [
        Entry(k, node, addr=i << 20, length=4096 + i, checksum=0xABC0 + i, epoch=epoch)
        for i, k in enumerate(keys)
    ]


def test_entry_is_64_bytes_and_round_trips() -> None:
    e = Entry(bytes(range(16)), node=7, addr=1 << 40, length=16 << 20, checksum=2**64 - 1, epoch=9)
    raw = e.pack()
    assert len(raw) == ENTRY_BYTES == 64
    assert Entry.unpack(raw) == e
    with pytest.raises(InvalidArgument):
        Entry.unpack(raw[:63])


def test_keys_from_namespace_match_bytes() -> None:
    ns = Namespace(model="m")
    arr = ns.keys([1, 2])
    ks = key_bytes(arr)
    assert [len(k) for k in ks] == [16, 16] and ks[0] != ks[1]
    assert key_bytes(ks) == ks
    with pytest.raises(InvalidArgument):
        key_bytes([b"short"])
    with pytest.raises(InvalidArgument):
        key_bytes(np.zeros(2, dtype=np.uint64))


def test_publish_lookup_prefix_and_round_trips(master: RedisMaster) -> None:
    node, epoch = master.register("n1", {"data": "127.0.0.1:1"})
    keys = _keys(100)
    # publish all but key 70: the prefix stops there
    ents = _entries(keys, node, epoch)
    assert master.publish(ents[:70] + ents[71:])
    rounds: list[int] = []
    before = master.stats["round_trips"]
    hits = master.lookup(keys, on_hits=lambda got: rounds.append(len(got)))
    assert hits == ents[:70]
    # 70 hits need three rounds of at most 32; the third stops at the miss
    assert rounds == [32, 32, 6]
    assert master.stats["round_trips"] - before == 3
    # a miss in the first key: one round trip, no hits, no callback
    rounds.clear()
    assert master.lookup([keys[70], *keys[:5]], on_hits=lambda got: rounds.append(len(got))) == []
    assert rounds == []
    assert master.prefix_len(keys[:10]) == 10
    with pytest.raises(InvalidArgument):
        master.lookup(keys, batch=LOOKUP_BATCH + 1)


def test_restart_bumps_epoch_and_hides_old_entries(master: RedisMaster) -> None:
    node, e1 = master.register("n1")
    keys = _keys(8)
    assert master.publish(_entries(keys, node, e1))
    assert len(master.lookup(keys)) == 8
    node2, e2 = master.register("n1")  # the node restarted
    assert node2 == node and e2 == e1 + 1
    assert master.lookup(keys) == []
    assert master.stats["stale"] >= 1
    # the old process cannot renew its lease any more
    assert not master.renew(node, e1)
    assert master.renew(node, e2)
    # the restarted node re-publishes what it flushed, under its new epoch
    assert master.publish(_entries(keys[:5], node, e2))
    assert [h.key for h in master.lookup(keys)] == keys[:5]


def test_dead_node_lease_expires(master: RedisMaster) -> None:
    a, ea = master.register("a")
    b, eb = master.register("b")
    ka, kb = _keys(4, "a"), _keys(4, "b")
    master.publish(_entries(ka, a, ea) + _entries(kb, b, eb))
    lease = Lease(master, b, eb)  # b renews; a does not (it "died")
    try:
        deadline = time.monotonic() + 5
        while master.lookup(ka) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert master.lookup(ka) == []
        assert len(master.lookup(kb)) == 4
        infos = {n.name: n for n in master.nodes()}
        assert not infos["a"].live and infos["b"].live and infos["b"].epoch == eb
    finally:
        lease.stop()
    assert master.lookup(kb) == []  # a clean stop ends the lease now


def test_lease_of_a_restarted_node_is_lost(master: RedisMaster) -> None:
    node, e1 = master.register("n")
    old = Lease(master, node, e1)
    _, e2 = master.register("n")
    deadline = time.monotonic() + 5
    while not old.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    old.stop(deregister=True)  # must not end the new epoch's lease
    assert old.lost
    assert master.node(node).live and master.node(node).epoch == e2


def test_unreachable_at_start_is_a_clear_error() -> None:
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(MasterUnreachable) as ei:
        RedisMaster(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    assert isinstance(ei.value, ConnectionError)
    assert f"127.0.0.1:{port}" in str(ei.value.strerror)
    assert time.monotonic() - t0 < 3
    with pytest.raises(InvalidArgument):
        RedisMaster("nonsense://x", timeout=0.3)


def test_down_while_running_misses_then_recovers(server: RedisServer) -> None:
    m = RedisMaster(server.url, lease=30.0, timeout=0.3)
    node, epoch = m.register("n")
    keys = _keys(40)
    ents = _entries(keys, node, epoch)
    assert m.publish(ents)
    assert len(m.lookup(keys)) == 40
    server.kill()
    t0 = time.monotonic()
    assert m.lookup(keys) == []  # a miss, not a hang
    assert not m.publish(ents)
    assert not m.renew(node, epoch)
    assert time.monotonic() - t0 < 3
    assert m.stats["errors"] >= 3
    server.start()  # back (empty: this server keeps nothing on disk)
    node2, epoch2 = m.register("n")
    assert m.publish(_entries(keys, node2, epoch2))
    assert len(m.lookup(keys)) == 40
    m.close()


def test_get_is_per_key_without_prefix(master: RedisMaster) -> None:
    node, e1 = master.register("g")
    keys = _keys(40, "g")
    ents = _entries(keys, node, e1)
    assert master.publish(ents[:10] + ents[11:])
    got = master.get(keys)
    assert got[:10] == ents[:10] and got[10] is None and got[11:] == ents[11:]
    master.register("g")  # a restart: none of the old entries is live any more
    assert master.get(keys) == [None] * 40


def test_node_by_id_and_drop_only_a_nodes_own_entries(master: RedisMaster) -> None:
    """``node(id)`` answers one node as ``nodes()`` lists it (NotFound for an
    id never registered); ``drop`` deletes an entry only while it still
    names the given node (and epoch), so a block another node (or a later
    epoch) published since stays a hit."""
    from chm.errors import NotFound

    a, ea = master.register("a", {"data": "127.0.0.1:1"})
    b, eb = master.register("b", {"data": "127.0.0.1:2"})
    one, listed = master.node(a), next(n for n in master.nodes() if n.node == a)
    assert (one.name, one.epoch, one.live, one.endpoints) == (
        listed.name,
        listed.epoch,
        listed.live,
        listed.endpoints,
    )
    assert 0 < one.lease_ms <= 1000
    assert master.node(b).endpoints == {"data": "127.0.0.1:2"} and master.node(b).live
    with pytest.raises(NotFound):
        master.node(max(a, b) + 100)
    keys = _keys(3, "drop")
    assert master.publish(_entries(keys[:2], a, ea) + _entries(keys[2:], b, eb))
    assert master.drop(keys, a, ea + 1) == 0  # another epoch of a: nothing
    assert master.drop(keys, a, ea) == 2  # a's two; b's entry stays
    assert master.get(keys)[:2] == [None, None] and master.get(keys)[2] is not None
    assert master.drop(keys, b) == 1  # any epoch of b
    assert master.get(keys) == [None, None, None]


def test_update_drops_only_that_very_block_then_publishes(master: RedisMaster) -> None:
    """RedisMaster.update (a node's put: its evicted blocks out, its new
    entries in, one script call): an entry is deleted only while it names
    the node, its epoch and the block's put sequence, so a later put of the
    key (a new sequence), another node's entry and an older epoch's are left
    alone; the published entries are set after the drops; more than 4,096
    drops take several calls and all land."""
    from dataclasses import replace

    node, epoch = master.register("u1")
    ks = _keys(6, "upd")
    mine = [replace(e, seq=10 + i) for i, e in enumerate(_entries(ks, node, epoch))]
    assert master.publish(mine[:4])
    assert master.publish([replace(_entries(ks[4:5], node + 1, epoch)[0], seq=14)])  # another node
    assert master.publish([replace(_entries(ks[5:6], node, epoch - 1)[0], seq=15)])  # older epoch
    gone = [(k, 10 + i) for i, k in enumerate(ks)]  # every key, at the sequences above
    gone[1] = (ks[1], 99)  # key 1 was put again since (sequence 11 now): not this block
    again = replace(mine[0], seq=20, addr=1 << 30)  # key 0 put again, in the same call
    assert master.update(node, epoch, [again], gone) == 3  # keys 0, 2 and 3
    got = master.get(ks)
    assert got[0] == again  # dropped, then published anew
    assert got[1] == mine[1]
    assert got[2] is None and got[3] is None
    raw = master._r.hmget(master._k("e"), ks[4], ks[5])
    assert all(v is not None for v in raw)  # another node's and an older epoch's stay
    many = _keys(5000, "upd-many")
    assert master.publish([replace(e, seq=7) for e in _entries(many, node, epoch)])
    assert master.update(node, epoch, [], [(k, 7) for k in many]) == 5000
    assert master.get(many[:32]) == [None] * 32 and master.get(many[-32:]) == [None] * 32
