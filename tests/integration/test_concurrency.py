"""Many threads on one device: no lost slots, no lost writes, no crash.

Worker threads issue, wait on and release prefetches (some released
unwaited, racing their fills), read, write and flush at once. Afterwards the
window must be whole again (every slot FREE, the queue empty, the counters
summing) and the write buffer must drain to the backing file. Closing the
device while threads are blocked in wait() must wake them with Cancelled.

Each writer owns a region and knows what it last wrote there (its writes
may be skipped: it knows that too); every thread reads and stages objects
from a read-only region whose bytes are known from the start.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import chm
from chm.errors import DeviceIOError, WouldBlock
from chm.testing.model import initial_image

KiB = 1024
MiB = 1024 * KiB
CAPACITY = 16 * MiB
SLOT = 64 * KiB
OPTIONS: dict[str, Any] = {
    "capacity": CAPACITY,
    "dram": 4 * (SLOT + 4 * KiB) + 256 * KiB,
    "wbuf": 256 * KiB,  # four 64 KiB writes: writers get skipped
    "slot_size": SLOT,
    "slots": 4,
    "refill_queue": 6,
}
READONLY = (0, 8 * MiB)  # staged and read by everyone, never written
WRITE_BASE = 8 * MiB  # thread i writes [WRITE_BASE + i * REGION, +REGION)
REGION = 1 * MiB
NTHREADS = 4


def _settle(dev: chm.Device, timeout: float = 20.0) -> chm.Stats:
    deadline = time.monotonic() + timeout
    while True:
        s = dev.stats()
        if s.slots_filling == 0:
            return s
        assert time.monotonic() < deadline, f"fills in flight after {timeout}s: {s}"
        time.sleep(0.001)


@pytest.fixture
def image_device(
    tmp_backing: Path, make_device: Callable[..., chm.Device]
) -> Callable[..., tuple[chm.Device, bytearray, Path]]:
    def make(backend: str, **options: Any) -> tuple[chm.Device, bytearray, Path]:
        path = tmp_backing / f"{backend}.img"
        image = initial_image(CAPACITY, seed=11)
        path.write_bytes(image)
        kw = dict(OPTIONS)
        kw.update(options)
        return make_device(backend, targets=[path], **kw), image, path

    return make


class Worker(threading.Thread):
    """One thread of mixed traffic; records what it did and any failure."""

    def __init__(self, dev: chm.Device, image: bytearray, idx: int, iters: int) -> None:
        super().__init__(name=f"chm-worker-{idx}", daemon=True)
        self.dev, self.image, self.idx, self.iters = dev, image, idx, iters
        self.rng = random.Random(1000 + idx)
        self.issued = self.released = self.rejected = 0
        self.admitted = self.skipped = 0
        self.region = bytearray(image[WRITE_BASE + idx * REGION : WRITE_BASE + (idx + 1) * REGION])
        self.error: BaseException | None = None

    def obj(self) -> tuple[int, int]:
        length = self.rng.choice([4096, 16384, SLOT, self.rng.randint(1, SLOT)])
        addr = self.rng.randrange(READONLY[0], READONLY[1] - length)
        if self.rng.random() < 0.5:
            addr &= ~4095
        return addr, length

    def run(self) -> None:
        try:
            for _ in range(self.iters):
                self.step()
        except BaseException as exc:  # reported by the test thread
            self.error = exc

    def step(self) -> None:
        dev, rng = self.dev, self.rng
        op = rng.random()
        if op < 0.55:
            batch = []
            for _ in range(rng.randint(1, 3)):
                addr, length = self.obj()
                try:
                    batch.append((addr, length, dev.prefetch(addr, length)))
                    self.issued += 1
                except WouldBlock:
                    self.rejected += 1
            for addr, length, h in batch:
                if rng.random() < 0.2:
                    h.release()  # unwaited: races its fill or its queue place
                else:
                    view = h.wait(30)
                    assert view == self.image[addr : addr + length], (
                        f"thread {self.idx}: staged [{addr:#x}+{length}) differs"
                    )
                    del view
                    h.release()
                self.released += 1
        elif op < 0.75:
            addr, length = self.obj()
            got = dev.read(addr, length)
            assert got == self.image[addr : addr + length], f"read [{addr:#x}+{length})"
        elif op < 0.95:
            off = rng.randrange(0, REGION // 512 - 8) * 512
            length = min(rng.choice([512, 4096, 32768, SLOT]), REGION - off)
            data = rng.randbytes(length)
            addr = WRITE_BASE + self.idx * REGION + off
            if dev.write(addr, data):
                self.admitted += 1
                self.region[off : off + length] = data
            else:
                self.skipped += 1
            got = dev.read(addr, length)
            assert got == self.region[off : off + length], (
                f"thread {self.idx}: read-your-writes failed at {addr:#x}"
            )
        else:
            dev.flush(30)


@pytest.mark.parametrize("iters", [150])
def test_threads_leave_no_leaked_space(data_backend: str, image_device: Any, iters: int) -> None:
    dev, image, path = image_device(data_backend)
    workers = [Worker(dev, image, i, iters) for i in range(NTHREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert not w.is_alive(), f"{w.name} hung"
    for w in workers:
        if w.error is not None:
            raise w.error

    s = _settle(dev)
    issued = sum(w.issued for w in workers)
    rejected = sum(w.rejected for w in workers)
    assert s.slots_free == s.slots_total, f"leaked slots: {s}"
    assert (s.slots_ready, s.slots_held, s.slots_failed, s.queue_len) == (0, 0, 0, 0), s
    assert s.prefetch_issued == issued
    assert s.prefetch_released == sum(w.released for w in workers) == issued
    assert s.prefetch_rejected == rejected
    assert s.prefetch_issued == s.prefetch_completed + s.prefetch_failed + s.prefetch_cancelled
    assert s.prefetch_failed == 0
    assert s.wr_admitted == sum(w.admitted for w in workers)
    assert s.wr_skipped == sum(w.skipped for w in workers)

    dev.flush(30)
    deadline = time.monotonic() + 10
    while dev.stats().wbuf_used_bytes and time.monotonic() < deadline:
        time.sleep(0.005)
    s = dev.stats()
    assert s.wbuf_used_bytes == 0, "the write buffer did not drain after flush"
    assert s.wr_flushed_bytes == s.wr_admitted_bytes
    with open(path, "rb", buffering=0) as f:
        for w in workers:
            f.seek(WRITE_BASE + w.idx * REGION)
            assert f.read(REGION) == w.region, f"thread {w.idx}: region not durable"
    print(
        f"{data_backend}: issued {issued}, rejected {rejected}, queued {s.prefetch_queued}, "
        f"cancelled {s.prefetch_cancelled}, hits {s.read_hits}, writes admitted "
        f"{s.wr_admitted} skipped {s.wr_skipped}"
    )


def test_lru_threads_keep_data(data_backend: str, image_device: Any) -> None:
    """lru mode under the same mixed traffic: data stays right, flush drains."""
    dev, image, path = image_device(
        data_backend, mode="lru", dram=512 * KiB, lru_line=16 * KiB, slots=4
    )
    workers = [Worker(dev, image, i, 80) for i in range(NTHREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert not w.is_alive(), f"{w.name} hung"
    for w in workers:
        if w.error is not None:
            raise w.error
    s = _settle(dev)
    assert s.slots_free == s.slots_total and s.queue_len == 0
    assert s.lru_lines_dirty <= s.lru_lines_valid <= s.lru_lines_total
    dev.flush(30)
    assert dev.stats().lru_lines_dirty == 0
    with open(path, "rb", buffering=0) as f:
        for w in workers:
            f.seek(WRITE_BASE + w.idx * REGION)
            assert f.read(REGION) == w.region, f"thread {w.idx}: region not durable"


def test_release_races_fill_from_other_thread(data_backend: str, image_device: Any) -> None:
    """Handles issued in one thread are released by another while filling."""
    dev, image, _ = image_device(data_backend)
    import queue as queue_mod

    q: queue_mod.Queue[chm.Handle | None] = queue_mod.Queue()
    errors: list[BaseException] = []

    def releaser() -> None:
        try:
            while (h := q.get()) is not None:
                h.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=releaser) for _ in range(2)]
    for t in threads:
        t.start()
    issued = 0
    for i in range(2000):
        try:
            q.put(dev.prefetch((i * 4096) % (READONLY[1] - SLOT), SLOT))
            issued += 1
        except WouldBlock:
            time.sleep(0.0005)
    for _ in threads:
        q.put(None)
    for t in threads:
        t.join(60)
    assert not errors, errors
    s = _settle(dev)
    assert s.prefetch_issued == s.prefetch_released == issued
    assert s.slots_free == s.slots_total and s.queue_len == 0
    assert s.prefetch_issued == s.prefetch_completed + s.prefetch_failed + s.prefetch_cancelled
    with dev.prefetch(4096, SLOT) as h:
        assert h.wait(10) == image[4096 : 4096 + SLOT]


# ---------------------------------------------------------------- close

_CLOSE_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import chm
    from chm.errors import Cancelled

    backend, path, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
    KiB = 1024
    dev = chm.Device.open(targets=[path], backend=backend, capacity="16M",
                          dram=2 * 68 * KiB + 64 * KiB, wbuf="64K", slot_size="64K",
                          slots=2, refill_queue=4, create=True)
    held = [dev.prefetch(i * 65536, 65536) for i in range(2)]
    views = [h.wait(10) for h in held]
    if scenario == "queued":
        # the window is full and held: these wait forever for a slot
        blocked = [dev.prefetch((8 + i) * 65536, 65536) for i in range(4)]
    else:
        # free the window; the fills are slow, so waiters block on FILLING
        for v in views:
            v.release()
        views = []
        for h in held:
            h.release()
        held = []
        dev.inject_fault("slow", arg=2_000_000_000)
        blocked = [dev.prefetch((8 + i) * 65536, 65536) for i in range(2)]
    results = {}

    def waiter(i, h):
        try:
            h.wait(None)
            results[i] = "returned"
        except Cancelled:
            results[i] = "cancelled"
        except BaseException as exc:
            results[i] = repr(exc)

    threads = [threading.Thread(target=waiter, args=(i, h)) for i, h in enumerate(blocked)]
    for t in threads:
        t.start()
    # wait until every waiter is inside the C call
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        frames = sys._current_frames()
        inside = sum(
            1 for t in threads
            if t.ident in frames and frames[t.ident].f_code.co_name == "_wait"
        )
        if inside == len(threads):
            break
        time.sleep(0.01)
    time.sleep(0.2)
    views = []
    t0 = time.monotonic()
    dev.close()
    took = time.monotonic() - t0
    for t in threads:
        t.join(10)
    alive = sum(t.is_alive() for t in threads)
    print("RESULTS", sorted(results.values()), "alive", alive, "close_s", round(took, 3))
    for h in held:
        h.release()  # after close: a no-op, never a crash
    try:
        dev.prefetch(0, 4096)
        print("PREFETCH_AFTER_CLOSE ok")
    except Cancelled:
        print("PREFETCH_AFTER_CLOSE cancelled")
    """
)


@pytest.mark.parametrize("scenario", ["queued", "filling"])
def test_close_wakes_blocked_waiters(data_backend: str, tmp_backing: Path, scenario: str) -> None:
    """S12, S13: close() while threads are blocked in wait(): they get Cancelled,
    close returns, nothing crashes (run in a child process so that a crash
    is a failure here, not the end of the test session)."""
    path = tmp_backing / "close.img"
    env = dict(os.environ)
    env["PYTHONFAULTHANDLER"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _CLOSE_SCRIPT, data_backend, str(path), scenario],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"child exited {proc.returncode}:\n{out}"
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS")), None)
    assert line is not None, out
    n = 4 if scenario == "queued" else 2
    assert line.startswith(f"RESULTS {['cancelled'] * n!r} alive 0"), out
    assert "PREFETCH_AFTER_CLOSE cancelled" in proc.stdout, out


def test_device_io_error_is_not_swallowed_by_threads(data_backend: str, image_device: Any) -> None:
    """A fault hit by one thread fails that thread's call only."""
    dev, image, _ = image_device(data_backend)
    dev.inject_fault("eio_read", nth=5)
    failures = []
    oks = []
    lock = threading.Lock()

    def reader(i: int) -> None:
        for k in range(10):
            addr = (i * 10 + k) * 8192
            try:
                got = dev.read(addr, 8192)
                assert got == image[addr : addr + 8192]
                with lock:
                    oks.append(addr)
            except DeviceIOError:
                with lock:
                    failures.append(addr)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(NTHREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(failures) == 1, failures
    assert len(oks) == NTHREADS * 10 - 1
