"""chm.sim.replay.sensitivity: the prefetch/lru ratio under alternative modeling choices."""

from __future__ import annotations

import pytest

from chm.sim.replay import configure
from chm.sim.replay.cxlhm_run import GhostSetup, open_ghost, replay_virtual
from chm.sim.replay.sensitivity import (
    Choice,
    RatioPoint,
    describe,
    load_bw,
    one_at_a_time,
    ratio_sweep,
)
from chm.sim.workloads import ChatWorkload, generate_chat

KiB, MiB = 1 << 10, 1 << 20


def test_one_at_a_time_varies_one_choice_and_keeps_the_used_first() -> None:
    used = Choice("fpga-cxlhm", 64 * KiB, 64)
    cs = one_at_a_time(
        used, timings=["fpga-cxlhm", "gen5-tlc-200g"], lru_lines=[64 * KiB, MiB], scales=[128]
    )
    assert cs == [
        used,
        Choice("gen5-tlc-200g", 64 * KiB, 64),
        Choice("fpga-cxlhm", MiB, 64),
        Choice("fpga-cxlhm", 64 * KiB, 128),
    ]


def test_describe_names_the_used_choice_and_what_each_alternative_changes() -> None:
    used = Choice("fpga-cxlhm", 64 * KiB, 1)
    pts = [
        RatioPoint(used, 1.0, 2.05),
        RatioPoint(Choice("fpga-cxlhm", MiB, 1), 2.0, 2.92),
    ]
    assert pts[1].ratio == pytest.approx(1.46)
    assert describe(pts, 1.5) == (
        "lru line 64 KiB, scale 1, fpga-cxlhm: 2.05x; lru line 1 MiB: 1.46x (>= 1.50x in 1 of 2)"
    )
    assert RatioPoint(used, 0.0, 1.0).ratio == 0.0
    # a choice whose lru replay loaded nothing says so, not "0.00x"
    none = [pts[0], RatioPoint(Choice("fpga-cxlhm", MiB, 1), 0.0, 2.0)]
    assert describe(none, 1.5) == (
        "lru line 64 KiB, scale 1, fpga-cxlhm: 2.05x; "
        "lru line 1 MiB: not measured (no lru loads) (>= 1.50x in 1 of 2)"
    )


def test_the_lru_line_reaches_the_device_and_bad_lines_are_errors() -> None:
    with open_ghost(GhostSetup(scale=64, lru_line_bytes=MiB), "lru", 256 * KiB) as dev:
        assert dev.config["lru_line"] == MiB
    with pytest.raises(ValueError, match="power of two"):
        GhostSetup(lru_line_bytes=3000)


def test_ratio_sweep_replays_each_choice_and_shares_prefetch_runs() -> None:
    reqs = generate_chat(ChatWorkload(users=2, turns=2, user_tokens=(512, 1024), seed=1))
    pm = configure().prefill
    setup = GhostSetup(scale=64)
    used = Choice.of(setup)
    choices = one_at_a_time(used, lru_lines=[256 * KiB])
    pts = ratio_sweep(reqs, pm, setup, choices, hbm_kv_bytes=16 * MiB)
    assert [p.choice for p in pts] == choices
    # prefetch mode has no line: one run for both points
    assert pts[0].prefetch_bw_Bps == pts[1].prefetch_bw_Bps > 0
    # each lru point is the replay of its own device
    for p in pts:
        rs = replay_virtual(reqs, "cxlhm-lru", pm, p.choice.apply(setup), hbm_kv_bytes=16 * MiB)
        assert p.lru_bw_Bps == load_bw(rs) > 0
    # a known point is taken as it is
    fake = RatioPoint(used, 1.0, 3.0)
    again = ratio_sweep(reqs, pm, setup, [used], known={used: fake})
    assert again == [fake]
