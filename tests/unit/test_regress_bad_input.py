"""Bad arguments to Device/Handle methods raise chm.errors classes, not stray builtins."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import numpy as np
import pytest

import chm
from chm.errors import InvalidArgument

MakeDevice = Callable[..., chm.Device]


@pytest.mark.parametrize("timeout", [math.inf, 1e300])
def test_wait_with_infinite_or_huge_timeout(make_device: MakeDevice, timeout: float) -> None:
    # timeout_ns() clamps large values to "forever - 1", but int(inf) raises
    # OverflowError first (1e300 s * 1e9 is inf too).
    dev = make_device()
    with dev.prefetch(0, 4096) as h:
        try:
            view = h.wait(timeout)
        except InvalidArgument:
            return
        assert len(view) == 4096
        view.release()


@pytest.mark.parametrize("timeout", [math.inf, 1e300])
def test_flush_with_infinite_or_huge_timeout(make_device: MakeDevice, timeout: float) -> None:
    dev = make_device()
    with contextlib.suppress(InvalidArgument):
        dev.flush(timeout)


def test_numpy_integer_timeout_is_accepted(make_device: MakeDevice) -> None:
    # addr/len accept numpy ints; the timeout rejects them as "not seconds".
    dev = make_device()
    with dev.prefetch(0, 4096) as h:
        # (numpy 2.2, which LMCache pins, has stubs where np.int64 is no float)
        h.wait(np.int64(5)).release()  # type: ignore[arg-type,unused-ignore]
    dev.flush(np.int64(5))  # type: ignore[arg-type,unused-ignore]


@pytest.mark.parametrize("length", [1 << 40, 1 << 64])
def test_read_longer_than_capacity_is_invalid_argument(
    make_device: MakeDevice, length: int
) -> None:
    # The host buffer is allocated before the range is checked: MemoryError
    # for 1 TiB, OverflowError for 2**64, instead of EINVAL.
    dev = make_device()
    with pytest.raises(InvalidArgument):
        dev.read(0, length)


def _readonly_array() -> np.ndarray[tuple[int], np.dtype[np.uint8]]:
    a = np.zeros(4096, np.uint8)
    a.setflags(write=False)
    return a


@pytest.mark.parametrize(
    "make_buf",
    [
        _readonly_array,
        lambda: np.zeros(8192, np.uint8)[::2],
        lambda: np.zeros((64, 64), np.uint8, order="F"),
    ],
    ids=["readonly-ndarray", "strided-ndarray", "fortran-ndarray"],
)
def test_read_into_unusable_buffer_is_invalid_argument(
    make_device: MakeDevice, make_buf: Callable[[], object]
) -> None:
    # read-only bytes and a strided memoryview give InvalidArgument; the same
    # problems in a numpy array leak numpy's plain ValueError.
    dev = make_device()
    with pytest.raises(InvalidArgument):
        dev.read_into(0, make_buf())


@pytest.mark.parametrize(
    "make_buf",
    [
        lambda: memoryview(bytearray(8192))[::2],
        lambda: np.zeros(8192, np.uint8)[::2],
    ],
    ids=["strided-memoryview", "strided-ndarray"],
)
def test_write_non_contiguous_buffer_is_invalid_argument(
    make_device: MakeDevice, make_buf: Callable[[], object]
) -> None:
    # write_object() catches only TypeError from ffi.from_buffer(): a strided
    # memoryview leaks BufferError, a strided ndarray ValueError.
    dev = make_device()
    with pytest.raises(InvalidArgument):
        dev.write(0, make_buf())


def test_inject_fault_rejects_a_fractional_kind(make_device: MakeDevice) -> None:
    # int(1.5) == 1 silently arms eio_read.
    dev = make_device()
    with pytest.raises((InvalidArgument, TypeError)):
        dev.inject_fault(1.5)  # type: ignore[arg-type]


def test_adopt_rejects_a_fractional_token(make_device: MakeDevice) -> None:
    # int(1.5) == 1: a different token than the caller passed.
    dev = make_device()
    with pytest.raises((InvalidArgument, TypeError)):
        dev.adopt(1.5)  # type: ignore[arg-type]
