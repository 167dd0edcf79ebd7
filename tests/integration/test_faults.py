"""Fault injection: a failed backend I/O fails exactly the operation it hit,
is reported with the right exception, and never costs data or slots.

Faults are one-shot (``eio_read``, ``eio_write``, ``short_read`` fire on the
nth backend I/O of their kind from now, then disarm) or standing (``slow``,
until ``none``). Data is checked against a known image written into the
backing file before the device opens; durability is checked by reading the
backing file through a separate, ordinary O_RDONLY descriptor.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import chm
from chm.errors import DeviceIOError, InvalidArgument, WaitTimeout
from chm.testing.model import initial_image

KiB = 1024
MiB = 1024 * KiB
CAPACITY = 8 * MiB
SLOT = 64 * KiB

# Small slots so several fit; a queue so that refills are exercised.
PREFETCH: dict[str, Any] = {
    "capacity": CAPACITY,
    "dram": 4 * (SLOT + 4 * KiB) + 256 * KiB,
    "wbuf": 256 * KiB,
    "slot_size": SLOT,
    "slots": 4,
    "refill_queue": 4,
}
LRU: dict[str, Any] = {
    "capacity": CAPACITY,
    "mode": "lru",
    "dram": 4 * 16 * KiB,  # four lines: every sweep evicts
    "lru_line": 16 * KiB,
    "slot_size": SLOT,
    "slots": 2,
    "refill_queue": 2,
}


@pytest.fixture
def image_dev(
    tmp_backing: Path, make_device: Callable[..., chm.Device]
) -> Callable[..., tuple[chm.Device, bytearray, Path]]:
    """Opens a device over a backing file holding a known image."""
    counter = iter(range(1000))

    def make(backend: str, **options: Any) -> tuple[chm.Device, bytearray, Path]:
        path = tmp_backing / f"img{next(counter)}.img"
        image = initial_image(CAPACITY, seed=7)
        path.write_bytes(image)
        kw = dict(PREFETCH)
        kw.update(options)
        return make_device(backend, targets=[path], **kw), image, path

    return make


def backing_bytes(path: Path, addr: int, length: int) -> bytes:
    """Reads the backing file with a separate, ordinary (buffered) descriptor."""
    with open(path, "rb", buffering=0) as f:
        f.seek(addr)
        return f.read(length)


def settle(dev: chm.Device, timeout: float = 10.0) -> chm.Stats:
    deadline = time.monotonic() + timeout
    while True:
        s = dev.stats()
        if s.slots_filling == 0:
            return s
        assert time.monotonic() < deadline, f"fills still in flight: {s.slots_filling}"
        time.sleep(0.001)


def accounting_sums(s: chm.Stats) -> None:
    assert s.slots_free + s.slots_filling + s.slots_ready + s.slots_held + s.slots_failed == (
        s.slots_total
    )
    assert s.prefetch_issued == (
        s.prefetch_completed
        + s.prefetch_failed
        + s.prefetch_cancelled
        + s.queue_len
        + s.slots_filling
    ), s


# ---------------------------------------------------------------- prefetch


@pytest.mark.parametrize("kind", ["eio_read", "short_read"])
def test_failed_fill_reports_eio_and_device_keeps_serving(
    data_backend: str, image_dev: Any, kind: str
) -> None:
    dev, image, _ = image_dev(data_backend)
    dev.inject_fault(kind, nth=1)
    bad = dev.prefetch(100 * KiB, 40 * KiB)
    with pytest.raises(DeviceIOError):
        bad.wait(5)
    # FAILED stays FAILED until released; waiting again says the same
    with pytest.raises(DeviceIOError):
        bad.wait(0)
    s = settle(dev)
    assert (s.slots_failed, s.prefetch_failed, s.prefetch_completed) == (1, 1, 0)
    accounting_sums(s)
    bad.release()
    s = dev.stats()
    assert (s.slots_failed, s.slots_free) == (0, s.slots_total)
    # one-shot: the same range stages fine now, with the right bytes
    for addr, length in [(100 * KiB, 40 * KiB), (3 * MiB + 123, SLOT)]:
        with dev.prefetch(addr, length) as h:
            assert h.wait(5) == image[addr : addr + length]
    assert dev.stats().prefetch_failed == 1


def test_only_the_nth_fill_fails(data_backend: str, image_dev: Any) -> None:
    dev, image, _ = image_dev(data_backend)
    dev.inject_fault("eio_read", nth=3)
    objs = [(i * SLOT, SLOT) for i in range(4)]
    handles = []
    for addr, length in objs:
        handles.append(dev.prefetch(addr, length))
        settle(dev)  # fills complete in issue order
    outcomes = []
    for (addr, length), h in zip(objs, handles, strict=True):
        try:
            assert h.wait(5) == image[addr : addr + length]
            outcomes.append("ok")
        except DeviceIOError:
            outcomes.append("eio")
    assert outcomes == ["ok", "ok", "eio", "ok"]
    for h in handles:
        h.release()
    s = dev.stats()
    assert (s.prefetch_failed, s.prefetch_completed, s.slots_free) == (1, 3, s.slots_total)


def test_failed_fill_frees_its_slot_for_the_queue(data_backend: str, image_dev: Any) -> None:
    """A FAILED slot released hands its slot to the queue head like any other."""
    dev, image, _ = image_dev(data_backend, slots=1, refill_queue=2)
    dev.inject_fault("eio_read", nth=1)
    bad = dev.prefetch(0, SLOT)
    q1 = dev.prefetch(SLOT, SLOT)
    q2 = dev.prefetch(2 * SLOT, SLOT)
    with pytest.raises(DeviceIOError):
        bad.wait(5)
    with pytest.raises(WaitTimeout):
        q1.wait(0)
    bad.release()
    assert q1.wait(5) == image[SLOT : 2 * SLOT]
    with pytest.raises(WaitTimeout):
        q2.wait(0)
    q1.release()
    assert q2.wait(5) == image[2 * SLOT : 3 * SLOT]
    q2.release()
    accounting_sums(settle(dev))


def test_read_miss_eio_then_ok(data_backend: str, image_dev: Any) -> None:
    dev, image, _ = image_dev(data_backend)
    dev.inject_fault("eio_read", nth=1)
    with pytest.raises(DeviceIOError):
        dev.read(5000, 3000)
    assert dev.read(5000, 3000) == image[5000:8000]


def test_slow_fill_times_out_then_completes(data_backend: str, image_dev: Any) -> None:
    dev, image, _ = image_dev(data_backend)
    dev.inject_fault("slow", arg=300_000_000)  # every I/O 300 ms late
    t0 = time.monotonic()
    h = dev.prefetch(12345, 20000)
    with pytest.raises(WaitTimeout):
        h.wait(0.05)
    assert h.wait(10) == image[12345 : 12345 + 20000]
    assert time.monotonic() - t0 >= 0.25
    h.release()
    dev.inject_fault("none")
    t0 = time.monotonic()
    with dev.prefetch(0, 4096) as h2:
        h2.wait(5)
    assert time.monotonic() - t0 < 0.25, "the slow fault did not clear"


def test_failed_orphan_fill_is_counted_once(tmp_backing: Path, make_device: Any) -> None:
    """A fill released while in flight (orphaned) that then fails: the request
    is counted once, as cancelled (it never reaches FAILED), so the counters
    still sum: issued == completed + failed + cancelled + queued."""
    dev = make_device("pread", queue_depth=1, **PREFETCH)  # one worker: I/Os in order
    dev.inject_fault("slow", arg=400_000_000)
    first = dev.prefetch(0, SLOT)  # occupies the only worker for 400 ms
    time.sleep(0.05)
    second = dev.prefetch(SLOT, SLOT)  # its read waits behind the first
    dev.inject_fault("eio_read", nth=1)  # replaces slow: the second read fails
    second.release()  # orphaned while its fill is in flight
    first.wait(5)
    first.release()
    s = settle(dev)
    assert s.prefetch_cancelled == 1, s
    assert s.slots_free == s.slots_total
    assert s.prefetch_issued == (
        s.prefetch_completed + s.prefetch_failed + s.prefetch_cancelled + s.queue_len
    ), (
        f"issued {s.prefetch_issued} != completed {s.prefetch_completed} + failed "
        f"{s.prefetch_failed} + cancelled {s.prefetch_cancelled}: the orphaned fill that "
        "failed is counted twice"
    )


def test_lru_hint_fill_eio(data_backend: str, image_dev: Any) -> None:
    dev, image, _ = image_dev(data_backend, **LRU)
    dev.inject_fault("eio_read", nth=1)
    h = dev.prefetch(0, 20000)
    with pytest.raises(DeviceIOError):
        h.wait(5)
    h.release()
    with dev.prefetch(0, 20000) as h2:
        assert h2.wait(5) == image[0:20000]
    assert dev.read(7, 50000) == image[7:50007]


def test_fault_arguments(image_dev: Any) -> None:
    dev, _, _ = image_dev("pread")
    with pytest.raises(InvalidArgument):
        dev.inject_fault("eio_read", nth=0)
    with pytest.raises(InvalidArgument):
        dev.inject_fault("no_such_fault")
    with pytest.raises(InvalidArgument):
        dev.inject_fault(99)


# ---------------------------------------------------------------- write buffer


def test_flush_eio_not_durable_then_recovers(data_backend: str, image_dev: Any) -> None:
    """W4: an EIO while flushing fails the flush barrier (the writes are not
    durable); the entries stay buffered and readable, a later flush succeeds
    and the backing file holds the bytes.

    The flusher may hit the fault before flush() is called (then it has
    retried by the time flush waits, and flush legally succeeds), so the
    scenario repeats until flush itself saw the error; both outcomes are
    checked every time."""
    dev, image, path = image_dev(data_backend)
    saw_eio = 0
    for attempt in range(20):
        addr = (attempt * 8 + 16) * 4096
        data = bytes([attempt + 1]) * 8192 + bytes([0xA5]) * 4096
        dev.flush(10)
        dev.inject_fault("eio_write", nth=1)
        assert dev.write(addr, data)
        try:
            dev.flush(10)
            failed = False
        except DeviceIOError:
            failed = True
        # read-your-writes holds either way: nothing was lost or rolled back
        assert dev.read(addr, len(data)) == data
        saw_eio += failed
        dev.flush(10)  # the fault fired once; the retry makes it durable
        s = dev.stats()
        assert s.wr_flushed_bytes == s.wr_admitted_bytes
        assert backing_bytes(path, addr, len(data)) == data
        image[addr : addr + len(data)] = data
        if saw_eio >= 2:
            break
    assert saw_eio, "flush never observed the injected write error in 20 tries"
    assert dev.read(0, 1 * MiB) == image[: 1 * MiB]


def test_flush_eio_in_second_entry_of_a_batch(data_backend: str, image_dev: Any) -> None:
    """The second flushed write fails (alone, or inside a batch with its
    neighbours): its batch goes back to ADMITTED, nothing is lost, every
    entry ends up durable and nothing around them changes."""
    dev, image, path = image_dev(data_backend)
    for attempt in range(10):
        base = (64 + attempt * 16) * 4096
        objs = [(base + i * 8192, bytes([0x10 + attempt, i]) * 4096) for i in range(4)]
        dev.inject_fault("eio_write", nth=2)
        for addr, data in objs:
            assert dev.write(addr, data)
        with contextlib.suppress(DeviceIOError):
            dev.flush(10)  # the batch failed, or the retry won the race
        for addr, data in objs:
            assert dev.read(addr, len(data)) == data
        dev.flush(10)
        for addr, data in objs:
            assert backing_bytes(path, addr, len(data)) == data
            image[addr : addr + len(data)] = data
    dev.inject_fault("none")
    assert dev.read(0, 2 * MiB) == image[: 2 * MiB]
    assert backing_bytes(path, 0, 2 * MiB) == image[: 2 * MiB]


# ---------------------------------------------------------------- lru / direct


def test_lru_writeback_eio_never_loses_dirty_data(data_backend: str, image_dev: Any) -> None:
    """Write-back errors (eager or on eviction) leave lines DIRTY and retried:
    every written byte stays readable and ends up in the backing file."""
    dev, image, path = image_dev(data_backend, **LRU)
    line = LRU["lru_line"]
    for round_ in range(6):
        dev.inject_fault("eio_write", nth=1 + round_ % 3)
        for i in range(3):
            addr = (round_ * 5 + i) * line + 512 * round_
            data = bytes([round_ * 16 + i + 1]) * (line // 2)
            assert dev.write(addr, data)
            image[addr : addr + len(data)] = data
        # a sweep over other lines evicts the dirty ones (4-line cache)
        for j in range(8):
            a = 4 * MiB + j * line
            assert dev.read(a, line) == image[a : a + line]
        assert dev.read(0, 40 * line) == image[: 40 * line], "dirty data lost"
    with contextlib.suppress(DeviceIOError):
        dev.flush(10)  # a write-back failed while flushing: retried, flush again
    dev.inject_fault("none")
    dev.flush(10)
    s = dev.stats()
    assert s.lru_lines_dirty == 0
    assert backing_bytes(path, 0, 40 * line) == image[: 40 * line]


def test_direct_write_eio_then_ok(data_backend: str, image_dev: Any) -> None:
    dev, image, path = image_dev(data_backend, mode="direct")
    dev.inject_fault("eio_write", nth=1)
    with pytest.raises(DeviceIOError):
        dev.write(8192, b"\x11" * 4096)
    assert dev.write(8192, b"\x22" * 4096)
    dev.flush(10)
    assert dev.read(8192, 4096) == b"\x22" * 4096
    assert backing_bytes(path, 8192, 4096) == b"\x22" * 4096
    dev.inject_fault("eio_read", nth=1)
    with pytest.raises(DeviceIOError):
        dev.read(0, 100)
    assert dev.read(0, 100) == image[:100]


def test_close_with_failing_flush_does_not_hang(data_backend: str, image_dev: Any) -> None:
    """close() flushes best effort: a write error during that flush is
    retried, and close returns."""
    dev, _, path = image_dev(data_backend)
    dev.inject_fault("eio_write", nth=1)
    assert dev.write(0, b"\x77" * 4096)
    t = threading.Thread(target=dev.close)
    t.start()
    t.join(30)
    assert not t.is_alive(), "close() hung on a failing flush"
    assert backing_bytes(path, 0, 4096) == b"\x77" * 4096
