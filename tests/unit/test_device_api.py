"""chm.Device / chm.Handle: lifecycle, staged data, and every failure path."""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm import _lowlevel
from chm.errors import (
    Cancelled,
    ChmError,
    DeviceIOError,
    InvalidArgument,
    StaleHandle,
    ViewInUse,
    WaitTimeout,
    WouldBlock,
)

MiB = 1 << 20
MakeDevice = Callable[..., chm.Device]


def _fill_file(path: Path, size: int, seed: int = 1, total: int = 64 * MiB) -> bytes:
    """Writes `size` pseudo-random bytes to path, sparse up to `total`; returns them."""
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(data)
        f.truncate(total)
    return data


# ---------------------------------------------------------------- lifecycle


def test_open_close_is_idempotent(backend: str, small_options: dict[str, Any]) -> None:
    dev = chm.Device.open(backend=backend, **small_options)
    tmp = dev.tmpdir
    if backend == "ghost":
        assert tmp is None, "the ghost backend needs no backing files"
    else:
        assert tmp is not None and os.path.isdir(tmp)
    assert not dev.closed
    assert dev.backend == backend
    assert dev.capacity == 64 * MiB
    dev.close()
    dev = dev  # mypy keeps `dev.closed` narrowed across close(); rebinding drops it
    assert dev.closed
    dev.close()
    assert tmp is None or not os.path.exists(tmp), "the temporary directory must go at close"


def test_context_manager_and_calls_after_close(backend: str, small_options: dict[str, Any]) -> None:
    with chm.Device.open(backend=backend, **small_options) as dev:
        h = dev.prefetch(0, 4096)
    assert dev.closed
    with pytest.raises(Cancelled):
        dev.prefetch(0, 4096)
    with pytest.raises(Cancelled):
        h.wait(0)
    with pytest.raises(Cancelled):
        dev.read(0, 16)
    with pytest.raises(Cancelled):
        dev.stats()
    h.release()  # closing released everything: a no-op, not an error
    assert h.released


def test_device_from_config(backend: str, tmp_backing: Path) -> None:
    cfg = chm.Config(
        capacity="32M",
        dram="16M",
        wbuf="4M",
        slot_size="1M",
        backend=backend,
        targets=[tmp_backing / "c.img"],
        create=True,
    )
    with chm.Device(cfg) as dev:
        eff = dev.config
        assert eff.capacity == 32 * MiB
        assert eff.backend == backend
        assert eff.slot_bytes == MiB
        assert eff.targets == [str(tmp_backing / "c.img")]
        assert dev.stats().slots_total >= 2
    # the caller's Config object is not consumed
    assert cfg.capacity == 32 * MiB


def test_open_rejects_bad_config(tmp_backing: Path) -> None:
    with pytest.raises(InvalidArgument, match="slot"):
        chm.Device.open(
            targets=[tmp_backing / "x.img"],
            backend="ghost",
            dram="8M",
            wbuf="4M",
            slot_size="32M",
            capacity="64M",
        )
    with pytest.raises(InvalidArgument, match="turbo"):
        chm.Device.open(backend="ghost", turbo=True)


# ---------------------------------------------------------------- staged data


@pytest.mark.parametrize(
    ("addr", "length"),
    [(0, 4096), (4096, MiB), (12345, 7777), (3 * MiB - 100, 200), (8 * MiB - 512, 512)],
)
def test_prefetch_returns_file_bytes(
    make_device: MakeDevice, data_backend: str, tmp_backing: Path, addr: int, length: int
) -> None:
    path = tmp_backing / "data.img"
    data = _fill_file(path, 8 * MiB)
    dev = make_device(data_backend, targets=[path], create=False)
    with dev.prefetch(addr, length) as h:
        view = h.wait(timeout=10)
        assert isinstance(view, memoryview)
        assert view.readonly
        assert len(view) == length
        assert view == data[addr : addr + length]
        assert h.wait() is view, "waiting again returns the same view"
        arr = h.array("u1")
        assert not arr.flags.writeable
        assert arr.tobytes() == data[addr : addr + length]
        del arr
    st = dev.stats()
    assert st.prefetch_issued == 1 and st.prefetch_completed == 1 and st.prefetch_released == 1


def test_many_objects_through_few_slots(
    make_device: MakeDevice, data_backend: str, tmp_backing: Path
) -> None:
    path = tmp_backing / "data.img"
    data = _fill_file(path, 48 * MiB, seed=7)
    dev = make_device(data_backend, targets=[path], create=False)
    slots = dev.stats().slots_total
    n = min(slots * 3, 48)
    handles = [dev.prefetch(i * MiB, MiB) for i in range(n)]
    st = dev.stats()
    assert st.prefetch_issued == n
    assert st.prefetch_queued >= n - slots
    for i, h in enumerate(handles):
        view = h.wait(timeout=10)
        assert bytes(view) == data[i * MiB : (i + 1) * MiB], f"object {i}"
        h.release()
    st = dev.stats()
    assert st.prefetch_released == n
    assert st.slots_free == st.slots_total
    assert st.queue_len == 0


def test_read_hit_and_miss(make_device: MakeDevice, data_backend: str, tmp_backing: Path) -> None:
    path = tmp_backing / "data.img"
    data = _fill_file(path, 8 * MiB, seed=3)
    dev = make_device(data_backend, targets=[path], create=False)
    before = dev.stats()
    assert dev.read(5 * MiB + 3, 1000) == data[5 * MiB + 3 : 5 * MiB + 1003]
    with dev.prefetch(MiB, MiB) as h:
        h.wait(timeout=10)
        assert dev.read(MiB + 100, 5000) == data[MiB + 100 : MiB + 5100]
    after = dev.stats() - before
    assert after.read_misses == 1
    assert after.read_hits == 1
    buf = bytearray(4096)
    assert dev.read_into(2 * MiB, buf) == 4096
    assert bytes(buf) == data[2 * MiB : 2 * MiB + 4096]
    arr = np.zeros(1024, dtype=np.uint32)
    dev.read_into(0, arr)
    assert arr.tobytes() == data[:4096]


def test_ghost_backend_stages_without_data(make_device: MakeDevice) -> None:
    dev = make_device("ghost", capacity="1T")
    with dev.prefetch(512 << 30, MiB) as h:
        assert len(h.wait(timeout=10)) == MiB
    assert dev.stats().prefetch_completed == 1


def test_concurrent_prefetch_threads(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(200):
                with dev.prefetch((k * 200 + i) * 4096 % (32 * MiB), 4096) as h:
                    assert len(h.wait(timeout=10)) == 4096
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    st = dev.stats()
    assert st.prefetch_issued == st.prefetch_released == 800


# ---------------------------------------------------------------- bad input


def test_prefetch_bad_arguments(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    cap = dev.capacity
    with pytest.raises(InvalidArgument):
        dev.prefetch(0, 0)
    with pytest.raises(InvalidArgument):
        dev.prefetch(cap - 4096, 8192)
    with pytest.raises(InvalidArgument):
        dev.prefetch(cap, 1)
    with pytest.raises(InvalidArgument):
        dev.prefetch(0, dev.slot_bytes + 1)
    with pytest.raises(InvalidArgument):
        dev.prefetch(-1, 4096)
    with pytest.raises(InvalidArgument):
        dev.prefetch(0, -5)
    with pytest.raises(InvalidArgument):
        dev.prefetch(2**64, 1)
    with pytest.raises(TypeError):
        dev.prefetch("0", 4096)  # type: ignore[arg-type]
    # nothing leaked into the window
    st = dev.stats()
    assert st.slots_free == st.slots_total


def test_read_and_write_bad_arguments(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    cap = dev.capacity
    with pytest.raises(InvalidArgument):
        dev.read(cap - 10, 20)
    with pytest.raises(InvalidArgument):
        dev.read(-1, 10)
    with pytest.raises(InvalidArgument):
        dev.read_into(cap, bytearray(1))
    with pytest.raises(InvalidArgument):
        dev.read_into(0, b"read-only bytes")
    with pytest.raises(InvalidArgument):
        dev.write(1, b"x" * 512)  # misaligned address
    with pytest.raises(InvalidArgument):
        dev.write(0, b"x" * 100)  # misaligned length
    with pytest.raises(InvalidArgument):
        dev.write(cap, b"x" * 512)
    with pytest.raises(InvalidArgument):
        dev.flush(timeout=-1)
    with pytest.raises(InvalidArgument):
        dev.inject_fault("gremlins")


def test_stale_handle_and_double_release(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    h = dev.prefetch(0, 4096)
    h.wait(timeout=10)
    h.release()
    h.release()  # the Python object: idempotent
    assert h.released
    with pytest.raises(StaleHandle):
        h.wait(0)
    raw = dev.adopt(h.token)  # the same token, through the raw route
    with pytest.raises(StaleHandle):
        raw.release()
    with pytest.raises(StaleHandle):
        dev.adopt(h.token).wait(0)
    # the slot was not reused by the stale token's generation
    h2 = dev.prefetch(0, 4096)
    assert h2.token != h.token
    with pytest.raises(StaleHandle):
        dev.adopt(h.token).release()
    h2.release()


def test_lowlevel_double_release_is_stale(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    h = dev.prefetch(0, 4096)
    token = h.token
    _lowlevel.prefetch_release(dev._ptr, token)
    with pytest.raises(StaleHandle) as info:
        _lowlevel.prefetch_release(dev._ptr, token)
    assert "chm_prefetch_release" in str(info.value)
    with pytest.raises(StaleHandle):
        h.release()  # the Python object did not know; the device says stale
    assert h.released
    h.release()  # and from then on it is a no-op


def test_foreign_and_malformed_handles(make_device: MakeDevice, backend: str) -> None:
    dev1 = make_device(backend)
    dev2 = make_device(backend)
    h = dev1.prefetch(0, 4096)
    foreign = dev2.adopt(h.token)
    with pytest.raises(InvalidArgument):
        foreign.wait(0)
    with pytest.raises(InvalidArgument):
        foreign.release()
    with pytest.raises((InvalidArgument, StaleHandle)):
        dev1.adopt(0).release()
    with pytest.raises((InvalidArgument, StaleHandle)):
        dev1.adopt(2**64 - 1).wait(0)
    # dev1's handle is still intact after the foreign attempts
    assert len(h.wait(timeout=10)) == 4096
    h.release()


def test_wait_timeout_and_queue_limits(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend, refill_queue=2)
    slots = dev.stats().slots_total
    held = [dev.prefetch(i * MiB, 4096) for i in range(slots)]
    for h in held:
        h.wait(timeout=10)
    with pytest.raises(WouldBlock):
        dev.prefetch(0, 4096, noqueue=True)
    q1 = dev.prefetch(0, 4096)
    q2 = dev.prefetch(4096, 4096)
    with pytest.raises(WouldBlock) as info:
        dev.prefetch(8192, 4096)
    assert isinstance(info.value, BlockingIOError)
    with pytest.raises(WaitTimeout) as tinfo:
        q1.wait(timeout=0)
    assert isinstance(tinfo.value, TimeoutError)
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout):
        q1.wait(timeout=0.05)
    assert time.monotonic() - t0 >= 0.04
    assert not q1.ready()
    st = dev.stats()
    assert st.prefetch_rejected >= 1 and st.queue_len == 2
    held[0].release()  # frees a slot: the first queued request starts
    assert len(q1.wait(timeout=10)) == 4096
    q2.release()  # releasing a queued request drops it
    q1.release()
    for h in held[1:]:
        h.release()
    st = dev.stats()
    assert st.slots_free == st.slots_total and st.queue_len == 0


def test_bad_timeouts(make_device: MakeDevice) -> None:
    dev = make_device("ghost")
    with dev.prefetch(0, 4096) as h:
        for bad in (-1, -0.5, float("nan"), "1"):
            with pytest.raises(InvalidArgument):
                h.wait(bad)  # type: ignore[arg-type]
        assert len(h.wait(1e12)) == 4096  # huge is fine: effectively forever


def test_fill_failure_is_device_io_error(
    make_device: MakeDevice, data_backend: str, tmp_backing: Path
) -> None:
    path = tmp_backing / "data.img"
    _fill_file(path, 4 * MiB)
    dev = make_device(data_backend, targets=[path], create=False)
    dev.inject_fault("eio_read", nth=1)
    h = dev.prefetch(0, 64 * 1024)
    with pytest.raises(DeviceIOError):
        h.wait(timeout=10)
    h.release()
    assert dev.stats().prefetch_failed == 1
    with dev.prefetch(0, 4096) as h2:  # the device carries on
        assert len(h2.wait(timeout=10)) == 4096


# ---------------------------------------------------------------- views


def test_released_view_raises(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    h = dev.prefetch(0, 4096)
    view = h.wait(timeout=10)
    h.release()
    with pytest.raises(ValueError):
        view[0]
    with pytest.raises(ValueError):
        bytes(view)


def test_view_in_use_by_numpy_array(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    h = dev.prefetch(0, 8192)
    arr = h.array("u4")
    assert arr.shape == (2048,)
    with pytest.raises(ViewInUse) as info:
        h.release()
    assert isinstance(info.value, BufferError)
    assert not h.released
    assert dev.stats().slots_held == 1, "the slot stays held while viewed"
    with pytest.raises(ViewInUse):
        h.release()
    del arr
    gc.collect()
    h.release()
    h = h  # mypy keeps `h.released` narrowed across release(); rebinding drops it
    assert h.released
    st = dev.stats()
    assert st.slots_held == 0 and st.prefetch_released == 1


def test_view_in_use_by_slice_and_foreign_array(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    h = dev.prefetch(0, 4096)
    view = h.wait(timeout=10)
    part = view[100:200]
    with pytest.raises(ViewInUse):
        h.release()
    del part
    other = np.frombuffer(h.wait(), dtype=np.uint8)  # the user's own numpy array
    with pytest.raises(ViewInUse):
        h.release()
    del other
    h.release()


def test_close_refuses_while_viewed(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    h = dev.prefetch(0, 4096)
    arr = h.array()
    with pytest.raises(ViewInUse):
        dev.close()
    assert not dev.closed
    del arr
    dev.close()
    dev = dev  # mypy keeps `dev.closed` narrowed across close(); rebinding drops it
    assert dev.closed
    h.release()


def test_close_ends_unexported_views(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    h = dev.prefetch(0, 4096)
    view = h.wait(timeout=10)
    dev.close()
    with pytest.raises(ValueError):
        view[0]
    with pytest.raises(Cancelled):
        h.wait(0)


# ---------------------------------------------------------------- stats, errors


def test_stats_mirror_the_c_struct(make_device: MakeDevice) -> None:
    # every C field but the reserved padding, in the same order
    c_fields = [
        f for f in _lowlevel.struct_fields("struct chm_stats") if not f.startswith("reserved")
    ]
    py_fields = [f.name for f in dataclasses.fields(chm.Stats)]
    assert py_fields == c_fields
    dev = make_device("ghost")
    st = dev.stats()
    assert st.backend_name == "ghost"
    assert st.mode_name == "prefetch"
    assert len(st.refill_lat_hist) == _lowlevel.HIST_BUCKETS
    assert st.hit_rate == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.read_hits = 5  # type: ignore[misc]
    d = st.to_dict()
    assert set(d) == set(c_fields)
    assert chm.Stats.from_dict(d) == st


def test_error_classes() -> None:
    import errno

    from chm import errors

    table = {
        errno.EINVAL: (errors.InvalidArgument, ValueError),
        errno.ENOENT: (errors.NotFound, FileNotFoundError),
        errno.EAGAIN: (errors.WouldBlock, BlockingIOError),
        errno.ETIMEDOUT: (errors.WaitTimeout, TimeoutError),
        errno.ENOMEM: (errors.NoMemory, MemoryError),
        errno.ENOSPC: (errors.NoSpace, OSError),
        errno.EBUSY: (errors.Busy, OSError),
        errno.EIO: (errors.DeviceIOError, OSError),
        errno.ESTALE: (errors.StaleHandle, OSError),
        errno.ECANCELED: (errors.Cancelled, OSError),
        errno.EOPNOTSUPP: (errors.NotSupported, OSError),
    }
    for code, (cls, builtin) in table.items():
        with pytest.raises(cls) as info:
            _lowlevel._check(-code, "chm_test", "x=1", "why")
        err = info.value
        assert isinstance(err, ChmError) and isinstance(err, builtin) and isinstance(err, OSError)
        assert err.errno == code
        assert err.call == "chm_test"
        assert "chm_test(x=1)" in str(err) and "why" in str(err)
        assert _lowlevel.strerror(-code) in str(err)
    assert _lowlevel._check(7, "chm_test") == 7


def test_every_c_function_has_a_lowlevel_wrapper() -> None:
    from chm._ffi import lib

    funcs = [n for n in dir(lib) if n.startswith("chm_") and callable(getattr(lib, n))]
    assert "chm_prefetch_object" in funcs
    missing = [n for n in funcs if not callable(getattr(_lowlevel, n[len("chm_") :], None))]
    assert not missing, f"chm.h functions without a chm._lowlevel wrapper: {missing}"


def test_write_flush_read_back(make_device: MakeDevice, data_backend: str) -> None:
    dev = make_device(data_backend)
    payload = bytes(range(256)) * 16
    assert dev.write(8192, payload) is True
    assert dev.read(8192, len(payload)) == payload, "reads see admitted writes"
    dev.flush(timeout=10)
    st = dev.stats()
    assert st.wr_admitted == 1 and st.wr_admitted_bytes == len(payload)
    assert dev.read(8192, len(payload)) == payload
    with dev.prefetch(8192, len(payload)) as h:
        assert h.wait(timeout=10) == payload


def test_pool_fd(make_device: MakeDevice) -> None:
    from chm.errors import NotFound

    anon = make_device("ghost")
    with pytest.raises(NotFound):
        anon.pool_fd()
    shared = make_device("ghost", pool="memfd")
    fd = shared.pool_fd()
    assert fd >= 0
    assert os.fstat(fd).st_size >= shared.stats().pool_bytes


def test_version() -> None:
    major, minor, patch = (int(x) for x in chm.version().split("."))
    assert (major, minor, patch) == _lowlevel.VERSION_TUPLE


def test_dropped_device_is_closed_by_the_leak_net(small_options: dict[str, Any]) -> None:
    dev = chm.Device.open(backend="pread", **small_options)
    tmp = dev.tmpdir
    assert tmp is not None
    h = dev.prefetch(0, 4096)
    h.wait(timeout=10)
    del dev, h
    gc.collect()
    assert not os.path.exists(tmp)


# ---------------------------------------------------------------- the demo


def test_demo_command_runs() -> None:
    from click.testing import CliRunner

    from chm_emu.cli import main

    args = ["demo", "--backend", "pread", "--objects", "4", "--slots", "2", "--object-size", "1M"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # undo the console's line wrapping
    assert "4/4 objects" in text
    assert "1 hit, 1 miss" in text


# ---------------------------------------------------------------- speed


def test_prefetch_cycle_rate_ghost(make_device: MakeDevice) -> None:
    """prefetch + wait + release from Python must sustain >= 150k cycles/s.

    Timed in this thread's CPU time, best of several bursts: the rate of the
    code path itself, not of whatever else the host is running.
    """
    floor = float(os.environ.get("CHM_MIN_CYCLES_PER_S", "150000"))
    dev = make_device("ghost")
    pf = dev.prefetch
    n = 10_000
    best = 0.0
    for _ in range(20):
        t0 = time.thread_time()
        for _ in range(n):
            h = pf(0, 4096)
            h.wait()
            h.release()
        spent = time.thread_time() - t0
        best = max(best, n / max(spent, 1e-9))
        if best >= 2 * floor:
            break
    assert best >= floor, f"{best:.0f} cycles/s"
    st = dev.stats()
    assert st.prefetch_released == st.prefetch_issued and st.slots_held == 0
