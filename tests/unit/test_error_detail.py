"""Errors say why: every validation path of the C core gives its exact
exception class and a message carrying the reason recorded at the failure
site (chm_last_error_detail, appended by chm._lowlevel._check), and a reason
is never left over for a later call."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import chm
from chm import _lowlevel as _ll
from chm.errors import (
    Cancelled,
    ChmError,
    InvalidArgument,
    NotFound,
    NotSupported,
    StaleHandle,
    WaitTimeout,
    WouldBlock,
)

OPTS: dict[str, Any] = {
    "capacity": "16M",
    "backend": "ghost",
    "dram": "1M",
    "wbuf": "256K",
    "slot_size": "64K",
    "slots": 2,
    "refill_queue": 1,
}


@pytest.fixture
def dev() -> Iterator[chm.Device]:
    d = chm.Device.open(**OPTS)
    try:
        yield d
    finally:
        d.close()


def _raises(exc: type[ChmError], why: str, fn: Callable[[], object]) -> ChmError:
    with pytest.raises(ChmError) as info:
        fn()
    assert type(info.value) is exc, f"{type(info.value).__name__}: {info.value}"
    assert re.search(why, str(info.value)), str(info.value)
    assert info.value.detail and re.search(why, info.value.detail), info.value.detail
    return info.value


def test_write_alignment_says_which_and_by_how_much(dev: chm.Device) -> None:
    e = _raises(
        InvalidArgument,
        r"write: addr 0x7b is not a multiple of 512 \(CHM_IO_ALIGN\)",
        lambda: dev.write(0x7B, b"\0" * 512),
    )
    assert str(e).startswith("[Errno 22] chm_write_object(addr=0x7b")
    _raises(
        InvalidArgument,
        r"write: len 100 is not a multiple of 512 \(CHM_IO_ALIGN\)",
        lambda: dev.write(0, b"\0" * 100),
    )


def test_range_and_length(dev: chm.Device) -> None:
    cap = dev.capacity
    _raises(
        InvalidArgument,
        r"read: \[0x1000000, \+1\) is beyond the capacity",
        lambda: dev.read(cap, 1),
    )
    _raises(InvalidArgument, "read: len is 0", lambda: dev.read(0, 0))
    _raises(
        InvalidArgument,
        r"write: \[0xfffe00, \+1024\) is beyond",
        lambda: dev.write(cap - 512, b"\0" * 1024),
    )
    _raises(InvalidArgument, "prefetch: len is 0", lambda: dev.prefetch(0, 0))
    _raises(
        InvalidArgument,
        r"prefetch: \[0xffff00, \+512\) is beyond",
        lambda: dev.prefetch(cap - 256, 512),
    )
    _raises(
        InvalidArgument,
        r"prefetch: len 65537 is larger than a slot \(slot_size 65536\)",
        lambda: dev.prefetch(0, 65537),
    )  # fmt: skip


def test_handles(dev: chm.Device) -> None:
    h = dev.prefetch(0, 4096)
    tok = h.token
    h.release()
    _raises(StaleHandle, f"handle {tok:#x} was released", lambda: dev.adopt(tok).wait(0))
    _raises(StaleHandle, "was released", lambda: dev.adopt(tok).release())
    foreign = tok ^ (1 << 48)
    _raises(InvalidArgument, "another device tag", lambda: dev.adopt(foreign).wait(0))
    _raises(InvalidArgument, "no such request", lambda: dev.adopt(tok | 0xFFFFFF).release())


def test_queue_full_and_timeouts(dev: chm.Device) -> None:
    held = [dev.prefetch(i * 65536, 4096) for i in range(2)]  # both slots
    _raises(
        WouldBlock, r"no free slot \(CHM_PF_NOQUEUE\)", lambda: dev.prefetch(0, 1, noqueue=True)
    )
    queued = dev.prefetch(0, 4096)  # the one queue entry
    _raises(WouldBlock, "the refill queue is full", lambda: dev.prefetch(0, 1))
    _raises(WaitTimeout, "not staged within 0 ns \\(queued for a slot\\)", lambda: queued.wait(0))
    for h in [*held, queued]:
        h.release()


def test_mode_refusal() -> None:
    with chm.Device.open(**{**OPTS, "mode": "direct"}) as d:
        _raises(NotSupported, "mode=direct has no staging window", lambda: d.prefetch(0, 4096))


def test_fault_kinds(dev: chm.Device) -> None:
    _raises(InvalidArgument, "unknown kind 9", lambda: dev.inject_fault(9))
    _raises(InvalidArgument, r"nth is 0", lambda: dev.inject_fault("eio_read", 0))


def test_pool_fd_of_another_pool(dev: chm.Device) -> None:
    _raises(NotFound, "not a memfd", dev.pool_fd)


def test_config_errors_carry_the_reason() -> None:
    cfg = _ll.config_new()
    _raises(
        InvalidArgument,
        "capacity: '1e3' is not a size",
        lambda: _ll.config_set(cfg, "capacity", "1e3"),
    )
    _raises(NotFound, "unknown option 'nosuch'", lambda: _ll.config_set(cfg, "nosuch", "1"))
    _raises(NotFound, "unknown option 'nosuch'", lambda: _ll.config_get(cfg, "nosuch"))
    _raises(InvalidArgument, "targets", lambda: _ll.config_validate(cfg))
    _raises(InvalidArgument, "whole number of bytes", lambda: _ll.parse_size("0.3K"))  # fmt: skip


def test_open_failure_carries_the_reason(tmp_path: Any) -> None:
    path = str(tmp_path / "nope.img")
    e = _raises(
        NotFound,
        "does not exist|No such file|missing",
        lambda: chm.Device.open(targets=[path], capacity="1M", backend="pread"),
    )
    assert e.filename == path


def test_closed_device() -> None:
    d = chm.Device.open(**OPTS)
    h = d.prefetch(0, 4096)
    d.close()
    _raises(Cancelled, "closed", lambda: d.read(0, 1))
    _raises(Cancelled, "closed|closing|shut down", lambda: h.wait(0))


def test_no_stale_reason_on_a_later_error(dev: chm.Device) -> None:
    """A failure whose site gives no reason never shows an earlier call's."""
    with pytest.raises(InvalidArgument):
        dev.write(0x7B, b"\0" * 512)
    assert _ll.last_error_detail(-22) is not None  # it is there for that failure
    dev.read(0, 1)  # a successful call clears it
    assert _ll.last_error_detail(-22) is None
    with pytest.raises(InvalidArgument):
        dev.write(0x7B, b"\0" * 512)
    # another error code never gets it
    assert _ll.last_error_detail(-116) is None
    # a batch leaves no element's reason behind
    out = dev.write_many([0x7B], [b"\0" * 512])
    assert isinstance(out[0], InvalidArgument)
    assert _ll.last_error_detail(-22) is None


def test_reason_is_per_thread(dev: chm.Device) -> None:
    with pytest.raises(InvalidArgument):
        dev.write(0x7B, b"\0" * 512)
    seen: list[str | None] = []
    t = threading.Thread(target=lambda: seen.append(_ll.last_error_detail(-22)))
    t.start()
    t.join()
    assert seen == [None]
    assert "0x7b" in str(_ll.last_error_detail(-22))


ROOT = Path(__file__).resolve().parents[2]


def _bodies() -> dict[str, str]:
    out = {}
    for f in sorted((ROOT / "csrc").glob("*.c")):
        text = f.read_text()
        for m in re.finditer(r"^[a-z][^\n;]*\b(chm_\w+)\([^;{]*\)\s*\{(.*?)^\}", text, re.M | re.S):
            out[m.group(1)] = m.group(2)
    return out


def test_every_fallible_call_clears_the_detail_on_entry() -> None:
    """So no reason outlives the call it belongs to: every int-returning
    function of chm.h clears the detail first (or is one call to a function
    that does)."""
    header = (ROOT / "include" / "chm.h").read_text()
    region = header[header.index("/* CFFI_BEGIN */") : header.index("/* CFFI_END */")]
    funcs = re.findall(r"^int (chm_\w+)\(", region, re.M)
    assert len(funcs) > 20
    bodies = _bodies()

    def clears(fn: str, depth: int = 0) -> bool:
        body = bodies[fn].strip()
        if body.startswith("chm_detail_clear();"):
            return True
        m = re.match(r"return (chm_\w+)\(", body)
        return (
            m is not None and depth < 3 and m.group(1) in bodies and clears(m.group(1), depth + 1)
        )

    missing = [fn for fn in funcs if fn != "chm_version" and not clears(fn)]
    assert missing == []


def test_a_call_that_sets_no_reason_shows_no_earlier_one() -> None:
    cfg = _ll.config_new()
    with pytest.raises(NotFound):
        _ll.config_set(cfg, "nosuch", "1")  # ENOENT, with a reason
    with pytest.raises(NotFound) as info:
        _ll.timing_preset("bogus")  # ENOENT, and its site gives no reason
    assert "nosuch" not in str(info.value), str(info.value)
