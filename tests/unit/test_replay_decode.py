"""Decode instances in the event queue (chm.sim.replay.cxlhm): hand-computed schedules.

The device is test_replay_workers.py's (times written out by hand: a
request's saves take W = 80 ms of model time, its prefill C). A request's KV
is K = 1285 tokens x 128 KiB; the PD links are set so that it crosses a
prefill worker's link in 0.1 s and holds the decode NIC 0.08 s; a decode
step is 0.05 s.
"""

from __future__ import annotations

from typing import Any

import pytest

import chm
from chm.sim.replay.cxlhm import CxlhmReplay, replay_cxlhm
from chm.sim.replay.decode import DecodeModel
from chm.sim.replay.params import apply_overrides, param_rows
from chm.sim.replay.prefill import GPUS, MODELS, PrefillModel
from chm.sim.workloads.records import Request

MiB = 1 << 20
PREFILL = PrefillModel(MODELS["llama-3.1-8b"], GPUS["a100-80g"])
N = 10  # blocks per request
C = PREFILL.compute_s(128 * N + 5, 0)
W = N * 16 * MiB / 2_097_152_000  # one request's saves, model s
TOL = 1e-7  # the device clock's whole ns: 16 ns of model time, a few roundings

K = 1285 * PREFILL.model.kv_bytes_per_token
PD = K / 0.1  # a worker's PD link: 0.1 s per request's KV
NIC = K / 0.08  # the decode NIC: 0.08 s per request's KV
STEP = 0.05


def _dev() -> chm.Device:
    return chm.Device.open(
        backend="ghost",
        clock="virtual",
        capacity="1G",
        mode="prefetch",
        dram="256M",
        link_bw_bps=2_097_152_000,
        slot_size="1M",
        wbuf="64M",
    )


def _req(i: int, arrival: float, session: int, turn: int = 0, think: float = 0.0) -> Request:
    keys = tuple(f"{i}.{k}".encode() for k in range(N))
    return Request(i, arrival, 128 * N + 5, 1, 128, keys, session=session, turn=turn, think_s=think)


def _run(reqs: list[Request], decode: DecodeModel | None, **kw: Any) -> dict[int, Any]:
    with _dev() as dev:
        rp = CxlhmReplay(
            dev,
            "cxlhm-prefetch",
            PREFILL,
            gpu_cache=False,
            device_block_bytes=MiB,
            decode=decode,
            **kw,
        )
        res = replay_cxlhm(reqs, rp)
    return {r.result.index: r for r in res}


def test_pd_link_and_decode_worker_both_queue() -> None:
    # 2 prefill workers, 1 decode worker, 3 decode steps a request.
    # r0 (w0) and r1 (w1) arrive at 0 and end their prefills together at C.
    # r0's KV takes the NIC first: C .. C+0.08 on the NIC, C+0.1 (its
    # sender's link) at the decode node; r1's waits for the NIC: C+0.08 ..
    # C+0.16, at the decode node at C+0.16 (pd 0.16). The decode worker runs
    # r0 from C+0.1 (first token C+0.15, end C+0.25), then r1 from C+0.25
    # (queued 0.09; first token C+0.30, end C+0.40). r2 (w0, arrives 0.01)
    # starts when r0's saves end (C+W), ends its prefill at 2C+W, its KV
    # arrives 0.1 later with the NIC free and waits for r1's decode to end
    # at C+0.40.
    assert C < 0.22  # r2's KV (2C+W+0.1) arrives before C+0.40
    reqs = [_req(0, 0.0, 0), _req(1, 0.0, 1), _req(2, 0.01, 2)]
    dm = DecodeModel(workers=1, tokens=3, step_s=STEP, pd_link_Bps=PD, decode_nic_Bps=NIC)
    got = _run(reqs, dm, open_loop=True, workers=2)
    want = {
        # index: (queue, pd transfer, decode queue, first token, decode end)
        0: (0.0, 0.1, 0.0, C + 0.15, C + 0.25),
        1: (0.0, 0.16, 0.09, C + 0.30, C + 0.40),
        2: (C + W - 0.01, 0.1, 0.22 - C, C + 0.45, C + 0.55),
    }
    arrival = {0: 0.0, 1: 0.0, 2: 0.01}
    for i, (queue, pd, dq, first, end) in want.items():
        r = got[i]
        assert r.result.worker == i % 2
        assert r.decode_worker == 0
        assert r.queue_s == pytest.approx(queue, abs=TOL)
        assert r.pd_transfer_s == pytest.approx(pd, abs=TOL)
        assert r.decode_queue_s == pytest.approx(dq, abs=TOL)
        assert r.decode_step_s == STEP
        assert r.first_token_s == pytest.approx(first, abs=TOL)
        assert r.decode_end_s == pytest.approx(end, abs=TOL)
        assert r.ttft_s == pytest.approx(first - arrival[i], abs=TOL)
        row = r.row()
        assert row["pd_transfer_s"] == r.pd_transfer_s
        assert row["ttft_queued_s"] == r.ttft_s
    # the saves go to the tier at the prefill's end, as without decode
    assert got[1].save_wait_s == pytest.approx(W, abs=TOL)


def test_two_decode_workers_split_by_session() -> None:
    # the same three requests on two decode workers: r1 goes to decode
    # worker 1 and does not wait for r0; r2 (session 2) queues on worker 0
    # only if r0 were still decoding (it ended at C+0.25 < 2C+W+0.1)
    reqs = [_req(0, 0.0, 0), _req(1, 0.0, 1), _req(2, 0.01, 2)]
    dm = DecodeModel(workers=2, tokens=3, step_s=STEP, pd_link_Bps=PD, decode_nic_Bps=NIC)
    got = _run(reqs, dm, open_loop=True, workers=2)
    assert [got[i].decode_worker for i in range(3)] == [0, 1, 0]
    assert got[1].decode_queue_s == pytest.approx(0.0, abs=TOL)
    assert got[1].first_token_s == pytest.approx(C + 0.16 + STEP, abs=TOL)
    assert got[2].decode_queue_s == pytest.approx(0.0, abs=TOL)
    assert got[2].first_token_s == pytest.approx(2 * C + W + 0.1 + STEP, abs=TOL)


def test_a_workers_own_pd_link_queues_its_next_transfer() -> None:
    # one prefill worker, two requests back to back: r1's prefill ends at
    # 2C+W; with a slow PD link (0.5 s a transfer) r0's KV still holds it
    # until C+0.5, so r1's leaves then
    slow = K / 0.5
    assert 2 * C + W < C + 0.5
    reqs = [_req(0, 0.0, 0), _req(1, 0.0, 1)]
    dm = DecodeModel(workers=1, step_s=STEP, pd_link_Bps=slow, decode_nic_Bps=NIC)
    got = _run(reqs, dm, open_loop=True, workers=1)
    assert got[0].pd_transfer_s == pytest.approx(0.5, abs=TOL)
    assert got[1].pd_transfer_s == pytest.approx(C + 1.0 - (2 * C + W), abs=TOL)
    assert got[1].first_token_s == pytest.approx(C + 1.0 + STEP, abs=TOL)


def test_closed_loop_next_turn_follows_the_decoded_first_token() -> None:
    reqs = [_req(0, 0.0, 0), _req(1, 0.0, 0, turn=1, think=0.3)]
    dm = DecodeModel(workers=1, step_s=STEP, pd_link_Bps=PD, decode_nic_Bps=NIC)
    got = _run(reqs, dm, closed_loop=True)
    assert got[0].first_token_s == pytest.approx(C + 0.1 + STEP, abs=TOL)
    assert got[1].result.arrival_s == pytest.approx(C + 0.1 + STEP + 0.3, abs=TOL)


def test_default_step_is_the_prefill_models_one_token() -> None:
    dm = DecodeModel(workers=1, pd_link_Bps=PD, decode_nic_Bps=NIC)
    got = _run([_req(0, 0.0, 0)], dm, open_loop=True)
    assert got[0].decode_step_s == PREFILL.compute_s(1, 1285)
    assert got[0].first_token_s == pytest.approx(C + 0.1 + PREFILL.compute_s(1, 1285), abs=TOL)


def test_no_decode_workers_is_the_prefill_only_replay() -> None:
    reqs = [_req(0, 0.0, 0), _req(1, 0.0, 1), _req(2, 0.01, 2)]
    plain = _run(reqs, None, open_loop=True, workers=2)
    zero = _run(reqs, DecodeModel(workers=0), open_loop=True, workers=2)
    assert [plain[i].row() for i in range(3)] == [zero[i].row() for i in range(3)]
    assert "pd_transfer_s" not in plain[0].row()
    assert plain[0].first_token_s == pytest.approx(C, abs=TOL)


def test_decode_parameters_print_override_and_refuse_bad_values() -> None:
    names = [row[0] for row in param_rows(DecodeModel())]
    assert names == ["workers", "tokens", "step_s", "pd_link_Bps", "decode_nic_Bps"]
    dm = apply_overrides(DecodeModel(), {"workers": "1", "step_s": "0.02"})
    assert (dm.workers, dm.step_s) == (1, 0.02)
    for bad in ({"workers": "-1"}, {"tokens": "0"}, {"pd_link_Bps": "0"}):
        with pytest.raises(ValueError, match="DecodeModel"):
            apply_overrides(DecodeModel(), bad)
    with _dev() as dev, pytest.raises(ValueError, match="open_loop or closed_loop"):
        CxlhmReplay(dev, "cxlhm-prefetch", PREFILL, decode=DecodeModel(workers=1))
