"""A staged view is read-only at the buffer-protocol level, all the way down.

``Handle.wait()`` returned ``memoryview(ffi.buffer(...)).toreadonly()``: the
memoryview refused writes, but its ``.obj`` was the writable cffi buffer over
device DRAM, so ``h.wait().obj[0:4] = b"EVIL"`` changed what ``dev.read()``
returned. Every object reachable from a view (``mv.obj``, the ``.base`` chain
of ``h.array()``, arrays and memoryviews made from those) must refuse writes.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import ViewInUse

MakeDevice = Callable[..., chm.Device]
MiB = 1 << 20
N = 64 * 1024


def _data_file(path: Path) -> bytes:
    data = np.random.default_rng(7).integers(0, 256, N, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(data)
        f.truncate(64 * MiB)
    return data


def _chain(obj: Any) -> Iterator[Any]:
    """obj, then what it is a view of (memoryview.obj, ndarray.base), to the end."""
    seen: set[int] = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        yield obj
        if isinstance(obj, memoryview):
            obj = obj.obj
        elif isinstance(obj, np.ndarray):
            obj = obj.base
        else:
            obj = None


def _assert_unwritable(obj: Any) -> None:
    what = f"{type(obj).__name__} reachable from a view"
    if isinstance(obj, np.ndarray):
        assert not obj.flags.writeable, what
        with pytest.raises(ValueError):
            obj[0:4] = np.frombuffer(b"EVIL", dtype=np.uint8).view(obj.dtype)[:1]
        with pytest.raises(ValueError):
            obj.setflags(write=True)
    else:
        with pytest.raises(TypeError):
            obj[0:4] = b"EVIL"
    mv = memoryview(obj)
    assert mv.readonly, what
    with pytest.raises(TypeError):
        mv[0:4] = b"EVIL"
    with pytest.raises(TypeError):  # a writable export is refused by the exporter itself
        ctypes.c_char.from_buffer(obj)
    mv.release()


def test_no_object_reachable_from_a_view_writes_device_dram(
    make_device: MakeDevice, data_backend: str, tmp_backing: Path
) -> None:
    path = tmp_backing / "data.img"
    data = _data_file(path)
    dev = make_device(data_backend, targets=[path], create=False)
    h = dev.prefetch(0, N)
    mv = h.wait(timeout=10)
    arr = h.array("u4")
    user_arr = np.frombuffer(mv, dtype=np.uint8)
    part = mv[16:32]
    roots = [mv, arr, user_arr, part, np.frombuffer(memoryview(mv.obj), dtype=np.uint8)]
    for root in roots:
        for obj in _chain(root):
            _assert_unwritable(obj)
    del roots, obj, root
    assert bytes(mv) == data
    assert dev.read(0, N) == data
    with pytest.raises(ViewInUse):
        h.release()
    del arr, user_arr, part
    gc.collect()
    h.release()
    assert dev.read(0, N) == data


def test_exporter_kept_past_release_gives_no_access(
    make_device: MakeDevice, data_backend: str, tmp_backing: Path
) -> None:
    path = tmp_backing / "data.img"
    data = _data_file(path)
    dev = make_device(data_backend, targets=[path], create=False)
    h = dev.prefetch(0, N)
    mv = h.wait(timeout=10)
    exporter = mv.obj
    assert bytes(memoryview(exporter)) == data
    h.release()
    with pytest.raises(ValueError):
        mv[0]
    # the slot is refilled with other bytes: the old exporter must not show them
    with dev.prefetch(N, N) as other:
        other.wait(timeout=10)
        with pytest.raises(ValueError):
            memoryview(exporter)
        with pytest.raises(ValueError):
            np.frombuffer(memoryview(exporter), dtype=np.uint8)
    assert dev.read(0, N) == data


def test_view_lifetime_rules_hold(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    h = dev.prefetch(0, N)
    mv = h.wait(timeout=10)
    assert h.wait() is mv, "waiting again returns the same view"
    again = memoryview(mv.obj)  # a second view through the exporter
    with pytest.raises(ViewInUse):
        h.release()
    assert dev.stats().slots_held == 1
    del again
    arr = h.array()
    with pytest.raises(ViewInUse):
        dev.close()
    assert not dev.closed
    del arr
    gc.collect()
    mv = h.wait()
    h.release()
    with pytest.raises(ValueError):
        bytes(mv)
    st = dev.stats()
    assert st.slots_held == 0 and st.prefetch_released == 1
