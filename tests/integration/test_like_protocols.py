"""One suite for the embedded and the daemon-backed device and store.

``chm.kv.DeviceLike`` and ``chm.kv.StoreLike`` are what the embedded classes
(``chm.Device``, ``chm.kv.Store``) and the daemon's client
(``chm.remote.RemoteDevice``, ``chm.remote.RemoteStore``) share. Each test
here runs twice through a parametrized fixture: on a device of this process,
and through ``chm.connect()`` to a real ``chm-emu serve`` process; the store
suite runs a third time on remote nodes (``chm.remote.tierstore.NodesStore``:
a real ``redis-server`` as the Master and a real node process, read over
Mooncake Transfer Engine). The functions at the top are checked by mypy:
each class satisfies its protocol.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import InvalidArgument, StaleHandle
from chm.kv import DeviceLike, PutStatus, Store, StoreLike
from chm.remote import RemoteDevice, RemoteStore
from chm.remote.tierstore import NodesStore
from chm.testing.daemon_proc import DaemonProcess
from chm.testing.redisd import RedisServer, redis_server_path
from chm.testing.remote import NodeProcess, write_secret

BLOCK = 64 << 10
GEOMETRY = ["--capacity", "256M", "--dram", "48M", "--slot-size", "1M", "--backend", "pread"]


def embedded_device(dev: chm.Device) -> DeviceLike:
    return dev


def remote_device(dev: RemoteDevice) -> DeviceLike:
    return dev


def embedded_store(store: Store) -> StoreLike:
    return store


def remote_store(store: RemoteStore) -> StoreLike:
    return store


def nodes_store(store: NodesStore) -> StoreLike:
    return store


_NODES = pytest.param(
    "nodes",
    marks=pytest.mark.skipif(
        redis_server_path() is None
        or importlib.util.find_spec("redis") is None
        or importlib.util.find_spec("mooncake") is None,
        reason="redis-server or the 'remote' extra (redis, mooncake) is not installed",
    ),
)


def _block(i: int, n: int = BLOCK) -> np.ndarray[Any, Any]:
    return ((np.arange(n, dtype=np.uint32) * 2654435761 + i) >> 7).astype(np.uint8)


def _open(tmp: Path, name: str) -> chm.Device:
    return chm.Device.open(
        targets=[tmp / name],
        create=True,
        capacity="256M",
        dram="48M",
        slot_size="1M",
        backend="pread",
    )


@pytest.fixture(params=["embedded", "daemon"])
def device(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DeviceLike]:
    """A device with no KV store on it: the whole of it is raw."""
    if request.param == "embedded":
        with _open(tmp_path, "dev.img") as dev:
            yield embedded_device(dev)
        return
    args = ["--target", str(tmp_path / "dev.img"), "--create", *GEOMETRY, "--no-kv"]
    with (
        DaemonProcess(args, tmp_path / "chm.sock"),
        chm.connect(str(tmp_path / "chm.sock")) as rdev,
    ):
        yield remote_device(rdev)


@pytest.fixture(params=["embedded", "daemon", _NODES])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreLike]:
    if request.param == "nodes":
        write_secret(tmp_path / "secret")
        node_opts = ["--capacity", "64M", "--dram", "24M", "--wbuf", "8M", "--slot-size", "1M"]
        with (
            RedisServer() as srv,
            NodeProcess(srv.url, "n1", tmp_path / "n1", tmp_path / "secret", options=node_opts),
            NodesStore.open(
                srv.url,
                tmp_path / "secret",
                namespace=chm.kv.Namespace(model="protocol-suite"),
                host="127.0.0.1",
                buffer=8 << 20,
                timeout=5.0,
            ) as ns,
        ):
            yield nodes_store(ns)
        return
    if request.param == "embedded":
        with _open(tmp_path, "kv.img") as dev:
            s = Store(dev)
            yield embedded_store(s)
            s.close()
        return
    args = ["--target", str(tmp_path / "kv.img"), "--create", *GEOMETRY]
    with (
        DaemonProcess(args, tmp_path / "chm.sock"),
        chm.connect(str(tmp_path / "chm.sock")) as rdev,
    ):
        yield remote_store(rdev.kv())


def test_device_geometry(device: DeviceLike) -> None:
    assert device.capacity == 256 << 20
    assert device.slot_bytes == 1 << 20
    assert device.config.backend == "pread"
    assert device.stats().slot_bytes == device.slot_bytes


def test_device_write_read_prefetch(device: DeviceLike) -> None:
    data = _block(1)
    at = 3 << 20
    assert device.write(at, data) is True
    device.flush()
    assert device.read(at, BLOCK) == data.tobytes()
    out = np.zeros(BLOCK, np.uint8)
    assert device.read_into(at, out) == BLOCK
    assert np.array_equal(out, data)
    h = device.prefetch(at, BLOCK)
    view = h.wait()
    assert bytes(view[:BLOCK]) == data.tobytes()
    del view
    h.release()
    assert h.released
    with pytest.raises(StaleHandle):
        h.wait()


def test_device_write_length_needs_the_ghost_backend(device: DeviceLike) -> None:
    with pytest.raises(InvalidArgument, match="needs the ghost backend"):
        device.write_length(0, BLOCK)


def test_device_refuses_out_of_range(device: DeviceLike) -> None:
    with pytest.raises(InvalidArgument):
        device.write(device.capacity, _block(2))


def test_store_put_lookup_load(store: StoreLike) -> None:
    keys = [b"a", b"b", b"c"]
    blocks = [_block(i) for i in range(3)]
    assert store.put(keys, blocks, meta=[b"m0", None, b"m2"]) == [PutStatus.STORED] * 3
    assert store.put([b"a"], [blocks[0]]) == [PutStatus.EXISTS]
    store.flush()
    assert store.contains([b"a", b"x", b"c"]) == [True, False, True]
    assert store.prefix_len([b"a", b"b", b"x", b"c"]) == 2
    assert store.meta([*keys, b"x"]) == [b"m0", b"", b"m2", None]  # b"": put without
    entries = store.entries([b"b", b"x"])
    assert entries[1] is None
    assert entries[0] is not None and entries[0]["length"] == BLOCK
    outs = [np.zeros(BLOCK, np.uint8) for _ in range(4)]
    assert store.load_prefix([*keys, b"x"], outs) == 3
    assert all(np.array_equal(o, b) for o, b in zip(outs, blocks, strict=False))
    got = [np.zeros(BLOCK, np.uint8) for _ in range(2)]
    assert store.get([b"x", b"c"], got) == [False, True]
    assert np.array_equal(got[1], blocks[2])


def test_store_remove(store: StoreLike) -> None:
    assert store.put([b"k"], [_block(7)]) == [PutStatus.STORED]
    assert store.remove([b"k", b"none"]) == [True, False]
    assert store.contains([b"k"]) == [False]
    assert store.load_prefix([b"k"], [np.zeros(BLOCK, np.uint8)]) == 0


def _threads(n: int, work: Any) -> None:
    """Runs work(t) in n threads at once; re-raises the first failure."""
    errs: list[BaseException] = []
    go = threading.Barrier(n)

    def run(t: int) -> None:
        try:
            go.wait()
            work(t)
        except BaseException as exc:  # handed to the test
            errs.append(exc)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for th in ts:
        th.start()
    for th in ts:
        th.join(120)
    assert not errs, errs
    assert not any(th.is_alive() for th in ts)


def test_device_from_several_threads(device: DeviceLike) -> None:
    """Threads sharing one device write and read back their own addresses:
    every byte is their own (a daemon connection copies through one shared
    area, which each call holds for its whole copy)."""
    per, n = 12, 4

    def work(t: int) -> None:
        addrs = [((t * per + i) * 2) << 20 for i in range(per)]
        blocks = [_block(1000 * t + i) for i in range(per)]
        assert device.write_many(addrs, blocks) == [True] * per
        device.flush()
        for a, b in zip(addrs, blocks, strict=True):
            out = np.zeros(BLOCK, np.uint8)
            assert device.read_into(a, out) == BLOCK
            assert np.array_equal(out, b), f"thread {t}: wrong bytes at {a:#x}"

    _threads(n, work)


def test_store_from_several_threads(store: StoreLike) -> None:
    """Threads sharing one store put and load their own keys: each load
    returns exactly the bytes its own put gave."""
    per, n = 8, 4

    def work(t: int) -> None:
        keys = [f"t{t}-{i}".encode() for i in range(per)]
        blocks = [_block(1000 * t + i) for i in range(per)]
        assert store.put(keys, blocks) == [PutStatus.STORED] * per
        outs = [np.zeros(BLOCK, np.uint8) for _ in range(per)]
        assert store.load_prefix(keys, outs) == per
        for o, b in zip(outs, blocks, strict=True):
            assert np.array_equal(o, b), f"thread {t}: wrong bytes"

    _threads(n, work)
