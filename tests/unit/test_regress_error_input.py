"""Errors name the offending input.

``Device.open`` of a missing target said only ``chm_dev_open(): no such
object or option``; a wrong-typed address said ``an integer is required``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

import chm
from chm.errors import InvalidArgument, NotFound

MakeDevice = Callable[..., chm.Device]
SMALL = {"capacity": "64M", "dram": "16M", "wbuf": "4M", "slot_size": "1M"}


def test_missing_target_is_named(tmp_backing: Path) -> None:
    path = tmp_backing / "missing.img"
    with open(tmp_backing / "ok.img", "wb") as f:
        f.truncate(32 << 20)  # its half of the capacity
    with pytest.raises(NotFound) as info:
        chm.Device.open(targets=[tmp_backing / "ok.img", path], create=False, **SMALL)
    assert type(info.value) is NotFound
    assert str(path) in str(info.value)
    assert info.value.filename == str(path)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is NotFound and again.filename == str(path)
    assert str(again) == str(info.value)


def test_target_in_a_missing_directory_is_named(tmp_backing: Path) -> None:
    path = tmp_backing / "no-such-dir" / "t.img"
    with pytest.raises(NotFound) as info:
        chm.Device.open(targets=[path], backend="pread", create=True, **SMALL)
    assert type(info.value) is NotFound
    assert str(path) in str(info.value)
    assert info.value.filename == str(path)


def test_missing_pool_path_is_named(tmp_backing: Path) -> None:
    pool = tmp_backing / "no-such-dir" / "pool"
    with pytest.raises(NotFound) as info:
        chm.Device.open(
            targets=[tmp_backing / "t.img"],
            backend="pread",
            create=True,
            pool="file",
            pool_path=pool,
            **SMALL,
        )
    assert type(info.value) is NotFound
    assert str(pool) in str(info.value)
    assert info.value.filename == str(pool)


@pytest.mark.parametrize(
    ("call", "args", "shown"),
    [
        ("prefetch", ("0", 4096), "addr='0'"),
        ("prefetch", (0, 4096.0), "len=4096.0"),
        ("read", (0, "1"), "len='1'"),
        ("read", (None, 1), "addr=None"),
        ("read_into", ("0", bytearray(1)), "addr='0'"),
        ("write", ("0", b"x" * 512), "addr='0'"),
    ],
)
def test_wrong_typed_argument_is_named(
    make_device: MakeDevice, call: str, args: tuple[object, ...], shown: str
) -> None:
    dev = make_device()
    with pytest.raises(TypeError) as info:
        getattr(dev, call)(*args)
    assert type(info.value) is TypeError
    assert shown in str(info.value), str(info.value)
    st = dev.stats()
    assert st.slots_free == st.slots_total


def test_common_errors_carry_call_and_arguments(make_device: MakeDevice) -> None:
    dev = make_device()
    cap = dev.capacity
    with pytest.raises(InvalidArgument) as info:
        dev.prefetch(cap - 4096, 8192)
    assert f"chm_prefetch_object(addr={cap - 4096:#x}, len=8192" in str(info.value)
    with pytest.raises(InvalidArgument) as info:
        dev.read(cap - 10, 20)
    assert f"chm_read(addr={cap - 10:#x}, len=20)" in str(info.value)
    with pytest.raises(InvalidArgument) as info:
        dev.write(1, b"x" * 512)
    assert "chm_write_object(addr=0x1, len=512" in str(info.value)
