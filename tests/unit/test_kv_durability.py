"""The KV store's durability: a damaged journal, a lost journal, a geometry
change, a closed store, a full disk. Each test reproduces a way acknowledged
blocks were lost (or an error was unclear) and checks they no longer are."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chm.errors import Cancelled, Damaged, InvalidArgument, NoSpace
from chm.kv import PutStatus, Store
from chm.kv import journal as jn
from chm.kv.keys import KEY_DTYPE
from chm.kv.store import JournalDamageWarning

KiB, MiB = 1 << 10, 1 << 20
GEOM: dict[str, Any] = {
    "capacity": "64M",
    "dram": "16M",
    "slot_size": "64K",
    "device_options": {"wbuf": "4M"},
    "backend": "pread",
}
S = PutStatus.STORED


def blk(i: int, n: int = 16 * KiB) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


def fill(d: Path, n: int, **kw: Any) -> None:
    """n x (put one block + flush), then a close that does not compact."""
    st = Store.open(d, **{**GEOM, **kw})
    for i in range(n):
        assert st.put([i], [blk(i)]) == [S]
        st.flush()
    st.close(flush=False)


def journal_of(d: Path) -> Path:
    return d / "kv.img.kvjournal"


def all_back(st: Store, keys: list[int]) -> bool:
    out = [np.zeros(16 * KiB, np.uint8) for _ in keys]
    ok = st.get(keys, out)
    return all(ok) and all(np.array_equal(o, blk(k)) for o, k in zip(out, keys, strict=True))


# ---- 1. a damaged record in the middle


def test_a_flipped_bit_in_the_middle_costs_one_record_not_the_rest(tmp_backing: Path) -> None:
    fill(tmp_backing, 40)
    j = journal_of(tmp_backing)
    before = j.read_bytes()
    assert len(before) == 64 * 41  # the header and 40 PUT records
    damaged = bytearray(before)
    damaged[6 * 64 + 20] ^= 0x10  # a bit of the 6th record's key
    j.write_bytes(bytes(damaged))
    with pytest.warns(JournalDamageWarning, match="1 damaged journal records skipped"):
        st = Store.open(tmp_backing, **GEOM)
    with st:
        s = st.stats()
        assert s.entries == 39 and s.recovered_entries == 39
        assert s.journal_damaged_records == 1 and s.journal_missing_records == 0
        assert s.torn_journal_bytes == 0
        assert not st.contains([5])[0]  # the damaged record's block (on the device still)
        assert all_back(st, [k for k in range(40) if k != 5])
        # kept aside byte for byte; the live journal was rewritten, not truncated
        kept = Path(s.journal_kept_aside)
        assert kept.read_bytes() == bytes(damaged)
        assert len(j.read_bytes()) == 64 * 40
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten journal is clean: no warning
        with Store.open(tmp_backing, **GEOM) as st:
            assert st.stats().entries == 39 and st.stats().journal_damaged_records == 0


def test_a_lost_run_of_records_is_counted_by_sequence(tmp_backing: Path) -> None:
    """A sector of the journal zeroed (8 records): the gap is seen and counted."""
    fill(tmp_backing, 30)
    j = journal_of(tmp_backing)
    raw = bytearray(j.read_bytes())
    raw[512:1024] = bytes(512)
    j.write_bytes(bytes(raw))
    with pytest.warns(JournalDamageWarning), Store.open(tmp_backing, **GEOM) as st:
        s = st.stats()
        assert s.journal_damaged_records == 8 and s.entries == 22
        assert all_back(st, [k for k in range(30) if not 7 <= k < 15])


def test_a_torn_tail_is_cut_from_the_live_journal_but_kept(tmp_backing: Path) -> None:
    fill(tmp_backing, 5)
    j = journal_of(tmp_backing)
    torn = j.read_bytes() + b"\x01" * 40  # half a record: an append a crash cut short
    j.write_bytes(torn)
    with Store.open(tmp_backing, **GEOM) as st:
        s = st.stats()
        assert s.entries == 5 and s.torn_journal_bytes == 40
        assert s.journal_damaged_records == 0
        assert Path(s.journal_kept_aside).read_bytes() == torn


# ---- 2. an empty or missing journal beside a backing with blocks


@pytest.mark.parametrize("how", ["empty", "missing"])
def test_a_lost_journal_beside_blocks_is_an_error(tmp_backing: Path, how: str) -> None:
    fill(tmp_backing, 3)
    j = journal_of(tmp_backing)
    if how == "empty":
        j.write_bytes(b"")
    else:
        j.unlink()
    with pytest.raises(Damaged) as ei:
        Store.open(tmp_backing, **GEOM)
    msg = str(ei.value)
    assert str(j) in msg and str(tmp_backing / "kv.img") in msg
    assert f"chm-emu kv repair {tmp_backing / 'kv.img'}" in msg
    assert ei.value.errno == errno.EUCLEAN
    assert not j.exists() or j.stat().st_size == 0  # nothing was created over it


def test_a_new_store_on_a_fresh_backing_opens(tmp_backing: Path) -> None:
    with Store.open(tmp_backing, **GEOM) as st:
        assert st.stats().entries == 0


# ---- 4. a geometry that cannot hold what is stored


def test_reopening_with_smaller_slots_refuses_and_changes_nothing(tmp_backing: Path) -> None:
    seg: dict[str, Any] = {"segment_bytes": 512 * KiB}  # the same segment size both times
    st = Store.open(tmp_backing, **GEOM, **seg)
    assert st.put([1, 2], [blk(1, 64 * KiB), blk(2, 4 * KiB)]) == [S, S]
    st.close()
    j = journal_of(tmp_backing)
    before = j.read_bytes()
    with pytest.raises(InvalidArgument) as ei:
        Store.open(tmp_backing, **{**GEOM, "slot_size": "32K"}, **seg)
    msg = str(ei.value)
    assert "1 block longer than 32768 bytes (up to 65536)" in msg and "block_bytes=65536" in msg
    assert "slot_size=65536" in msg and "nothing was changed" in msg
    assert j.read_bytes() == before
    with Store.open(tmp_backing, **GEOM, **seg) as st:
        assert st.stats().recovery_dropped == 0 and len(st) == 2


# ---- 5. a closed store


def test_every_call_on_a_closed_store_is_cancelled(tmp_backing: Path) -> None:
    st = Store.open(tmp_backing, **GEOM)
    st.put([1], [blk(1)])
    st.close()
    calls: dict[str, Callable[[], object]] = {
        "compact": lambda: st.compact(),
        "flush": lambda: st.flush(),
        "put": lambda: st.put([2], [blk(2)]),
        "get": lambda: st.get([1], [np.zeros(16 * KiB, np.uint8)]),
        "remove": lambda: st.remove([1]),
        "contains": lambda: st.contains([1]),
        "prefix_len": lambda: st.prefix_len([1]),
        "lookup": lambda: st.lookup([1]),
        "pin": lambda: st.pin([1]),
        "unpin": lambda: st.unpin([1]),
        "entries": lambda: st.entries([1]),
        "meta": lambda: st.meta([1]),
        "info": lambda: st.info(1),
        "load_prefix": lambda: st.load_prefix([1], [np.zeros(16 * KiB, np.uint8)]),
    }
    for name, call in calls.items():
        with pytest.raises(Cancelled, match="closed"):
            call()
        assert name
    st.close()  # idempotent
    assert st.stats().entries == 1  # a snapshot still reads


# ---- 6. a full disk under the journal


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs: a real full filesystem (needs root and mount rights)."""
    d = tmp_path / "tiny"
    d.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(d)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_full_disk_leaves_no_partial_record(tmp_backing: Path, tiny_fs: Path) -> None:
    j = tiny_fs / "kv.kvjournal"
    dev_dir = tmp_backing / "dev"
    st = Store.open(dev_dir, journal=j, **GEOM)
    acked: list[int] = []
    err: NoSpace | None = None
    key = 0
    with contextlib.ExitStack() as stack:
        stack.callback(st.close, flush=False)
        for _ in range(200):
            # 4 records a flush: the 16 KiB (a header and 255 records) fills
            # in the middle of an append, which the file system cuts short
            batch = list(range(key, key + 4))
            key += 4
            assert st.put(batch, [blk(k) for k in batch]) == [S] * 4
            try:
                st.flush()
            except NoSpace as exc:
                err = exc
                break
            acked += batch
        assert err is not None, "the 16 KiB filesystem never filled"
        assert str(j) in str(err) and "free on its filesystem" in str(err)
        assert err.filename == str(j)
        assert j.stat().st_size == 64 * (1 + len(acked))  # nothing of the failed append
        s = st.stats()
        assert s.pending_entries == 4 and s.durable_entries == len(acked)
        assert all_back(st, acked[-5:] + batch)  # still consistent and readable
    with Store.open(dev_dir, journal=j, **GEOM) as st2:
        s2 = st2.stats()
        assert s2.entries == len(acked) and s2.journal_damaged_records == 0
        assert s2.torn_journal_bytes == 0
        assert all_back(st2, acked)
        st2.close(flush=False)


def test_an_old_version_journal_keeps_its_meta(tmp_backing: Path) -> None:
    """A version-2 journal (28 metadata bytes a META record) upgrades to 3."""
    st = Store.open(tmp_backing, **GEOM)
    hdr = jn.read_header(journal_of(tmp_backing).read_bytes()[:64], "j")
    cap, seg = hdr.capacity, hdr.segment_bytes
    st.close()
    recs = np.zeros(1, dtype=jn.V2_REC_DTYPE)
    recs["type"], recs["hi"], recs["lo"] = jn.PUT, 9, 9
    recs["addr"], recs["length"], recs["checksum"], recs["epoch"] = 0, 4096, 1, 3
    meta = np.zeros(2, dtype=jn.V2_META_DTYPE)
    meta["type"], meta["part"], meta["total"] = jn.META, [0, 1], 40
    meta["hi"], meta["lo"], meta["epoch"] = 9, 9, 3
    text = bytes(range(40)) + bytes(16)
    meta["data"] = [text[:28], text[28:56]]
    body = jn._seal(meta.view(jn.V2_REC_DTYPE)) + jn._seal(recs)
    journal_of(tmp_backing).write_bytes(jn._header(cap, seg, version=2) + body)
    with Store.open(tmp_backing, **GEOM) as st:
        assert st.journal_upgraded_from == 2
        ent = st.entries(np.array([(9, 9)], dtype=KEY_DTYPE))[0]
        assert ent is not None and ent["meta"] == bytes(range(40))


def test_a_segment_of_exactly_one_block_stores_without_headers(tmp_backing: Path) -> None:
    """No room for a header (exact block LRU, as a replay's tier uses): the
    store still takes full-slot blocks, one a segment."""
    with Store.open(tmp_backing, **{**GEOM, "segment_bytes": 64 * KiB}) as st:
        assert not st.block_headers
        assert st.put([1, 2], [blk(1, 64 * KiB), blk(2, 64 * KiB)]) == [S, S]
        ents = st.entries([1, 2])
        assert [e["addr"] for e in ents if e is not None] == [0, 64 * KiB]


# ---- the store is not locked while the journal syncs


def test_puts_loads_and_removes_go_on_while_a_flush_syncs(tmp_backing: Path) -> None:
    """The journal's fdatasync is held open (the real sync, then a wait on
    an event) to catch the store in it: other calls must not wait for it,
    and a remove meanwhile must still reach the journal."""
    import threading

    st = Store.open(tmp_backing, **GEOM)
    j = st._journal
    real_sync = j.sync
    in_sync, release = threading.Event(), threading.Event()

    def held_sync() -> None:
        real_sync()
        in_sync.set()
        assert release.wait(30)

    assert st.put([1, 2], [blk(1), blk(2)]) == [S, S]
    j.sync = held_sync  # type: ignore[method-assign]
    t = threading.Thread(target=st.flush)
    t.start()
    try:
        assert in_sync.wait(10)
        # the flush is inside fdatasync: the store answers at once, not
        # after the 30 s the sync may be held
        t0 = time.monotonic()
        assert st.put([3], [blk(3)]) == [S]
        assert st.contains([1, 2, 3]) == [True, True, True]
        assert all_back(st, [1, 3])
        assert st.remove([2]) == [True]  # its PUT is being synced: DEL journaled
        assert time.monotonic() - t0 < 15
        assert t.is_alive()  # still in the sync
    finally:
        release.set()
        t.join(10)
    j.sync = real_sync  # type: ignore[method-assign]
    assert st.stats().durable_entries == 1 and st.stats().pending_entries == 1
    st.flush()
    st.close(flush=False)
    with Store.open(tmp_backing, **GEOM) as st2:
        assert st2.contains([1, 2, 3]) == [True, False, True]


def test_concurrent_puts_flushes_removes_and_compactions_lose_nothing(tmp_backing: Path) -> None:
    """Four threads for about a second (and at least 20 flushes a writer):
    every block whose flush returned and that was not removed is there after
    a reopen, and no removed one is."""
    import threading

    st = Store.open(tmp_backing, **{**GEOM, "capacity": "256M"})
    acked: set[int] = set()
    removed: set[int] = set()
    guard = threading.Lock()
    stop = time.monotonic() + 1.0
    errors: list[BaseException] = []

    def writer(base: int) -> None:
        k = base
        # at least 20 flushes, at most 2,000 blocks (a tenth of the capacity)
        while (time.monotonic() < stop or k < base + 40) and k < base + 2000:
            keys = [k, k + 1]
            k += 2
            assert st.put(keys, [blk(x) for x in keys]) == [S, S]
            st.flush()
            with guard:
                acked.update(keys)

    done = threading.Event()

    def remover() -> None:
        while not done.is_set():
            with guard:
                pick = sorted(acked - removed)[:1]
            if pick and st.remove(pick) == [True]:
                with guard:
                    removed.update(pick)

    def compactor() -> None:
        while not done.is_set():
            st.compact()
            time.sleep(0.01)

    def run(fn: Callable[..., None], *a: int) -> None:
        try:
            fn(*a)
        except BaseException as exc:  # reported below
            errors.append(exc)

    ts = [
        threading.Thread(target=run, args=(writer, 0)),
        threading.Thread(target=run, args=(writer, 1_000_000)),
        threading.Thread(target=run, args=(remover,)),
        threading.Thread(target=run, args=(compactor,)),
    ]
    for t in ts:
        t.start()
    for t in ts[:2]:
        t.join(60)
    time.sleep(0.05)  # a last remove and compaction after the writers
    done.set()
    for t in ts[2:]:
        t.join(30)
    assert not errors, errors
    st.close()
    assert len(acked) > 20 and removed
    with Store.open(tmp_backing, **{**GEOM, "capacity": "256M"}) as st2:
        keep = sorted(acked - removed)
        assert st2.contains(keep) == [True] * len(keep)
        assert not any(st2.contains(sorted(removed)))
        assert all_back(st2, keep[:50])


def test_no_room_to_keep_a_damaged_journal_aside_is_nospace(
    tmp_backing: Path, tiny_fs: Path
) -> None:
    j = tiny_fs / "kv.kvjournal"
    st = Store.open(tmp_backing, journal=j, **GEOM)
    for i in range(20):
        st.put([i], [blk(i)])
        st.flush()
    st.close(flush=False)
    raw = bytearray(j.read_bytes())
    raw[3 * 64 + 20] ^= 1
    j.write_bytes(bytes(raw))
    filler = tiny_fs / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        f.write(bytes(64 * KiB))  # the rest of the 16 KiB
    with pytest.raises(NoSpace, match="keep the damaged journal aside") as ei:
        Store.open(tmp_backing, journal=j, **GEOM)
    assert ei.value.filename == str(j)
    assert j.read_bytes() == bytes(raw)  # left as it was
    assert not list(tiny_fs.glob("*.damaged-*"))  # no partial copy either
    filler.unlink()
    with pytest.warns(JournalDamageWarning), Store.open(tmp_backing, journal=j, **GEOM) as st2:
        assert len(st2) == 19
        st2.close(flush=False)


def test_a_compaction_writes_its_file_with_the_store_unlocked(tmp_backing: Path) -> None:
    """The new journal's write is held open (the real write, then a wait
    on an event): puts, flushes and removes meanwhile do not wait, and the
    records they append are carried into the compacted file."""
    import threading

    st = Store.open(tmp_backing, **GEOM)
    assert st.put([1, 2], [blk(1), blk(2)]) == [S, S]
    st.flush()
    j = st._journal
    real_write = j.compact_write
    in_write, release = threading.Event(), threading.Event()

    def held_write(live: Any) -> str:
        tmp = real_write(live)
        in_write.set()
        assert release.wait(30)
        return tmp

    j.compact_write = held_write  # type: ignore[method-assign]
    t = threading.Thread(target=st.compact)
    t.start()
    try:
        assert in_write.wait(10)
        t0 = time.monotonic()
        assert st.put([3], [blk(3)]) == [S]
        st.flush()
        assert st.remove([1]) == [True]
        assert time.monotonic() - t0 < 15 and t.is_alive()
    finally:
        release.set()
        t.join(10)
    j.compact_write = real_write  # type: ignore[method-assign]
    assert st.stats().compactions == 1
    st.close(flush=False)  # no flush, no compaction: the file as the compaction left it
    with Store.open(tmp_backing, **GEOM) as st2:
        assert st2.contains([1, 2, 3]) == [False, True, True]
        assert all_back(st2, [2, 3])


def test_a_put_whose_meta_record_is_damaged_is_dropped_not_given_other_meta(
    tmp_backing: Path,
) -> None:
    st = Store.open(tmp_backing, **GEOM)
    long_meta = bytes(range(60))  # three META records, then the PUT
    for i in range(4):
        st.put([i], [blk(i)], [long_meta])
        st.flush()
    st.close(flush=False)
    j = journal_of(tmp_backing)
    raw = bytearray(j.read_bytes())
    raw[(1 + 4 * 2 + 1) * 64 + 40] ^= 1  # key 2: its second META record
    j.write_bytes(bytes(raw))
    with pytest.warns(JournalDamageWarning), Store.open(tmp_backing, **GEOM) as st2:
        assert st2.stats().journal_damaged_records == 2  # the META record and its PUT
        assert st2.contains([0, 1, 2, 3]) == [True, True, False, True]
        assert st2.meta([0, 1, 3]) == [long_meta] * 3
