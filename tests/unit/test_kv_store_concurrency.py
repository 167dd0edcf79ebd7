"""The KV store from several threads: a put's device write runs with the
store unlocked, and puts, loads, removes, flushes and compactions running
at once keep every acknowledged block byte-exact, also after a reopen.

Real device files and real threads. The slow write is the device's own
timing model: ``link_lat_ns`` is the host link's latency per transfer, which
paces an admitted write (the caller sleeps in ``chm_pace`` until the
modeled transfer is done) without making the link busy, so the device takes
two such writes at once; a store that held its lock across the write would
make every other call wait that long.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import Busy, Cancelled
from chm.kv import PutStatus, Store
from chm.testing.daemon_proc import DaemonProcess

KiB = 1 << 10
MiB = 1 << 20
S, E, K = PutStatus.STORED, PutStatus.EXISTS, PutStatus.SKIPPED
LAT_S = 1.5  # the modeled host-link latency of the slow device's writes


def blk(key: int, n: int) -> np.ndarray[Any, Any]:
    """A key's block: the same bytes whichever thread puts it (KV blocks are
    immutable), different for every key."""
    return np.random.default_rng(key).integers(0, 256, n, dtype=np.uint8)


def size_of(key: int) -> int:
    """32 KiB to 126 KiB, mostly not a multiple of 512 (the store pads the write)."""
    return 32 * KiB + key % 5 * 24_001


def _geom(capacity: str, link_lat_ns: int = 0) -> dict[str, Any]:
    dev: dict[str, Any] = {"wbuf": "8M"}
    if link_lat_ns:
        dev["link_lat_ns"] = link_lat_ns
    return {
        "capacity": capacity,
        "dram": "16M",
        "slot_size": "128K",
        "backend": "pread",
        "device_options": dev,
    }


def _run(fn: Callable[[], Any], out: dict[str, Any], name: str) -> threading.Thread:
    def body() -> None:
        t0 = time.monotonic()
        try:
            out[name] = fn()
        except BaseException as exc:
            out[name] = exc
        out[name + "_s"] = time.monotonic() - t0

    t = threading.Thread(target=body, name=name)
    t.start()
    return t


def _wait_admitted(st: Store, n: int, timeout: float = 10.0) -> None:
    """Until the device has admitted ``n`` writes: the last of them is then
    in its modeled host-link transfer (paced), inside ``device.write``."""
    end = time.monotonic() + timeout
    while st.device.stats().wr_admitted < n:
        assert time.monotonic() < end, "the write never reached the device"
        time.sleep(0.002)


def test_put_in_a_slow_device_write_blocks_no_other_call(tmp_backing: Path) -> None:
    """While one put sleeps in the device's modeled write, lookups, loads'
    index work, removes (of the key being written too: it is not there yet,
    and the put then publishes it), stats and a put of another key go on:
    the put of the other key overlaps the first (both done in about one
    latency, not two), and nothing else waits for the write. On a store
    that holds its lock across ``device.write`` every call here waits
    ~LAT_S."""
    with Store.open(tmp_backing, **_geom("64M")) as st:  # no latency: set up fast
        assert st.put([1, 2], [blk(1, size_of(1)), blk(2, size_of(2))]) == [S, S]
    lat_ns = int(LAT_S * 1e9)
    with Store.open(tmp_backing, **_geom("64M", lat_ns)) as st:
        res: dict[str, Any] = {}
        t0 = time.monotonic()
        a = _run(lambda: st.put([10], [blk(10, size_of(10))]), res, "a")
        _wait_admitted(st, 1)
        in_write = time.monotonic()
        b = _run(lambda: st.put([11], [blk(11, size_of(11))]), res, "b")
        # calls that need the store lock, each timed while A sleeps in its write
        took = {}
        for name, call in (
            ("contains", lambda: st.contains([1, 10, 11])),
            ("prefix_len", lambda: st.prefix_len([1, 2, 3])),
            ("entries", lambda: st.entries([1])),
            ("lookup", lambda: st.lookup([1, 2]).close()),
            ("remove", lambda: st.remove([2])),
            ("remove_writing", lambda: st.remove([10])),  # in no index yet: not there
            ("stats", st.stats),
            ("exists", lambda: st.put([1], [blk(1, size_of(1))])),
        ):
            c0 = time.monotonic()
            got = call()
            took[name] = time.monotonic() - c0
            if name in ("remove", "remove_writing"):
                assert got == [name == "remove"], name
            if name == "exists":
                assert got == [E]
            if name == "contains":
                assert got == [True, False, False]  # the puts are not published yet
        checked = time.monotonic()
        a.join(30)
        b.join(30)
        done = time.monotonic()
        assert res["a"] == [S] and res["b"] == [S], res
        # A's write was paced: it really took about a latency
        assert res["a_s"] >= 0.8 * LAT_S, res
        # none of the calls waited for A's write to end
        assert checked - in_write < LAT_S / 2, (took, checked - in_write)
        assert a.is_alive() is False
        # B started during A's write and ended about a latency later, not after A
        # plus a latency (2 LAT_S from A's start) as it would behind a held lock
        assert done - t0 < 1.6 * LAT_S, (res, done - t0)
        assert st.contains([10, 11, 2]) == [True, True, False]
        st.flush()
    with Store.open(tmp_backing, **_geom("64M")) as st:
        for k in (1, 10, 11):
            out = np.empty(size_of(k), np.uint8)
            assert st.get([k], [out]) == [True]
            assert np.array_equal(out, blk(k, size_of(k))), k
        assert st.contains([2]) == [False]


def test_same_key_put_while_the_first_is_writing(tmp_backing: Path) -> None:
    """Two puts of one key at once: both write (the key is not in the
    store while the first is in flight, so the second may not say EXISTS),
    the first to finish publishes, the other reports EXISTS and gives its
    space back; the key holds its bytes and the store's accounting is
    exact."""
    with Store.open(tmp_backing, **_geom("64M", int(LAT_S * 1e9))) as st:
        res: dict[str, Any] = {}
        a = _run(lambda: st.put([7], [blk(7, size_of(7))]), res, "a")
        _wait_admitted(st, 1)
        b = _run(lambda: st.put([7], [blk(7, size_of(7))]), res, "b")
        a.join(30)
        b.join(30)
        assert sorted([res["a"][0], res["b"][0]]) == [S, E], res
        s = st.stats()
        assert (s.entries, s.puts_stored, s.puts_exists, s.segments_pinned) == (1, 1, 1, 0)
        assert s.live_bytes == size_of(7)
        out = np.empty(size_of(7), np.uint8)
        assert st.get([7], [out]) == [True]
        assert np.array_equal(out, blk(7, size_of(7)))


def test_close_waits_for_puts_in_flight(tmp_backing: Path) -> None:
    """close() during a put's device write: the put ends STORED, close
    flushes it, the reopened store has it byte-exact; a put after close
    began is Cancelled."""
    st = Store.open(tmp_backing, **_geom("64M", int(LAT_S * 1e9)))
    res: dict[str, Any] = {}
    a = _run(lambda: st.put([5], [blk(5, size_of(5))]), res, "a")
    _wait_admitted(st, 1)
    c = _run(st.close, res, "close")
    end = time.monotonic() + 5
    while not getattr(st, "_closing", False) and time.monotonic() < end:
        time.sleep(0.001)  # until close() has marked the store: new puts are refused
    with pytest.raises(Cancelled):
        st.put([6], [blk(6, size_of(6))])
    a.join(30)
    c.join(30)
    assert res["a"] == [S] and res["close"] is None, res
    with Store.open(tmp_backing, **_geom("64M")) as st2:
        out = np.empty(size_of(5), np.uint8)
        assert st2.get([5], [out]) == [True]
        assert np.array_equal(out, blk(5, size_of(5)))
        assert st2.contains([6]) == [False]


def test_a_segment_being_written_is_not_reclaimed(tmp_backing: Path) -> None:
    """Put vs eviction: a store of 4 one-block segments; while one put is
    in its (slow) device write, four more puts on other threads fill the
    other segments and the last finds every segment pinned by a write in
    flight: it is SKIPPED, not placed over the block being written. Every
    STORED block reads back byte-exact after reopening."""
    seg = 132 * KiB  # a 128 KiB block and its header sector
    n = 128 * KiB

    def open_store(lat_ns: int) -> Store:
        dev = chm.Device.open(
            targets=[tmp_backing / "kv.img"], capacity="64M", dram="16M", wbuf="8M",
            slot_size="128K", backend="pread", create=True, link_lat_ns=lat_ns,
        )  # fmt: skip
        return Store(
            dev, own_device=True, journal=tmp_backing / "kv.jn", capacity=4 * seg,
            segment_bytes=seg, eviction="fifo",
        )  # fmt: skip

    st = open_store(int(LAT_S * 1e9))
    res: dict[str, Any] = {}
    a = _run(lambda: st.put([100], [blk(100, n)]), res, "a")
    _wait_admitted(st, 1)
    # each decides in a moment, then sleeps in its write as long as A's
    ts = [_run(functools.partial(st.put, [k], [blk(k, n)]), res, f"k{k}") for k in range(101, 105)]
    for t in [a, *ts]:
        t.join(30)
    assert res["a"] == [S], res
    got = [res[f"k{k}"][0] for k in range(101, 105)]
    assert sorted(got) == [S, S, S, K], got
    assert st.stats().segments_pinned == 0
    stored = [100] + [k for k, g in zip(range(101, 105), got, strict=True) if g == S]
    st.close()
    st = open_store(0)
    try:
        assert len(st) == 4
        for k in stored:
            out = np.empty(n, np.uint8)
            assert st.get([k], [out]) == [True], k
            assert np.array_equal(out, blk(k, n)), k
    finally:
        st.close()


def _stress(st: Store, seconds: float, removable: range, seed: int) -> dict[str, Any]:
    """Threads putting, loading, removing, flushing and compacting at once.
    Keys 0..199 are shared by every putter (same-key races), keys of
    ``removable`` are the only ones removed. Every hit is checked
    byte-exact. Returns what the putters were told and what failed."""
    stop = time.monotonic() + seconds
    stored: set[int] = set()
    removed: set[int] = set()
    errors: list[str] = []
    lock = threading.Lock()

    def pick(rng: random.Random, own: int) -> int:
        """A shared key (0..199) or one of thread ``own``'s (1000 * own + ...)."""
        return rng.randrange(200) if rng.random() < 0.5 else 1000 * own + rng.randrange(800)

    def putter(t: int) -> None:
        rng = random.Random(seed * 100 + t)
        while time.monotonic() < stop:
            n = rng.randint(1, 6)
            keys = [pick(rng, t + 1) for _ in range(n)]
            got = st.put(
                keys, [blk(k, size_of(k)) for k in keys], meta=[bytes([k % 251]) for k in keys]
            )
            with lock:
                for k, s in zip(keys, got, strict=True):
                    if s == S:
                        stored.add(k)
                        removed.discard(k)
                    elif s not in (E, K):
                        errors.append(f"put {k}: {s!r}")

    def loader(t: int) -> None:
        rng = random.Random(seed * 100 + 50 + t)
        while time.monotonic() < stop:
            keys = [pick(rng, rng.randint(1, 4)) for _ in range(rng.randint(1, 8))]
            outs = [np.empty(128 * KiB, np.uint8) for _ in keys]
            if rng.random() < 0.5:
                got = st.get(keys, outs)
            else:
                n = st.load_prefix(keys, outs)
                got = [i < n for i in range(len(keys))]
            for k, o, g in zip(keys, outs, got, strict=True):
                if g and not np.array_equal(o[: size_of(k)], blk(k, size_of(k))):
                    with lock:
                        errors.append(f"load {k}: wrong bytes")

    def remover() -> None:
        rng = random.Random(seed * 100 + 90)
        while time.monotonic() < stop:
            k = rng.choice(removable)
            try:
                if st.remove([k]) == [True]:
                    with lock:
                        removed.add(k)
                        stored.discard(k)
            except Busy:
                pass  # being loaded
            time.sleep(0.001)

    def flusher() -> None:
        rng = random.Random(seed * 100 + 95)
        while time.monotonic() < stop:
            st.flush()
            if rng.random() < 0.3:
                st.compact()
            time.sleep(0.005)

    threads = [threading.Thread(target=putter, args=(t,)) for t in range(4)]
    threads += [threading.Thread(target=loader, args=(t,)) for t in range(2)]
    threads += [threading.Thread(target=remover), threading.Thread(target=flusher)]
    failed: list[BaseException] = []

    def guard(th: threading.Thread) -> threading.Thread:
        run = th.run

        def wrapped() -> None:
            try:
                run()
            except BaseException as exc:
                failed.append(exc)

        th.run = wrapped  # type: ignore[method-assign]
        return th

    for th in threads:
        guard(th).start()
    for th in threads:
        th.join(seconds + 60)
    assert not failed, failed
    assert not errors, errors[:10]
    return {"stored": stored, "removed": removed}


def _check_all(st: Store, keys: set[int]) -> None:
    """Every key present, byte-exact, with its metadata."""
    for k in sorted(keys):
        out = np.empty(size_of(k), np.uint8)
        assert st.get([k], [out]) == [True], k
        assert np.array_equal(out, blk(k, size_of(k))), k
        assert st.meta([k]) == [bytes([k % 251])], k


def test_stress_nothing_acknowledged_is_lost(tmp_backing: Path) -> None:
    """No eviction (the device holds every key): each key a put reported
    STORED and no remove took away is present and byte-exact at the end and
    after close and reopen; the accounting is exact (nothing left pinned,
    live bytes = the entries' bytes)."""
    removable = range(1000, 1200)  # thread 0's first 200 keys
    with Store.open(tmp_backing, **_geom("1G")) as st:
        got = _stress(st, 2.0, removable, 1)
        st.flush()
        keep = got["stored"]
        assert len(keep) > 20, len(keep)
        _check_all(st, keep)
        assert st.contains(sorted(got["removed"])) == [False] * len(got["removed"])
        s = st.stats()
        assert s.evicted_blocks == 0 and s.segments_pinned == 0 and s.pending_entries == 0
        assert s.entries == len(keep)
        assert s.live_bytes == sum(size_of(k) for k in keep)
    with Store.open(tmp_backing, **_geom("1G")) as st:
        assert len(st) == len(keep)
        _check_all(st, keep)


def test_stress_with_eviction_serves_no_wrong_bytes(tmp_backing: Path) -> None:
    """A device too small for the keys: segments are reclaimed while other
    threads write into and load from the others; every hit is byte-exact
    (checked in the threads), every entry after close and reopen too, and
    no segment is left pinned."""
    with Store.open(tmp_backing, **_geom("8M")) as st:
        _stress(st, 2.0, range(1000, 1200), 3)
        s = st.stats()
        assert s.evicted_blocks > 0 and s.segments_pinned == 0
        left = [k for k in [*range(200), *range(1000, 5000)] if st.contains([k]) == [True]]
        assert left
        _check_all(st, set(left))
        live = s.live_bytes
        assert live == sum(size_of(k) for k in left)
    with Store.open(tmp_backing, **_geom("8M")) as st:
        assert len(st) == len(left)
        _check_all(st, set(left))


def test_remote_device_puts_from_two_threads(tmp_backing: Path, tmp_path: Path) -> None:
    """A store over the daemon client (chm.connect): its writes go through
    one shared area per connection, so the store makes them one at a time;
    two threads putting at once store every block byte-exact."""
    args = [
        "--target", str(tmp_backing / "d.img"), "--create", "--capacity", "128M",
        "--dram", "48M", "--slot-size", "128K", "--backend", "pread", "--raw", "64M",
    ]  # fmt: skip
    with DaemonProcess(args, tmp_path / "chm.sock") as d, chm.connect(d.socket) as dev:
        st = Store(dev, journal=tmp_path / "r.kvjournal", segment_bytes=MiB)
        res: dict[str, Any] = {}

        def puts(base: int) -> list[PutStatus]:
            out: list[PutStatus] = []
            for i in range(40):
                k = base + i
                out += st.put([k], [blk(k, size_of(k))])
            return out

        ts = [_run(functools.partial(puts, b), res, f"t{b}") for b in (100, 200)]
        for t in ts:
            t.join(60)
        assert res["t100"] == [S] * 40 and res["t200"] == [S] * 40, res
        st.flush()
        _check_all_plain(st, [*range(100, 140), *range(200, 240)])
        st.close()


def _check_all_plain(st: Store, keys: list[int]) -> None:
    for k in keys:
        out = np.empty(size_of(k), np.uint8)
        assert st.get([k], [out]) == [True], k
        assert np.array_equal(out, blk(k, size_of(k))), k
