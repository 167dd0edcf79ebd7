"""Batched prefetch / release / write through chm.Device: a status per
element, in order, the same as the one-object calls; whole-call refusals."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import chm
from chm.errors import InvalidArgument, StaleHandle, ViewInUse, WouldBlock

K4 = 4096


@pytest.fixture
def dev() -> Iterator[chm.Device]:
    d = chm.Device.open(
        capacity="1G",
        dram="1M",
        wbuf="256K",
        slot_size="4K",
        slots=4,
        refill_queue=2,
        backend="ghost",
    )
    yield d
    d.close()


def test_prefetch_many_statuses_in_order(dev: chm.Device) -> None:
    addrs = [i * K4 for i in range(9)]
    lens = [K4] * 9
    lens[1] = 0  # refused alone
    out = dev.prefetch_many(addrs, lens)
    assert [type(x) for x in out] == [
        chm.Handle,
        InvalidArgument,
        chm.Handle,
        chm.Handle,
        chm.Handle,
        chm.Handle,  # queued
        chm.Handle,  # queued
        WouldBlock,
        WouldBlock,
    ]
    assert "len=0" in str(out[1]) and "addr=0x1000" in str(out[1])
    hs = [h for h in out if isinstance(h, chm.Handle)]
    assert bytes(hs[0].wait(1.0)[:0]) == b""
    assert len(hs[2].wait(1.0)) == K4
    s = dev.stats()
    assert (s.prefetch_issued, s.prefetch_queued, s.prefetch_rejected) == (6, 2, 2)
    assert dev.release_many(hs) == [None] * 6
    assert all(h.released for h in hs)
    s = dev.stats()
    assert s.slots_free == 4 and s.queue_len == 0 and s.prefetch_released == 6


def test_prefetch_many_noqueue(dev: chm.Device) -> None:
    out = dev.prefetch_many([0, K4, 2 * K4, 3 * K4, 4 * K4], [K4] * 5, noqueue=True)
    assert isinstance(out[4], WouldBlock) and dev.stats().queue_len == 0
    dev.release_many([h for h in out if isinstance(h, chm.Handle)])


def test_release_many_mixed(dev: chm.Device) -> None:
    other = chm.Device.open(capacity="1G", dram="1M", wbuf="256K", slot_size="4K", backend="ghost")
    try:
        foreign = other.prefetch(0, K4)
        a, b, c = (h for h in dev.prefetch_many([0, K4, 2 * K4], [K4] * 3))
        assert isinstance(a, chm.Handle) and isinstance(b, chm.Handle)
        assert isinstance(c, chm.Handle)
        a.release()  # already released: nothing to do, as Handle.release
        arr = np.frombuffer(b.wait(1.0), np.uint8)  # exported: b keeps its slot
        res = dev.release_many([a, b, c, foreign])
        assert res[0] is None and res[2] is None
        assert isinstance(res[1], ViewInUse) and not b.released
        assert isinstance(res[3], InvalidArgument) and not foreign.released
        del arr
        assert dev.release_many([b]) == [None]
        with pytest.raises(StaleHandle):
            dev.adopt(c.token).wait(0)
        foreign.release()
    finally:
        other.close()


def test_write_many(dev: chm.Device) -> None:
    blk = bytes(K4)
    res = dev.write_many([0, 8192, 100, 0], [blk, bytes(512), bytes(512), bytes(1 << 20)])
    assert res[0] is True and res[1] is True
    assert isinstance(res[2], InvalidArgument) and "addr=0x64" in str(res[2])
    # larger than the write buffer: never admissible, a configuration error
    assert isinstance(res[3], InvalidArgument)
    s = dev.stats()
    assert (s.wr_admitted, s.wr_skipped) == (2, 0)


def test_whole_call_refusals(dev: chm.Device) -> None:
    with pytest.raises(InvalidArgument, match="lengths differ"):
        dev.prefetch_many([0, K4], [K4])
    with pytest.raises(InvalidArgument, match="CHM_BATCH_MAX"):
        dev.prefetch_many([0] * 5000, [K4] * 5000)
    with pytest.raises(InvalidArgument, match="bool"):
        dev.prefetch_many([True], [K4])
    with pytest.raises(InvalidArgument):
        dev.prefetch_many([-1], [K4])
    with pytest.raises(TypeError):
        dev.prefetch_many(["x"], [K4])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="lengths differ"):
        dev.write_many([0], [])
    assert dev.prefetch_many([], []) == []
    assert dev.release_many([]) == []
    s = dev.stats()
    assert s.prefetch_issued == 0 and s.slots_free == 4
