"""Power cuts, replayed: every barrier of a seeded KV workload (puts,
removes, flushes, compactions, evictions) and random subsets of the writes
in flight there, each reopened on the real pread backend (see
:mod:`chm.testing.powercut`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chm.testing import powercut as pc


def test_every_acknowledged_block_survives_every_crash_state(tmp_backing: Path) -> None:
    log = pc.record(tmp_backing / "run", seed=1, ops=40)
    assert log.evicted > 0 and log.compactions > 0  # the workload reclaims and compacts
    (tmp_backing / "states").mkdir()
    rep = pc.replay(log, tmp_backing / "states", subsets=2, seed=1)
    assert rep.ok, (rep.lost[:5], rep.wrong[:5], rep.failed_open[:5])
    assert rep.barriers >= 20 and rep.states == 3 * rep.barriers
    assert rep.acked_checked > 100  # the states held acknowledged blocks to check


def test_the_check_finds_a_drive_that_drops_its_writes(tmp_backing: Path) -> None:
    """The negative control: replayed as a drive that acknowledges flushes
    but keeps nothing, acknowledged blocks are reported lost."""
    log = pc.record(tmp_backing / "run", seed=2, ops=25)
    (tmp_backing / "states").mkdir()
    rep = pc.replay(log, tmp_backing / "states", subsets=0, drop_durable=True)
    assert rep.lost and not rep.wrong
    assert any(op[0] == "gone" for op in log.ops) or rep.acked_checked > 0


@pytest.mark.slow
def test_power_cuts_over_a_long_workload(tmp_backing: Path) -> None:
    for seed in (3, 4):
        rep = pc.run(tmp_backing / str(seed), seed=seed, ops=250, subsets=4)
        assert rep.ok, (seed, rep.lost[:5], rep.wrong[:5], rep.failed_open[:5])
        assert rep.acked_checked > 1000
