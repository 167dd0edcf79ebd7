"""Each daemon client is a C device session: its quota is enforced by the
device (WouldBlock past it, others unaffected), one client flooding the
refill queue does not starve another (round-robin grants), and a
disconnect releases the client's session in one call."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import chm
from chm.errors import StaleHandle, WouldBlock
from chm.remote.protocol import Op
from chm.testing.daemon_proc import DaemonProcess

OBJ = 4096
QUOTA = 6


def serve_args(tmp: Path, *extra: str) -> list[str]:
    # 4 slots and a 16-entry queue: one client's quota (6) can hold every
    # slot, so another's prefetch queues behind it
    conf = tmp / "serve.toml"
    conf.write_text('[device]\nwbuf = "256K"\nslots = 4\nrefill_queue = 16\n')
    return [
        "--config", str(conf), "--target", str(tmp / "t0.img"), "--create",
        "--capacity", "64M", "--dram", "1M", "--slot-size", "64K", "--backend", "pread",
        "--no-kv", "--client-quota", str(QUOTA), *extra,
    ]  # fmt: skip


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with DaemonProcess(serve_args(tmp_path), tmp_path / "chm.sock") as d:
        yield d


def test_client_quota_is_enforced(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as a, chm.connect(daemon.socket) as b:
        hs = [a.prefetch(i * OBJ, OBJ) for i in range(QUOTA)]
        with pytest.raises(WouldBlock):
            a.prefetch(QUOTA * OBJ, OBJ)
        # over the quota a batch element is refused as prefetch() is
        (got,) = a.prefetch_many([0], [OBJ])
        assert isinstance(got, WouldBlock), got
        # another client has its own quota (queued: a holds every slot)
        hb = [b.prefetch(i * OBJ, OBJ) for i in range(QUOTA)]
        assert b.stats().queue_len == QUOTA + 2
        b.release_many(hb)
        # the release goes unanswered (protocol v4): an answered call on the
        # same connection is processed after it
        b.ping()
        a.release_many(hs[:1])
        hs[0] = a.prefetch(0, OBJ)  # one back under the quota
        assert a.daemon_stats()["held"]["handles"] == QUOTA
        with pytest.raises(WouldBlock):
            a.prefetch(QUOTA * OBJ, OBJ)
        a.release_many(hs)


def test_flooding_client_does_not_starve_another(daemon: DaemonProcess) -> None:
    """Client a tries to keep every request entry of the device (4 slots +
    16 queued) outstanding, waiting on and releasing the oldest: its quota
    refuses it past 6, so client b's prefetches are never refused (without
    the quota a would hold the whole queue and b would get WouldBlock) and
    each is staged within the wait."""
    stop = threading.Event()
    flooded = [0]
    refused = [0]
    errors: list[BaseException] = []

    def flood() -> None:
        try:
            with chm.connect(daemon.socket) as a:
                live: list[chm.remote.RemoteHandle] = []
                i = 0
                while not stop.is_set():
                    while len(live) < 4 + 16:
                        try:
                            live.append(a.prefetch((i % 1000) * OBJ, OBJ))
                        except WouldBlock:
                            refused[0] += 1
                            break
                        i += 1
                    h = live.pop(0)
                    a.wait_many([h], timeout=10.0)
                    a.release_many([h])
                    flooded[0] += 1
                a.release_many(live)
        except BaseException as e:  # reported below
            errors.append(e)

    with chm.connect(daemon.socket) as b:
        t = threading.Thread(target=flood, daemon=True)
        t.start()
        try:
            deadline = time.monotonic() + 10
            while flooded[0] < 20 and time.monotonic() < deadline:
                time.sleep(0.01)
            lat = []
            for i in range(30):
                t0 = time.perf_counter()
                h = b.prefetch((2000 + i) * OBJ, OBJ)  # WouldBlock here is starvation
                b.wait_many([h], timeout=10.0)
                lat.append(time.perf_counter() - t0)
                b.release_many([h])
        finally:
            stop.set()
            t.join(30)
        assert not errors, errors
        assert flooded[0] >= 20, f"the flooder ran only {flooded[0]} prefetches"
        assert refused[0] > 0, "the flooder was never held to its quota"
        assert max(lat) < 5.0, f"b waited {max(lat):.2f} s behind the flood"
        assert b.daemon_stats()["held"]["handles"] == 0


def test_disconnect_closes_the_session(daemon: DaemonProcess) -> None:
    a = chm.connect(daemon.socket)
    hs = [a.prefetch(i * OBJ, OBJ) for i in range(QUOTA)]
    a.wait_many(hs[:4], timeout=10.0)  # the 4 slots held, 2 queued
    with chm.connect(daemon.socket) as b:
        st = b.stats()
        assert st.slots_held == 4 and st.queue_len == QUOTA - 4
        a.close()
        for _ in range(200):
            if b.stats().slots_held == 0 and b.daemon_stats()["held"]["clients"] == 1:
                break
            time.sleep(0.02)
        st = b.stats()
        assert st.slots_held == 0 and st.slots_free == st.slots_total and st.queue_len == 0
        # a's quota is gone with it: b can take its own
        hb = [b.prefetch(i * OBJ, OBJ) for i in range(QUOTA)]
        b.release_many(hb)


def test_tokens_the_client_does_not_hold(daemon: DaemonProcess) -> None:
    """An already released token is StaleHandle
    on wait and on release, with no effect on what the client holds; an
    unknown prefetch flag is refused as the device refuses it."""
    with chm.connect(daemon.socket) as a:
        h = a.prefetch(0, OBJ)
        assert len(h.wait(5.0)) == OBJ
        assert a.daemon_stats()["held"]["handles"] == 1
        h.release()
        with pytest.raises(StaleHandle):
            a.adopt(h.token).wait(0)
        with pytest.raises(StaleHandle):
            a.adopt(h.token).release()
        assert a.daemon_stats()["held"]["handles"] == 0
        ((rc, tok),) = a._call(Op.PREFETCH, [[0, OBJ, 4]])
        assert (rc, tok) == (-errno.EINVAL, 0)
        ((rc, tok),) = a._call(Op.PREFETCH, [[0, OBJ, 1]])  # NOQUEUE: a slot is free
        assert rc == 0
        assert a._call(Op.RELEASE, [tok]) == [0]


def test_retain_flag_reaches_the_device(daemon: DaemonProcess) -> None:
    """retain=True passes the scope's flag check (CHM_PF_RETAIN) and is
    answered as the embedded device answers it."""
    with chm.connect(daemon.socket) as a, a.prefetch(0, OBJ, retain=True) as h:
        assert len(h.wait(5.0)) == OBJ
