"""RegisteredBuffer's regions (chm.remote.transfer) on this process's real
Transfer Engine: first-fit take, give with merging, and quarantine of a
region a late transfer may still write."""

from __future__ import annotations

import importlib.util

import pytest

from chm.errors import InvalidArgument, NoSpace

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None,
    reason="the 'remote' extra (mooncake-transfer-engine-non-cuda) is not installed",
)


def test_take_give_merge_and_quarantine() -> None:
    from chm.remote.transfer import Engine, RegisteredBuffer

    buf = RegisteredBuffer(Engine.get("127.0.0.1"), 1 << 20)
    try:
        a = buf.take(100)  # rounded up to 64-byte multiples
        b = buf.take(1000)
        assert (a, b) == (0, 128)
        assert buf.view(b, 1000).size == 1000
        with pytest.raises(NoSpace):
            buf.take(1 << 20)
        buf.give(a, 100)
        buf.give(b, 1000)
        assert buf.take(1 << 20) == 0  # given back and merged into one region
        back = buf.quarantine(0, 1 << 20)
        assert buf.quarantined == 1
        with pytest.raises(NoSpace):
            buf.take(64)  # a quarantined region is not handed out
        back()
        assert buf.quarantined == 0
        assert buf.take(64) == 0
    finally:
        buf.close()


def test_bad_sizes_and_a_second_engine_are_refused() -> None:
    from chm.remote.transfer import Engine, RegisteredBuffer

    eng = Engine.get("127.0.0.1")
    with pytest.raises(InvalidArgument):
        RegisteredBuffer(eng, 0)
    with pytest.raises(InvalidArgument):
        eng.register(4096, 0)
    with pytest.raises(InvalidArgument, match="one engine per process"):
        Engine.get("10.0.0.1")
    assert eng.read("127.0.0.1:1", [], [], []) == "ok"  # nothing to move
    with pytest.raises(InvalidArgument):
        eng.read("127.0.0.1:1", [1], [], [])
