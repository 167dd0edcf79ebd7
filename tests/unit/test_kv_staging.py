"""The host staging queue (chm.kv.staging) over a real Store on a real file.

A burst larger than the device's write buffer is what an LMCache store call
of 8 chunks of 16 MiB is; without the queue the store skips its tail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chm.errors import Cancelled, InvalidArgument
from chm.kv import PutStatus, Store
from chm.kv.staging import StagingQueue

MIB = 1 << 20


def _blocks(n: int, size: int, seed: int = 0) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]


@pytest.fixture
def store(make_store: Callable[..., Store], tmp_backing: Path) -> Store:
    # SSD writes modeled at 200 MB/s (real clock): the device's flusher frees
    # the write buffer in tenths of a second, never within one burst's copy,
    # so the store alone skips the burst's tail on any disk and any load
    return make_store(
        tmp_backing / "kv",
        capacity="1G",
        dram="160M",
        slot_size="16M",
        device_options={"ssd_write_bw_bps": 200_000_000},
    )


def _keys(base: int, n: int) -> list[str]:
    return [f"{base + i:04x}" for i in range(n)]


def test_burst_larger_than_the_write_buffer_is_stored_whole(store: Store) -> None:
    blocks = _blocks(8, 8 * MIB)
    assert store.device.config.wbuf_bytes < 8 * 8 * MIB
    direct = store.put(_keys(0, 8), blocks)
    assert PutStatus.SKIPPED in direct  # what the store alone does with the burst
    q = StagingQueue(store, "256M")
    try:
        with q.submit(_keys(100, 8), blocks) as t:
            got = t.wait(60)
        assert got == [PutStatus.STORED] * 8
        s = q.stats()
        assert s.stored_blocks == 8 and s.skipped == 0 and s.queued_bytes == 0
        assert s.peak_queued_bytes == 64 * MIB
        assert s.retries > 0  # the queue offered the refused tail again
    finally:
        q.close()
    outs = [np.empty(8 * MIB, np.uint8) for _ in range(8)]
    assert store.get(_keys(100, 8), outs, 30) == [True] * 8
    for a, b in zip(outs, blocks, strict=True):
        assert np.array_equal(a, b)


def test_full_queue_skips_the_suffix_counts_and_warns_once(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    q = StagingQueue(store, "40M", warn_every_s=3600)
    blocks = _blocks(8, 8 * MIB, 1)
    try:
        with caplog.at_level(logging.WARNING, logger="chm.kv.staging"):
            t1 = q.submit(_keys(0, 8), blocks)
            t2 = q.submit(_keys(50, 8), blocks)
            r1, r2 = t1.wait(60), t2.wait(60)
        assert r1[:5] == [PutStatus.STORED] * 5  # the prefix that fit 40 MiB
        assert PutStatus.SKIPPED in r1[5:]
        assert r2.count(PutStatus.SKIPPED) >= 1
        skipped = r1.count(PutStatus.SKIPPED) + r2.count(PutStatus.SKIPPED)
        s = q.stats()
        assert s.skipped_full == skipped and s.skipped == skipped
        assert s.stored_blocks == 16 - skipped
        lines = [r for r in caplog.records if "not stored" in r.getMessage()]
        assert len(lines) == 1  # rate-limited
        assert "staging queue is full" in lines[0].getMessage()
    finally:
        q.close()
    assert store.contains(_keys(0, 5)) == [True] * 5


def test_store_that_keeps_refusing_times_out(tmp_backing: Path) -> None:
    # two segments full of pinned blocks: a new block has no room anywhere
    st = Store.open(
        tmp_backing / "kv1",
        capacity="64M",
        dram="160M",
        slot_size="16M",
        backend="pread",
        segment_bytes=32 * MIB,
    )
    try:
        q = StagingQueue(st, "64M", max_wait_s=0.3)
        got: list[PutStatus] = []
        for i in range(8):  # fill the store with pinned blocks until one finds no room
            got = q.put(_keys(0x100 + i, 1), _blocks(1, 15 * MIB, i))
            if got != [PutStatus.STORED]:
                break
            assert st.pin(_keys(0x100 + i, 1)) == [True]
        assert got == [PutStatus.SKIPPED]
        s = q.stats()
        assert s.skipped_timeout == 1 and s.skipped_full == 0
        assert s.queued_bytes == 0 and s.retries > 0
        q.close()
    finally:
        st.close()


def test_copy_lets_the_caller_reuse_its_buffer(store: Store) -> None:
    q = StagingQueue(store, "256M")
    try:
        blocks = _blocks(6, 8 * MIB, 4)
        want = [b.copy() for b in blocks]
        t = q.submit(_keys(0x200, 6), blocks, copy=True)
        for b in blocks:
            b[:] = 0
        assert t.wait(60) == [PutStatus.STORED] * 6
    finally:
        q.close()
    outs = [np.empty(8 * MIB, np.uint8) for _ in range(6)]
    assert store.get(_keys(0x200, 6), outs, 30) == [True] * 6
    assert all(np.array_equal(a, b) for a, b in zip(outs, want, strict=True))


def test_bad_input(store: Store) -> None:
    with pytest.raises(InvalidArgument, match="smaller than one block"):
        StagingQueue(store, "1M")
    q = StagingQueue(store, "32M")
    with pytest.raises(InvalidArgument, match="2 keys but 1 sources"):
        q.submit(_keys(0, 2), _blocks(1, 4096))
    with pytest.raises(InvalidArgument, match="staging capacity"):
        q.submit(_keys(0, 1), _blocks(1, 33 * MIB))
    with pytest.raises(InvalidArgument, match="staging capacity"):
        q.submit(_keys(0, 1), [np.empty(0, np.uint8)])
    assert q.stats().submitted_blocks == 0
    q.close()
    with pytest.raises(Cancelled):
        q.submit(_keys(0, 1), _blocks(1, 4096))
    with pytest.raises(InvalidArgument):
        StagingQueue(store, 0)


def test_flusher_makes_puts_durable(tmp_backing: Path) -> None:
    st = Store.open(
        tmp_backing / "kv2", capacity="1G", dram="160M", slot_size="16M", backend="pread"
    )
    q = StagingQueue(st, "64M", flush_interval=0.05)
    try:
        q.put(_keys(0, 2), _blocks(2, MIB, 5))
        deadline = time.monotonic() + 10
        while st.stats().pending_entries and time.monotonic() < deadline:
            time.sleep(0.01)
        assert st.stats().pending_entries == 0
        assert q.stats().flushes >= 1
    finally:
        q.close()
        st.close()


def test_reports_follow_the_counters_and_a_failing_report_stops_nothing(store: Store) -> None:
    """``report`` gets the counters soon after a skip, again when they change,
    once more at close; a report that raises never touches the puts."""
    seen: list[Any] = []
    fail = [True]

    def report(st: Any) -> None:
        if fail[0]:
            fail[0] = False
            raise ConnectionError("the daemon is gone")
        seen.append(st)

    q = StagingQueue(store, "32M", report=report, report_every_s=0.1)
    try:
        got = q.submit(_keys(300, 3), _blocks(3, 16 * MIB)).wait(60)
        assert got.count(PutStatus.SKIPPED) == 1  # the third does not fit 32M
        assert q.put(_keys(310, 1), _blocks(1, MIB)) == [PutStatus.STORED]
        end = time.monotonic() + 10
        while time.monotonic() < end and not (seen and seen[-1] == q.stats()):
            time.sleep(0.02)
        assert seen and seen[-1] == q.stats()  # the first attempt failed; later ones went
        assert seen[-1].skipped_full == 1 and seen[-1].stored_blocks == 3
        n = len(seen)
        time.sleep(0.3)
        assert len(seen) == n  # nothing changed: nothing sent
    finally:
        q.close()
    assert seen[-1] == q.stats()
    with pytest.raises(InvalidArgument, match="report_every_s"):
        StagingQueue(store, "32M", report=report, report_every_s=0)
