"""Closing a chm.connect() client ends its views as chm.Device.close() does:
a view of a closed client raises ValueError instead of showing whatever the
daemon stages into that slot next, and close() raises ViewInUse, closing
nothing, while a view is still exported. Every case runs against an embedded
device and a real daemon process with the same geometry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import Cancelled, ViewInUse
from chm.remote import RemoteDevice
from chm.testing.daemon_proc import DaemonProcess

K4 = 4096
SLOTS = 4
GEOMETRY: dict[str, Any] = {
    "capacity": 64 << 20,
    "dram": 1 << 20,
    "wbuf": 256 << 10,
    "slot_size": K4,
    "slots": SLOTS,
    "refill_queue": 2,
}


def _toml(v: Any) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def _pattern(i: int) -> bytes:
    return bytes([(i * 37 + 1) % 256]) * K4


@pytest.fixture(params=["embedded", "daemon"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Opens a device: the embedded one (once), or a new daemon client per call."""
    img = tmp_path / "a.img"
    opened: list[Any] = []
    if request.param == "embedded":

        def embedded() -> Any:
            assert not opened, "an embedded device has one opener"
            d = chm.Device.open(targets=[img], backend="pread", create=True, **GEOMETRY)
            opened.append(d)
            return d

        try:
            yield embedded
        finally:
            for d in opened:
                d.close()
        return
    cfg = tmp_path / "a.toml"
    lines = ["[device]", f'targets = ["{img}"]', 'backend = "pread"', "create = true"]
    lines += [f"{k} = {_toml(v)}" for k, v in GEOMETRY.items()]
    cfg.write_text("\n".join(lines) + "\n")
    quota = str(GEOMETRY["slots"] + GEOMETRY["refill_queue"])
    args = ["--config", str(cfg), "--no-kv", "--client-quota", quota]
    with DaemonProcess(args, tmp_path / "a.sock") as p:

        def client() -> Any:
            r = chm.connect(p.socket)
            opened.append(r)
            return r

        try:
            yield client
        finally:
            for r in opened:
                r.close()


def _fill(dev: Any, n: int) -> None:
    assert all(dev.write_many([i * K4 for i in range(n)], [_pattern(i) for i in range(n)]))
    dev.flush(10.0)


def test_close_ends_views(opener: Callable[[], Any]) -> None:
    dev = opener()
    _fill(dev, 2 * SLOTS)
    h = dev.prefetch(0, K4)
    mv = h.wait(5.0)
    assert bytes(mv) == _pattern(0)
    dev.close()
    assert dev.closed
    with pytest.raises(ValueError):
        bytes(mv)
    with pytest.raises(ValueError):
        memoryview(mv.obj)  # no new export of the ended buffer either
    with pytest.raises(Cancelled):
        h.wait(0)
    h.release()  # closing released everything: nothing left to do
    assert h.released
    dev.close()  # idempotent
    if isinstance(dev, RemoteDevice):
        # the daemon reuses every slot for another client's objects; the
        # closed client's view shows none of their bytes
        other = opener()
        hs = [other.prefetch(i * K4, K4) for i in range(SLOTS, 2 * SLOTS)]
        assert [bytes(x.wait(5.0)) for x in hs] == [_pattern(i) for i in range(SLOTS, 2 * SLOTS)]
        with pytest.raises(ValueError):
            bytes(mv)
        assert other.release_many(hs) == [None] * SLOTS


def test_close_refuses_while_a_view_is_exported(opener: Callable[[], Any]) -> None:
    dev = opener()
    _fill(dev, 2)
    a = dev.prefetch(0, K4)
    b = dev.prefetch(K4, K4)
    mv_a = a.wait(5.0)
    arr = np.frombuffer(b.wait(5.0), np.uint8)  # exports b's view
    with pytest.raises(ViewInUse):
        dev.close()
    # nothing was closed or ended: all or nothing
    assert not dev.closed and not a.released and not b.released
    assert bytes(mv_a) == _pattern(0)
    assert arr.tobytes() == _pattern(1)
    assert dev.stats().slots_held == 2
    with dev.prefetch(0, K4) as c:  # still usable
        assert bytes(c.wait(5.0)) == _pattern(0)
    del arr
    dev.close()
    assert dev.closed
    with pytest.raises(ValueError):
        bytes(mv_a)


def test_close_with_unviewed_handles(opener: Callable[[], Any]) -> None:
    """Handles never waited on (or released) do not hold close() up."""
    dev = opener()
    a = dev.prefetch(0, K4)
    b = dev.prefetch(K4, K4)
    b.wait(5.0)
    b.release()
    dev.close()
    assert dev.closed
    a.release()
    assert a.released
