"""The batched calls of chm.connect() are chm.Device's: the same signatures,
a status per element in order, the same exception classes; every case runs
against an embedded device and a real daemon process with the same geometry.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import ChmError, InvalidArgument, StaleHandle, ViewInUse, WouldBlock
from chm.remote import RemoteDevice, RemoteHandle
from chm.testing.daemon_proc import DaemonProcess

K4 = 4096
GEOMETRY: dict[str, Any] = {
    "capacity": 64 << 20,
    "dram": 1 << 20,
    "wbuf": 256 << 10,
    "slot_size": K4,
    "slots": 4,
    "refill_queue": 2,
}


def _toml(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def _open(kind: str, tmp: Path, name: str) -> Iterator[Any]:
    img = tmp / f"{name}.img"
    if kind == "embedded":
        d = chm.Device.open(targets=[img], backend="pread", create=True, **GEOMETRY)
        try:
            yield d
        finally:
            d.close()
        return
    cfg = tmp / f"{name}.toml"
    lines = ["[device]", f'targets = ["{img}"]', 'backend = "pread"', "create = true"]
    lines += [f"{k} = {_toml(v)}" for k, v in GEOMETRY.items()]
    cfg.write_text("\n".join(lines) + "\n")
    # the one client may hold every request entry, as the embedded device's
    # caller does (the daemon's default client quota is half of them)
    quota = str(GEOMETRY["slots"] + GEOMETRY["refill_queue"])
    args = ["--config", str(cfg), "--no-kv", "--client-quota", quota]
    with DaemonProcess(args, tmp / f"{name}.sock") as p:
        r = chm.connect(p.socket)
        try:
            yield r
        finally:
            r.close()


@pytest.fixture(params=["embedded", "daemon"])
def dev(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield from _open(request.param, tmp_path, "a")


def _settled(dev: Any) -> Any:
    """Stats once no fill is in flight (a released filling slot is freed
    when its I/O completes)."""
    deadline = time.monotonic() + 10.0
    while True:
        s = dev.stats()
        if s.slots_filling == 0 or time.monotonic() > deadline:
            return s
        time.sleep(0.01)


def _handle_type(dev: Any) -> Any:
    return RemoteHandle if isinstance(dev, RemoteDevice) else chm.Handle


def test_prefetch_many_statuses_in_order(dev: Any) -> None:
    H = _handle_type(dev)
    lens = [K4] * 9
    lens[1] = 0  # refused alone
    out = dev.prefetch_many([i * K4 for i in range(9)], lens)
    assert [type(x) for x in out] == [H, InvalidArgument, H, H, H, H, H, WouldBlock, WouldBlock]
    assert "len=0" in str(out[1]) and "addr=0x1000" in str(out[1])
    hs = [h for h in out if isinstance(h, H)]
    assert len(hs[2].wait(5.0)) == K4
    s = dev.stats()
    assert (s.prefetch_issued, s.prefetch_queued, s.prefetch_rejected) == (6, 2, 2)
    assert dev.release_many(hs) == [None] * 6
    assert all(h.released for h in hs)
    s = _settled(dev)
    assert s.slots_free == 4 and s.queue_len == 0 and s.prefetch_released == 6


def test_prefetch_many_noqueue(dev: Any) -> None:
    out = dev.prefetch_many([i * K4 for i in range(5)], [K4] * 5, noqueue=True)
    assert isinstance(out[4], WouldBlock) and dev.stats().queue_len == 0
    assert dev.release_many(out[:4]) == [None] * 4


def test_release_many_mixed(dev: Any, tmp_path: Path) -> None:
    H = _handle_type(dev)
    kind = "daemon" if H is RemoteHandle else "embedded"
    for other in _open(kind, tmp_path, "b"):
        foreign = other.prefetch(0, K4)
        a, b, c = dev.prefetch_many([0, K4, 2 * K4], [K4] * 3)
        assert isinstance(a, H) and isinstance(b, H) and isinstance(c, H)
        a.release()  # already released: nothing to do, as Handle.release
        arr = np.frombuffer(b.wait(5.0), np.uint8)  # exported: b keeps its slot
        res = dev.release_many([a, b, c, foreign])
        assert res[0] is None and res[2] is None
        assert isinstance(res[1], ViewInUse) and not b.released
        assert isinstance(res[3], InvalidArgument) and not foreign.released
        assert dev.stats().slots_held == 1
        del arr
        assert dev.release_many([b]) == [None]
        assert _settled(dev).slots_free == 4
        with pytest.raises(StaleHandle):
            dev.adopt(c.token).wait(0)
        foreign.release()


def test_single_release_raises_what_the_batch_reports(dev: Any) -> None:
    h = dev.prefetch(0, K4)
    arr = np.frombuffer(h.wait(5.0), np.uint8)
    with pytest.raises(ViewInUse):
        h.release()
    assert not h.released
    del arr
    h.release()
    h.release()  # a second call is a no-op
    assert h.released


def test_write_many(dev: Any) -> None:
    blk = np.arange(K4, dtype=np.uint8).tobytes()
    res = dev.write_many([0, 8192, 100, 0], [blk, bytes(512), bytes(512), bytes(1 << 20)])
    assert res[0] is True and res[1] is True
    assert isinstance(res[2], InvalidArgument) and "addr=0x64" in str(res[2])
    # larger than the write buffer: a configuration error, not a routine skip
    assert isinstance(res[3], InvalidArgument)
    s = dev.stats()
    assert (s.wr_admitted, s.wr_skipped) == (2, 0)
    dev.flush(10.0)
    assert dev.read(0, K4) == blk


def test_whole_call_refusals(dev: Any) -> None:
    with pytest.raises(InvalidArgument, match="lengths differ"):
        dev.prefetch_many([0, K4], [K4])
    with pytest.raises(InvalidArgument, match="CHM_BATCH_MAX"):
        dev.prefetch_many([0] * 5000, [K4] * 5000)
    with pytest.raises(InvalidArgument, match="bool"):
        dev.prefetch_many([True], [K4])
    with pytest.raises(InvalidArgument):
        dev.prefetch_many([-1], [K4])
    with pytest.raises(TypeError):
        dev.prefetch_many(["x"], [K4])
    with pytest.raises(InvalidArgument, match="lengths differ"):
        dev.write_many([0], [])
    with pytest.raises(InvalidArgument, match="bool"):
        dev.write_many([False], [bytes(512)])
    assert dev.prefetch_many([], []) == []
    assert dev.release_many([]) == []
    assert dev.write_many([], []) == []
    s = _settled(dev)
    assert s.prefetch_issued == 0 and s.slots_free == 4


def test_more_than_one_round_trip(dev: Any) -> None:
    """A batch longer than the daemon's MAX_BATCH (256) is split, in order;
    here the queue is short, so all but the first 6 are refused."""
    out = dev.prefetch_many([i * K4 for i in range(600)], [K4] * 600)
    kinds = [type(x).__name__ for x in out]
    assert kinds.count("WouldBlock") == 594
    assert all(not isinstance(x, ChmError) for x in out[:6])
    assert dev.release_many(out[:6]) == [None] * 6
