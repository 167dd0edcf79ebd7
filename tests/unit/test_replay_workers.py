"""Concurrent workers in virtual time (chm.sim.replay.cxlhm): hand-computed schedules.

The device's timing is set so that every time is written out by hand: no
SSD or DRAM limits, a host link of 2,097,152,000 B/s with no latency, so one
1 MiB device block (a 16 MiB model block: scale 16) crosses in 0.5 ms of
device time, 8 ms of model time. A request of ten new blocks has no load
and saves its ten blocks in W = 80 ms; its prefill compute is C =
PREFILL.compute_s(1285, 0).
"""

from __future__ import annotations

from typing import Any

import pytest

import chm
from chm.sim.replay.cxlhm import CxlhmReplay, replay_cxlhm
from chm.sim.replay.prefill import GPUS, MODELS, PrefillModel
from chm.sim.workloads.records import Request

MiB = 1 << 20
PREFILL = PrefillModel(MODELS["llama-3.1-8b"], GPUS["a100-80g"])
N = 10  # blocks per request
C = PREFILL.compute_s(128 * N + 5, 0)
W = N * 16 * MiB / 2_097_152_000  # one request's saves, model s
# the device clock counts whole ns of device time: 16 ns of model time,
# a few roundings per request
TOL = 1e-7


def _dev(mode: str = "prefetch") -> chm.Device:
    kw: dict[str, Any] = dict(slot_size="1M", wbuf="64M") if mode == "prefetch" else {}
    return chm.Device.open(
        backend="ghost",
        clock="virtual",
        capacity="1G",
        mode=mode,
        dram="256M",
        link_bw_bps=2_097_152_000,
        **kw,
    )


def _req(i: int, arrival: float, session: int, turn: int = 0, think: float = 0.0) -> Request:
    keys = tuple(f"{i}.{k}".encode() for k in range(N))
    return Request(i, arrival, 128 * N + 5, 1, 128, keys, session=session, turn=turn, think_s=think)


def _run(reqs: list[Request], mode: str = "prefetch", **kw: Any) -> dict[int, Any]:
    with _dev(mode) as dev:
        rp = CxlhmReplay(
            dev, f"cxlhm-{mode}", PREFILL, gpu_cache=False, device_block_bytes=MiB, **kw
        )
        res = replay_cxlhm(reqs, rp)
        assert dev.stats().wr_skipped == 0
    return {r.result.index: r for r in res}


def test_w_is_what_the_link_gives() -> None:
    assert pytest.approx(0.08) == W
    res = _run([_req(0, 0.0, 0)], open_loop=True)[0]
    assert res.clock_end_s * 16 == pytest.approx(C + W, abs=TOL)


@pytest.mark.parametrize("mode", ["prefetch", "lru"])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_four_overlapping_requests_open_loop(workers: int, mode: str) -> None:
    # Four requests 50 ms apart, sessions 0..3 on worker session % workers.
    # A worker serves one request at a time: start = max(arrival, its
    # previous end). Its first token comes C later (nothing to load); its
    # saves are due then but the link carries one request's saves at a
    # time: they begin at max(first token, previous saves' end) and take W.
    # In lru mode a write pays the same host->DRAM link (its write-back to
    # the SSD, unlimited here, does not hold the caller).
    gap = 0.05
    reqs = [_req(i, gap * i, session=i) for i in range(4)]
    got = _run(reqs, mode, open_loop=True, workers=workers)
    free = [0.0] * workers
    link = 0.0
    for i in range(4):
        w = i % workers
        start = max(gap * i, free[w])
        first = start + C
        save = max(first, link)
        end = link = free[w] = save + W
        r = got[i]
        assert r.result.worker == w
        assert r.queue_s == pytest.approx(start - gap * i, abs=TOL)
        assert r.first_token_s == pytest.approx(first, abs=TOL)
        assert r.save_wait_s == pytest.approx(save - first, abs=TOL)
        assert r.clock_end_s * 16 == pytest.approx(end, abs=TOL)
        assert r.ttft_s == pytest.approx(first - gap * i, abs=TOL)
    # the numbers themselves, for the record: one worker queues them all
    ends = sorted(r.clock_end_s * 16 for r in got.values())
    if workers == 1:
        assert ends == pytest.approx([(k + 1) * (C + W) for k in range(4)], abs=TOL)
    if workers == 4:
        # C + W, then the link: one W after the other
        assert ends == pytest.approx([C + W * (k + 1) for k in range(4)], abs=TOL)


def test_closed_loop_next_turn_waits_for_the_answer_plus_think_time() -> None:
    # Session 0: turn 0 at 0, turn 1 0.3 s after turn 0's first token (its
    # trace arrival 0.01 is ignored). Session 1: one turn at its trace time
    # 0.05, on worker 1.
    reqs = [_req(0, 0.0, 0), _req(1, 0.01, 0, turn=1, think=0.3), _req(2, 0.05, 1)]
    got = _run(reqs, closed_loop=True, workers=2)
    assert got[0].first_token_s == pytest.approx(C, abs=TOL)
    assert got[2].first_token_s == pytest.approx(0.05 + C, abs=TOL)
    assert got[2].save_wait_s == pytest.approx(C + W - (0.05 + C), abs=TOL)
    assert got[1].result.arrival_s == pytest.approx(C + 0.3, abs=TOL)
    assert got[1].queue_s == pytest.approx(0.0, abs=TOL)
    assert got[1].first_token_s == pytest.approx(2 * C + 0.3, abs=TOL)
    # open loop takes the trace's 0.01: turn 1 queues behind turn 0
    opened = _run(reqs, open_loop=True, workers=2)
    assert opened[1].result.arrival_s == pytest.approx(0.01)
    assert opened[1].queue_s == pytest.approx(C + W - 0.01, abs=TOL)


def test_a_load_waits_for_the_device_and_says_so() -> None:
    # Request 1 (worker 1) reloads request 0's ten blocks. It starts at
    # 0.2, during request 0's saves (C + W > 0.2 > C): its load waits for
    # them to end (one call at a time), and device_wait_s says how long.
    keys = tuple(f"0.{k}".encode() for k in range(N))
    reqs = [_req(0, 0.0, 0), Request(1, 0.2, 128 * N + 5, 1, 128, keys, session=1, turn=0)]
    assert C < 0.2 < C + W
    got = _run(reqs, open_loop=True, workers=2)
    assert got[1].result.tier_hit_blocks == N
    assert got[1].device_wait_s == pytest.approx(C + W - 0.2, abs=TOL)
    assert got[1].result.load_s > 0
    assert got[1].first_token_s == pytest.approx(
        C + W + got[1].result.load_s + got[1].result.compute_s, abs=TOL
    )


def test_closed_loop_needs_sessions_and_turns() -> None:
    r = Request(0, 0.0, 133, 1, 128, (b"a",))
    with _dev() as dev, pytest.raises(ValueError, match="session/turn"):
        replay_cxlhm(
            [r],
            CxlhmReplay(
                dev,
                "cxlhm-prefetch",
                PREFILL,
                gpu_cache=False,
                device_block_bytes=MiB,
                closed_loop=True,
            ),
        )


class _NoAdvance:
    """A device that does not offer advance_clock (as a client of a device
    elsewhere may not): a stand-in wrapping a real device, since every chm
    device in virtual time has one."""

    def __init__(self, dev: chm.Device) -> None:
        self._dev = dev

    def __getattr__(self, name: str) -> Any:
        if name == "advance_clock":
            raise AttributeError(name)
        return getattr(self._dev, name)


@pytest.mark.parametrize("loop", ["open_loop", "closed_loop"])
def test_a_loop_needs_a_device_whose_clock_advances(loop: str) -> None:
    with _dev() as dev, pytest.raises(ValueError, match="clock advances"):
        CxlhmReplay(
            _NoAdvance(dev),
            "cxlhm-prefetch",
            PREFILL,
            open_loop=loop == "open_loop",
            closed_loop=loop == "closed_loop",
        )
