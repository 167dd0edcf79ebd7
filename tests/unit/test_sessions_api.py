"""Device sessions and handle batches through chm.Device: a session's
handles are refused elsewhere, its quota holds, closing it ends its views and
frees its slots, the queue is served round-robin; a HandleBatch gives
per-element statuses, lazy Handles and one all-or-nothing release."""

from __future__ import annotations

import gc
import threading
import time
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

import chm
from chm.errors import InvalidArgument, NoSpace, StaleHandle, ViewInUse, WouldBlock

K4 = 4096


@pytest.fixture
def dev() -> Iterator[chm.Device]:
    d = chm.Device.open(
        capacity="1G",
        dram="1M",
        wbuf="256K",
        slot_size="4K",
        slots=4,
        refill_queue=4,
        backend="ghost",
    )
    yield d
    d.close()


def _free(dev: chm.Device) -> tuple[int, int]:
    s = dev.stats()
    return s.slots_free, s.queue_len


# ---- sessions


def test_session_handles_are_scoped(dev: chm.Device) -> None:
    with dev.session(quota=8) as a, dev.session() as b:
        h = a.prefetch(0, K4)
        hd = dev.prefetch(K4, K4)
        assert len(h.wait(1.0)) == K4
        # another session's handle, or the default one's: refused, slot kept
        (err,) = b.release_many([h])
        assert isinstance(err, InvalidArgument) and not h.released
        (err,) = dev.release_many([h])
        assert isinstance(err, InvalidArgument) and not h.released
        (err,) = a.release_many([hd])
        assert isinstance(err, InvalidArgument) and not hd.released
        res = a.release_many([h, hd])
        assert res[0] is None and isinstance(res[1], InvalidArgument)
        assert [h.released, hd.released] == [True, False]
        hd.release()
    assert _free(dev) == (4, 0)


def test_foreign_token_is_refused_by_the_device(dev: chm.Device) -> None:
    """The C core itself refuses a session's token in the default session."""
    with dev.session() as a:
        h = a.prefetch(0, K4)
        assert dev.adopt(h.token) is h  # the same Handle: adopt finds it
        from chm import _lowlevel as ll

        with pytest.raises(InvalidArgument):
            ll.prefetch_release(dev._ptr, h.token)
        with pytest.raises(InvalidArgument):
            ll.prefetch_wait(dev._ptr, h.token, 0)
        h.release()


def test_quota(dev: chm.Device) -> None:
    with dev.session(quota=2) as s:
        h1 = s.prefetch(0, K4)
        h2 = s.prefetch(K4, K4)
        with pytest.raises(WouldBlock):
            s.prefetch(2 * K4, K4)
        out = s.prefetch_many([2 * K4, 3 * K4], [K4, K4])
        assert [type(x) for x in out] == [WouldBlock, WouldBlock]
        dev.prefetch(2 * K4, K4).release()  # the default session is not limited
        h1.release()
        h3 = s.prefetch(2 * K4, K4)
        assert s.release_many([h2, h3]) == [None, None]


@pytest.mark.parametrize("quota", [0, True, -1, 2**32, "3"])
def test_bad_quota(dev: chm.Device, quota: object) -> None:
    with pytest.raises((InvalidArgument, TypeError)):
        dev.session(quota=quota)  # type: ignore[arg-type]


def test_too_many_sessions(dev: chm.Device) -> None:
    from chm import _lowlevel as ll

    opened = [dev.session(quota=1) for _ in range(ll.SESSION_MAX)]
    with pytest.raises(NoSpace):
        dev.session()
    opened.pop().close()
    opened.append(dev.session())
    for s in opened:
        s.close()


def test_close_releases_and_ends_views(dev: chm.Device) -> None:
    s = dev.session()
    hs = [s.prefetch(i * K4, K4) for i in range(6)]  # 4 slots, 2 queued
    view = hs[0].wait(1.0)
    arr = hs[1].array("u1", 1.0)
    with pytest.raises(ViewInUse):
        s.close()  # all or nothing: still open, nothing released
    assert not s.closed and not hs[0].released and _free(dev) == (0, 2)
    del arr
    s.close()
    s.close()  # idempotent
    assert [s.closed, all(h.released for h in hs)] == [True, True]
    with pytest.raises(ValueError):
        view[0]
    assert _free(dev) == (4, 0)
    with pytest.raises(StaleHandle):
        s.prefetch(0, K4)
    with pytest.raises(StaleHandle):
        hs[2].wait(0)
    hs[3].release()  # a no-op, as for any released handle


def test_close_wakes_a_waiter(dev: chm.Device) -> None:
    blocker = [dev.prefetch(i * K4, K4) for i in range(4)]
    s = dev.session()
    h = s.prefetch(10 * K4, K4)  # queued behind the default session's slots
    got: list[BaseException] = []

    def wait() -> None:
        try:
            h.wait(10.0)
        except BaseException as e:  # reported below
            got.append(e)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.05)
    s.close()
    t.join(5.0)
    assert not t.is_alive() and len(got) == 1 and isinstance(got[0], StaleHandle)
    dev.release_many(blocker)


def test_device_close_closes_sessions() -> None:
    d = chm.Device.open(capacity="1G", dram="1M", wbuf="256K", slot_size="4K", backend="ghost")
    s = d.session()
    h = s.prefetch(0, K4)
    v = h.wait(1.0)
    del v
    d.close()
    assert s.closed
    s.close()  # nothing left to do
    h.release()


def test_unclosed_session_closes_when_collected(dev: chm.Device) -> None:
    s = dev.session()
    s.prefetch_many([0, K4], [K4, K4])  # dropped Handles: released (ResourceWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del s
        gc.collect()
    assert _free(dev) == (4, 0)


def test_round_robin_grants() -> None:
    """One slot: a flooding session queues 6, another queues 1; the other's
    request gets the slot after one grant to the flooder, not after six."""
    d = chm.Device.open(
        capacity="1G", dram="1M", wbuf="256K", slot_size="4K", slots=1, refill_queue=16,
        backend="ghost",
    )  # fmt: skip
    with d, d.session() as flood, d.session() as other:
        fh = [flood.prefetch(i * K4, K4) for i in range(7)]
        oh = other.prefetch(100 * K4, K4)
        order = []
        cur = fh.pop(0)
        for _ in range(7):
            cur.release()
            if not oh.released and oh.ready():
                order.append("O")
                cur = oh
            else:
                order.append("F")
                cur = next(h for h in fh if h.ready())
                fh.remove(cur)
        cur.release()
        assert order == ["F", "O", "F", "F", "F", "F", "F"]


# ---- handle batches


def test_batch_statuses_and_elements(dev: chm.Device) -> None:
    addrs = [i * K4 for i in range(10)]
    lens = [K4] * 10
    lens[2] = 0
    b = dev.prefetch_batch(addrs, lens)
    assert len(b) == 10 and b.issued == 8 and not b.ok  # 4 slots + 4 queued
    st = b.statuses
    assert st.readonly and st.format == "i"
    assert st.tolist() == [0, 0, -22, 0, 0, 0, 0, 0, 0, -11]
    assert np.array_equal(np.asarray(st), np.array(st.tolist(), dtype=np.int32))
    assert isinstance(b.error(2), InvalidArgument) and b.error(0) is None
    assert isinstance(b.error(-1), WouldBlock)
    with pytest.raises(InvalidArgument):
        b[2]
    with pytest.raises(WouldBlock):
        b.token(9)
    with pytest.raises(IndexError):
        b[10]
    with pytest.raises(InvalidArgument):
        b[True]
    h = b[0]
    assert b[0] is h and dev.adopt(h.token) is h and h.token == b.token(0)
    assert len(b.wait(1, 1.0)) == K4
    b.release()
    assert b.released and h.released and _free(dev) == (4, 0)
    b.release()


def test_batch_release_is_all_or_nothing(dev: chm.Device) -> None:
    b = dev.prefetch_batch([0, K4, 2 * K4], [K4] * 3)
    v = b.wait(0, 1.0)
    arr = b.array(1, "u1", 1.0)
    with pytest.raises(ViewInUse):
        b.release()
    assert not b.released and _free(dev) == (1, 0)
    del arr
    b.release()
    with pytest.raises(ValueError):
        v[0]
    assert _free(dev) == (4, 0)


def test_batch_element_released_alone(dev: chm.Device) -> None:
    b = dev.prefetch_batch([0, K4], [K4, K4])
    b[1].release()
    assert _free(dev) == (3, 0)
    b.release()
    assert _free(dev) == (4, 0)


def test_batch_view_keeps_batch_alive(dev: chm.Device) -> None:
    b = dev.prefetch_batch([0, K4], [K4, K4])
    v = b.wait(0, 1.0)
    del b
    gc.collect()
    assert _free(dev) == (2, 0) and len(v) == K4  # still held under the view
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del v
        gc.collect()
    assert _free(dev) == (4, 0)


def test_unreleased_batch_warns(dev: chm.Device) -> None:
    b = dev.prefetch_batch([0, K4], [K4, K4])
    with pytest.warns(ResourceWarning, match="unreleased chm batch"):
        del b
        gc.collect()
    assert _free(dev) == (4, 0)


def test_batch_in_a_session(dev: chm.Device) -> None:
    s = dev.session(quota=3)
    b = s.prefetch_batch([0, K4, 2 * K4, 3 * K4], [K4] * 4)
    assert b.statuses.tolist() == [0, 0, 0, -11]
    v = b.wait(0, 1.0)
    s.close()  # releases the batch's elements and ends the view
    with pytest.raises(ValueError):
        v[0]
    assert _free(dev) == (4, 0)
    b.release()  # nothing left to release
    with pytest.raises(StaleHandle):
        s.prefetch_batch([0], [K4])


def test_batch_whole_call_errors(dev: chm.Device) -> None:
    with pytest.raises(InvalidArgument):
        dev.prefetch_batch([0, K4], [K4])
    with pytest.raises(InvalidArgument):
        dev.prefetch_batch([True], [K4])
    with pytest.raises(InvalidArgument):
        dev.prefetch_batch([-1], [K4])
    with pytest.raises(TypeError):
        dev.prefetch_batch(["0"], [K4])  # type: ignore[list-item]


def test_view_info_waits_up_to_its_timeout() -> None:
    """view_info() polls by default and waits up to ``timeout`` seconds when
    given one (a slow fill: not staged at once, staged within the wait)."""
    with chm.Device.open(capacity="64M", dram="1M", wbuf="256K", slot_size="4K", slots=4,
                         backend="pread") as d:  # fmt: skip
        d.inject_fault("slow", arg=200_000_000)  # every I/O 200 ms late
        with d.session() as s:
            h = s.prefetch(K4, K4)
            with pytest.raises(TimeoutError):
                d.view_info(h)
            addr, n, _off = d.view_info(h, 10.0)
            assert (addr, n) == (K4, K4)
            with pytest.raises(InvalidArgument):
                d.view_info(h, -1.0)
            h.release()
