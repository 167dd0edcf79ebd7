"""The KV store on a real device: statuses, buffers, eviction, pins, tickets, locks."""

from __future__ import annotations

import contextlib
import select
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import Busy, ChmError, InvalidArgument, WaitTimeout
from chm.kv import PutStatus, Store

MiB = 1 << 20
GEOM: dict[str, Any] = {
    "capacity": "64M",
    "dram": "16M",
    "slot_size": "1M",
    "device_options": {"wbuf": "4M"},
}
S, E, K = PutStatus.STORED, PutStatus.EXISTS, PutStatus.SKIPPED
# a segment of 8 blocks of 1 MiB, each followed by its 4 KiB-aligned header;
# a 72 MiB device holds 8 of them
SEG8 = 8 * (MiB + 4096)


def blk(i: int, n: int = MiB) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def open_store(tmp_backing: Path) -> Iterator[Callable[..., Store]]:
    made: list[Store] = []

    def make(backend: str = "pread", **kw: Any) -> Store:
        st = Store.open(tmp_backing, backend=backend, **{**GEOM, **kw})
        made.append(st)
        return st

    yield make
    for st in made:
        with contextlib.suppress(ChmError):
            st.close()


def put_flushed(st: Store, keys: list[int], size: int = MiB) -> list[PutStatus]:
    """Puts one block at a time, flushing so the 4 MiB write buffer never fills."""
    out = []
    for k in keys:
        out += st.put([k], [blk(k, size)])
        st.flush()
    return out


def test_put_get_contains(open_store: Callable[..., Store]) -> None:
    st = open_store()
    assert st.put([1, 2, 1], [blk(1), blk(2), blk(1)]) == [S, S, E]
    assert st.put([2], [blk(2)]) == [E]
    assert st.contains([1, 2, 3]) == [True, True, False]
    assert st.prefix_len([1, 2, 3, 1]) == 2
    a, b, c = np.zeros(MiB, np.uint8), bytearray(MiB), np.zeros(MiB, np.uint8)
    assert st.get([2, 3, 1], [a, b, c]) == [True, False, True]
    assert np.array_equal(a, blk(2)) and c.tobytes() == blk(1).tobytes()
    assert not any(b)  # a miss leaves its buffer alone
    s = st.stats()
    assert (s.puts_stored, s.puts_exists, s.gets_hit, s.gets_miss) == (2, 2, 2, 1)
    assert s.entries == 2 and s.live_bytes == 2 * MiB


def test_odd_sizes_and_typed_buffers(open_store: Callable[..., Store]) -> None:
    st = open_store()
    half = np.arange(1000, dtype=np.float16).reshape(10, 100)  # 2000 bytes, not a sector multiple
    assert st.put(["0a", "0b"], [half, b"xyz"]) == [S, S]
    d1 = np.zeros((10, 100), np.float16)
    d2 = memoryview(bytearray(8))
    assert st.get(["0a", "0b"], [d1, d2]) == [True, True]
    assert np.array_equal(d1, half) and bytes(d2[:3]) == b"xyz" and bytes(d2[3:]) == bytes(5)
    assert st.info("0b") is not None and st.info("0b")["length"] == 3  # type: ignore[index]


def test_torch_tensors(open_store: Callable[..., Store]) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    st = open_store()
    src = torch.arange(4096, dtype=torch.float32)
    assert st.put([7], [src]) == [S]
    dst = torch.zeros(4096, dtype=torch.float32)
    assert st.get([7], [dst]) == [True]
    assert torch.equal(src, dst)


def test_bad_input_is_refused_before_any_change(open_store: Callable[..., Store]) -> None:
    st = open_store()
    with pytest.raises(InvalidArgument, match="source 1: 2097152 bytes"):
        st.put([1, 2], [blk(1), blk(2, 2 * MiB)])
    with pytest.raises(InvalidArgument, match="source 0: 0 bytes"):
        st.put([1], [b""])
    with pytest.raises(InvalidArgument, match="2 keys but 1 sources"):
        st.put([1, 2], [blk(1)])
    with pytest.raises(InvalidArgument, match="source 0: int has no buffer protocol"):
        st.put([1], [5])
    assert st.contains([1, 2]) == [False, False]
    assert st.put([1], [blk(1)]) == [S]
    with pytest.raises(InvalidArgument, match="destination 0: 100 bytes, the block has"):
        st.get([1], [bytearray(100)])
    with pytest.raises(InvalidArgument, match="destination 0: the buffer is read-only"):
        st.get([1], [bytes(MiB)])
    with pytest.raises(InvalidArgument, match="not C-contiguous"):
        st.get([1], [np.zeros((MiB, 2), np.uint8)[:, 0]])
    with pytest.raises(InvalidArgument, match="hexadecimal"):
        st.contains(["zz"])
    assert st.stats().segments_pinned == 0  # a refused get pinned nothing


def test_device_kinds_the_store_refuses(tmp_backing: Path) -> None:
    direct: dict[str, Any] = {
        "capacity": "64M",
        "backend": "pread",
        "mode": "direct",
        "create": True,
    }
    with (
        chm.Device.open(targets=[tmp_backing / "d.img"], **direct) as dev,
        pytest.raises(InvalidArgument, match="prefetch or lru mode, not mode='direct'"),
    ):
        Store(dev)


def test_full_write_buffer_is_a_skip_not_a_stall(open_store: Callable[..., Store]) -> None:
    st = open_store()
    dev: chm.Device = st.device  # type: ignore[assignment]
    dev.inject_fault("slow", arg=500_000_000)  # the flusher cannot drain the buffer meanwhile
    res = st.put(list(range(8)), [blk(i) for i in range(8)])  # 8 MiB into a 4 MiB buffer
    dev.inject_fault("none")
    assert K in res and S in res
    assert st.contains(list(range(8))) == [r == S for r in res]
    assert st.stats().puts_skipped == res.count(K)
    st.flush()
    assert st.put([i for i, r in enumerate(res) if r == K][:1], [blk(99)]) == [S]


def test_eviction_lru_keeps_what_is_read(open_store: Callable[..., Store]) -> None:
    st = open_store(segment_bytes=SEG8, capacity="72M", eviction="lru")  # 8 segments of 8 blocks
    assert put_flushed(st, list(range(56))) == [S] * 56  # segments 0..6
    out = [np.zeros(MiB, np.uint8)]
    assert st.get([0], out) == [True]  # segment 0 becomes the most recent
    assert put_flushed(st, list(range(100, 116))) == [S] * 16  # needs two segments back
    s = st.stats()
    assert s.reclaimed_segments == 1 and s.evicted_blocks == 8
    assert all(st.contains(list(range(8))))  # read recently: kept
    assert not any(st.contains(list(range(8, 16))))  # least recently used: dropped
    assert s.live_bytes == s.entries * MiB


def test_eviction_fifo_drops_the_oldest(open_store: Callable[..., Store]) -> None:
    st = open_store(segment_bytes=SEG8, capacity="72M", eviction="fifo")
    put_flushed(st, list(range(56)))
    st.get([0], [np.zeros(MiB, np.uint8)])
    put_flushed(st, list(range(100, 116)))
    assert not any(st.contains(list(range(8))))
    assert all(st.contains(list(range(8, 16))))


def test_pinned_blocks_are_never_reclaimed(open_store: Callable[..., Store]) -> None:
    st = open_store(segment_bytes=SEG8, capacity="72M")
    put_flushed(st, list(range(64)))  # every segment used
    assert st.pin([*range(0, 64, 8), 999]) == [True] * 8 + [False]  # one per segment
    assert st.stats().segments_pinned == 8
    assert put_flushed(st, [500, 501]) == [K, K]  # nothing can be reclaimed: not stored
    assert all(st.contains(list(range(64))))
    with pytest.raises(Busy, match="key #0 is pinned"):
        st.remove([0])
    st.unpin([0])
    with pytest.raises(InvalidArgument, match="key #0 is not pinned"):
        st.unpin([0])
    assert put_flushed(st, [500]) == [S]  # segment 0 could go
    assert not st.contains([1])[0] and st.contains([8])[0]
    st.unpin(list(range(8, 64, 8)))
    assert st.stats().segments_pinned == 0


def test_remove(open_store: Callable[..., Store]) -> None:
    st = open_store()
    put_flushed(st, [1, 2])
    assert st.remove([1, 3, 1]) == [True, False, True]
    assert st.contains([1, 2]) == [False, True]
    assert st.stats().live_bytes == MiB
    assert put_flushed(st, [1]) == [S]  # a removed key can be stored again


def test_async_tickets_poll_through_an_fd(open_store: Callable[..., Store]) -> None:
    st = open_store()
    t = st.put_async([1, 2], [blk(1), blk(2)])
    assert select.select([t.fileno()], [], [], 10)[0] == [t.fileno()]
    assert t.done() and t.wait(0) == [S, S]
    t.close()
    dev: chm.Device = st.device  # type: ignore[assignment]
    dev.inject_fault("slow", arg=2_000_000_000)  # every backend I/O completes 2 s late
    out = [np.zeros(MiB, np.uint8), np.zeros(MiB, np.uint8)]
    with st.get_async([1, 2], out) as g:
        assert not g.done()
        with pytest.raises(WaitTimeout, match=r"not done after 0\.05 s"):
            g.wait(0.05)
        assert select.select([g], [], [], 0)[0] == []
        assert g.wait(30) == [True, True]
    dev.inject_fault("none")
    assert np.array_equal(out[1], blk(2))
    bad = st.put_async([1], [b""])
    with pytest.raises(InvalidArgument):
        bad.wait(10)


def test_second_opener_is_refused_with_the_path(open_store: Callable[..., Store],
                                                tmp_backing: Path) -> None:  # fmt: skip
    st = open_store()
    with pytest.raises(Busy) as ei:
        Store.open(tmp_backing, backend="pread", **GEOM)
    assert str(tmp_backing / "kv.img") in str(ei.value) and "pid" in str(ei.value)
    assert ei.value.filename == str(tmp_backing / "kv.img")
    # a store on another device but the same journal is refused too
    other: dict[str, Any] = {
        "capacity": "64M",
        "dram": "16M",
        "wbuf": "4M",
        "slot_size": "1M",
        "create": True,
    }
    with (
        chm.Device.open(targets=[tmp_backing / "other.img"], backend="pread", **other) as dev,
        pytest.raises(Busy, match=r"kv\.img\.kvjournal\.lock: in use by pid"),
    ):
        Store(dev, journal=st.stats().journal_path)
    st.close()
    Store.open(tmp_backing, backend="pread", **GEOM).close()  # free again once closed


def test_reopen_finds_everything_and_compacts(open_store: Callable[..., Store]) -> None:
    st = open_store()
    put_flushed(st, list(range(10)))
    st.remove([0, 1])
    st.close()
    st = open_store()
    s = st.stats()
    assert s.recovered_entries == 8 and s.journal_records == 8  # compacted at close
    out = [np.zeros(MiB, np.uint8) for _ in range(8)]
    assert st.get(list(range(2, 10)), out) == [True] * 8
    assert all(np.array_equal(o, blk(i + 2)) for i, o in enumerate(out))
    st.close()
    seg = s.segment_bytes
    with pytest.raises(InvalidArgument, match=f"segment_bytes={seg}, the store now has"):
        Store.open(st.stats().journal_path.rsplit("/", 1)[0], backend="pread",
                   segment_bytes=16 * MiB, **GEOM)  # fmt: skip


def test_a_full_refill_queue_is_no_failure(open_store: Callable[..., Store]) -> None:
    st = open_store(device_options={"wbuf": "4M", "refill_queue": 1})
    put_flushed(st, [1, 2])
    dev: chm.Device = st.device  # type: ignore[assignment]
    held = []
    with contextlib.suppress(chm.errors.WouldBlock):  # every slot and the queue taken
        while True:
            held.append(dev.prefetch(0, MiB))
    out = [np.zeros(MiB, np.uint8), np.zeros(MiB, np.uint8)]
    assert st.get([1, 2], out) == [False, False]  # not loaded, nothing raised
    s = st.stats()
    assert s.window_blocked >= 1 and s.io_errors == 0 and s.segments_pinned == 0
    for h in held:
        h.release()
    assert st.get([1, 2], out) == [True, True]
    assert np.array_equal(out[1], blk(2))


def test_written_against_the_device_protocol(open_store: Callable[..., Store]) -> None:
    from chm.kv import DeviceLike, HandleLike

    st = open_store()
    assert isinstance(st.device, DeviceLike)
    with st.device.prefetch(0, 4096) as h:
        assert isinstance(h, HandleLike)
