"""The KV store's per-key metadata, flush_async, entries by digest, the
journal's versions, and the store on lru-mode and ghost devices."""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import ChmError, InvalidArgument
from chm.kv import MAX_META, Namespace, PutStatus, Store
from chm.kv import journal as jn
from chm.kv.index import DURABLE, PENDING

MiB = 1 << 20
GEOM: dict[str, Any] = {
    "capacity": "64M",
    "dram": "16M",
    "slot_size": "1M",
    "device_options": {"wbuf": "4M"},
}
S, E = PutStatus.STORED, PutStatus.EXISTS


def blk(i: int, n: int = 256 << 10) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def open_store(tmp_backing: Path) -> Iterator[Callable[..., Store]]:
    made: list[Store] = []

    def make(**kw: Any) -> Store:
        st = Store.open(tmp_backing, backend="pread", **{**GEOM, **kw})
        made.append(st)
        return st

    yield make
    for st in made:
        with contextlib.suppress(ChmError):
            st.close()


# ---- metadata


def test_meta_is_kept_with_the_entry(open_store: Callable[..., Store]) -> None:
    st = open_store()
    meta = [b'{"shape":[2,32,256,8,128],"dtype":"bfloat16","fmt":1}', None, bytes(MAX_META)]
    assert st.put([1, 2, 3], [blk(1), blk(2), blk(3)], meta) == [S, S, S]
    assert st.meta([1, 2, 3, 4]) == [meta[0], b"", bytes(MAX_META), None]
    # a key that exists keeps the metadata of its first put
    assert st.put([1], [blk(1)], [b"other"]) == [E]
    assert st.meta([1]) == [meta[0]]
    st.remove([3])
    assert st.meta([3]) == [None]
    assert st.put([3], [blk(3)], [b"new"]) == [S]
    assert st.meta([3]) == [b"new"]


def test_meta_survives_close_and_compaction(open_store: Callable[..., Store]) -> None:
    st = open_store()
    metas = [bytes([i]) * (i * 29 % (MAX_META + 1)) for i in range(12)]
    for i in range(12):
        st.put([i], [blk(i)], [metas[i]])
        st.flush()
    st.remove([5])
    path = st.stats().journal_path
    st.close()  # compacts: the metadata is rewritten with its entries
    st = open_store()
    assert st.stats().recovered_entries == 11 and st.stats().journal_path == path
    want: list[bytes | None] = list(metas)
    want[5] = None
    assert st.meta(list(range(12))) == want


_CRASH = """
import os, sys, numpy as np
from chm.kv import Store
st = Store.open(sys.argv[1], backend="pread", capacity="64M", dram="16M", slot_size="1M",
                device_options={"wbuf": "4M"})
for i in range(6):
    st.put([i], [np.full(65536, i, np.uint8)], [b"m%d" % i * (i * 10)])
    st.flush()
st.put([99], [np.full(65536, 9, np.uint8)], [b"never flushed"])
os.kill(os.getpid(), 9)
"""


def test_meta_of_flushed_blocks_survives_kill_9(tmp_backing: Path) -> None:
    p = subprocess.run([sys.executable, "-c", _CRASH, str(tmp_backing)], check=False)
    assert p.returncode == -9
    with Store.open(tmp_backing, backend="pread", **GEOM) as st:
        assert st.meta(list(range(6))) == [b"m%d" % i * (i * 10) for i in range(6)]
        assert st.meta([99]) == [None]
        out = [np.zeros(65536, np.uint8) for _ in range(6)]
        assert st.load_prefix(list(range(6)), out) == 6
        assert all((out[i] == i).all() for i in range(6))


def test_bad_meta_is_refused_before_any_change(open_store: Callable[..., Store]) -> None:
    st = open_store()
    with pytest.raises(InvalidArgument, match=f"at most {MAX_META}"):
        st.put([1], [blk(1)], [bytes(MAX_META + 1)])
    with pytest.raises(InvalidArgument, match="not bytes"):
        st.put([1], [blk(1)], ["text"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="sequence of 2"):
        st.put([1, 2], [blk(1), blk(2)], [b"x"])
    with pytest.raises(InvalidArgument, match="sequence of 1"):
        st.put([1], [blk(1)], b"x")  # type: ignore[arg-type]
    assert st.contains([1, 2]) == [False, False] and len(st) == 0


# ---- entries by digest, flush_async


def test_entries_by_digest_and_by_engine_key(open_store: Callable[..., Store]) -> None:
    st = open_store(namespace=Namespace(model="m"))
    st.put([b"a", b"b"], [blk(1), blk(2, 4096)], [b"meta-a", None])
    digests = st.namespace.keys([b"a", b"x", b"b"])
    a, x, b = st.entries(digests)
    assert x is None and a is not None and b is not None
    assert (a["length"], a["meta"], a["state"]) == (256 << 10, b"meta-a", PENDING)
    assert (b["length"], b["meta"]) == (4096, b"")
    assert st.info(b"a") == a
    assert st.info(digests[:1]) == a  # a digest, not hashed again
    with pytest.raises(InvalidArgument, match="one key"):
        st.info(digests)
    # a digest array is not hashed again: engine keys and digests agree
    assert st.entries([b"a"]) == [a]
    assert st.entries(Namespace(model="other").keys([b"a"])) == [None]


def test_flush_async_returns_at_once_and_makes_durable(open_store: Callable[..., Store]) -> None:
    st = open_store()
    put = st.put_async([1, 2], [blk(1), blk(2)], [b"one", b"two"])
    with st.flush_async(timeout=30.0) as t:
        r, _, _ = select.select([t], [], [], 30.0)
        assert r == [t] and t.done()
        assert t.wait(0) is None
    assert put.wait(0) == [S, S]
    put.close()
    ents = st.entries([1, 2])
    assert all(e is not None and e["state"] == DURABLE for e in ents)
    assert st.stats().pending_entries == 0


def test_flush_async_on_a_closed_store_is_refused(open_store: Callable[..., Store]) -> None:
    st = open_store()
    st.close()
    with pytest.raises(chm.errors.Cancelled):
        st.flush_async()


# ---- journal versions


def _v1_journal(path: Path, capacity: int, segment: int, n: int) -> None:
    """A version-1 journal as the previous code wrote it: PUT records only."""
    recs = np.zeros(n, dtype=jn.REC_DTYPE)
    recs["type"] = jn.PUT
    recs["hi"] = np.arange(n) + 1
    recs["lo"] = 7
    recs["addr"] = np.arange(n) * 4096
    recs["length"] = 4096
    recs["checksum"] = 1
    recs["epoch"] = np.arange(n) + 1
    path.write_bytes(jn._header(capacity, segment, version=1) + jn._seal(recs))


def test_old_journal_opens_and_is_upgraded(
    tmp_backing: Path, make_device: Callable[..., chm.Device]
) -> None:
    with make_device("pread") as dev:
        seg = 8 * dev.slot_bytes
        j = tmp_backing / "old.kvjournal"
        _v1_journal(j, dev.capacity, seg, 5)
        with Store(dev, journal=j) as st:
            assert st.stats().recovered_entries == 5 and st.journal_upgraded_from == 1
            assert (
                st.meta(np.array([(i + 1, 7) for i in range(5)], dtype=chm.kv.KEY_DTYPE))
                == [b""] * 5
            )
            # rewritten as the current version before anything was appended
            assert np.frombuffer(j.read_bytes()[:64], jn.HDR_DTYPE)["version"][0] == jn.VERSION
            st.put([b"new"], [np.ones(4096, np.uint8)], [b"with meta"])
            st.flush()
        with Store(dev, journal=j) as st:
            assert st.stats().recovered_entries == 6 and st.journal_upgraded_from == 0
            assert st.meta([b"new"]) == [b"with meta"]


def test_newer_journal_is_refused_by_name(
    tmp_backing: Path, make_device: Callable[..., chm.Device]
) -> None:
    with make_device("pread") as dev:
        j = tmp_backing / "new.kvjournal"
        j.write_bytes(jn._header(dev.capacity, 8 * dev.slot_bytes, version=jn.VERSION + 1))
        with pytest.raises(InvalidArgument, match=f"journal version {jn.VERSION + 1}; this chm"):
            Store(dev, journal=j)
        assert j.read_bytes()[:8] == jn.MAGIC  # left as it was


def test_meta_record_in_a_v1_journal_ends_it(
    tmp_backing: Path, make_device: Callable[..., chm.Device]
) -> None:
    """Version 1 had no META type: such a record is where the log ends."""
    with make_device("pread") as dev:
        seg = 8 * dev.slot_bytes
        j = tmp_backing / "old.kvjournal"
        _v1_journal(j, dev.capacity, seg, 3)
        j.write_bytes(j.read_bytes() + jn._seal(jn.meta_records(1, 7, 1, b"x")))
        with Store(dev, journal=j) as st:
            assert st.stats().recovered_entries == 3 and st.stats().torn_journal_bytes == 64


# ---- lru mode and the ghost backend


def test_lru_mode_reads_through_the_cache(tmp_backing: Path) -> None:
    with Store.open(
        tmp_backing, backend="pread", mode="lru", capacity="256M", dram="8M", slot_size="1M"
    ) as st:
        assert st.read_path == "direct"
        keys = list(range(24))
        assert st.put(keys, [blk(k) for k in keys], [b"%d" % k for k in keys]) == [S] * 24
        st.flush()
        outs = [np.zeros(256 << 10, np.uint8) for _ in range(25)]
        assert st.load_prefix([*keys, 99], outs) == 24
        assert all(np.array_equal(outs[k], blk(k)) for k in keys)
        s = st.device.stats()
        assert s.prefetch_issued == 0  # no prefetches: hints would pin nothing
        assert s.lru_hits + s.lru_misses > 0
        assert st.get([3, 99], [outs[0], outs[1]]) == [True, False]
        assert st.meta([3]) == [b"3"]
        assert st.load_prefix(keys, outs, timeout=0) == 0
        assert st.stats().timeouts == 1
        assert st.stats().segments_pinned == 0


def test_lru_mode_corrupt_block_is_a_counted_miss(tmp_backing: Path) -> None:
    with Store.open(
        tmp_backing, backend="pread", mode="lru", capacity="256M", dram="8M", slot_size="1M"
    ) as st:
        st.put([1, 2, 3], [blk(1), blk(2), blk(3)])
        st.flush()
        e = st.info(2)
        assert e is not None
        assert st.device.write(e["addr"], np.zeros(4096, np.uint8)) is True  # behind its back
        outs = [np.zeros(256 << 10, np.uint8) for _ in range(3)]
        assert st.load_prefix([1, 2, 3], outs) == 1
        assert st.stats().checksum_errors == 1
        assert st.contains([2]) == [False]  # dropped: a miss from now on


def test_ghost_backend_runs_the_calls_without_data(tmp_backing: Path) -> None:
    with (
        chm.Device.open(backend="ghost", capacity="1G", dram="64M", slot_size="1M") as dev,
        Store(dev, journal=tmp_backing / "ghost.kvjournal") as st,
    ):
        assert st.read_path == "timing"
        assert st.put([1, 2], [blk(1), blk(2)]) == [S, S]
        st.flush()
        dsts = [np.zeros(256 << 10, np.uint8) for _ in range(3)]
        assert st.load_prefix([1, 2, 3], dsts) == 2
        assert not dsts[0].any()  # no bytes moved
        s = dev.stats()
        assert s.prefetch_issued == 2 and s.prefetch_released == 2


def test_journal_of_a_ghost_device_must_be_named() -> None:
    with (
        chm.Device.open(backend="ghost", capacity="1G", dram="64M", slot_size="1M") as dev,
        pytest.raises(InvalidArgument, match="pass journal=PATH"),
    ):
        Store(dev)


# ---- the periodic flusher

_PUT_THEN_DIE = """
import os, sys, time, numpy as np
from chm.kv import Store
interval = None if sys.argv[2] == "none" else float(sys.argv[2])
st = Store.open(sys.argv[1], backend="pread", capacity="64M", dram="16M", slot_size="1M",
                device_options={"wbuf": "4M"}, flush_interval=interval)
st.put([1, 2, 3], [np.full(65536, i, np.uint8) for i in (1, 2, 3)], [b"a", b"b", b"c"])
time.sleep(float(sys.argv[3]))
print(st.stats().autoflushes, flush=True)
os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize(("interval", "durable"), [("0.1", True), ("none", False)])
def test_flush_interval_makes_puts_durable(tmp_backing: Path, interval: str, durable: bool) -> None:
    """Put, never flush, kill -9 after 5 intervals: with a flush interval
    the blocks are found, without one they are not."""
    p = subprocess.run(
        [sys.executable, "-c", _PUT_THEN_DIE, str(tmp_backing), interval, "0.5"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == -9, p.stderr
    assert (int(p.stdout) >= 1) == durable
    with Store.open(tmp_backing, backend="pread", **GEOM) as st:
        assert st.contains([1, 2, 3]) == [durable] * 3
        if durable:
            assert st.meta([1, 2, 3]) == [b"a", b"b", b"c"]


@pytest.mark.parametrize("bad", [0, -1.0, True, "1", float("nan")])
def test_bad_flush_interval_is_refused(tmp_backing: Path, bad: Any) -> None:
    with pytest.raises(InvalidArgument, match="flush_interval"):
        Store.open(tmp_backing, backend="pread", flush_interval=bad, **GEOM)


def test_close_stops_the_flusher(open_store: Callable[..., Store]) -> None:
    st = open_store(flush_interval=0.05)
    st.put([1], [blk(1)])
    st.close()
    assert st._flusher is not None and not st._flusher.is_alive()
    assert st.stats().pending_entries == 0
