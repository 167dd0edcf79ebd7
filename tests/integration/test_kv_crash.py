"""Crash recovery: writers killed with SIGKILL at random moments lose no acknowledged block.

5 rounds per backend by default; 30 with HYPOTHESIS_PROFILE=nightly and in the
slow tier's long sweep (`make test-all`), or CHM_KV_CRASH_ROUNDS=N. CHM_KV_CRASH_SEED
fixes the kill times (printed).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from chm.testing.kv_crash import run_rounds


def _rounds() -> int:
    env = os.environ.get("CHM_KV_CRASH_ROUNDS")
    if env:
        return int(env)
    return 30 if os.environ.get("HYPOTHESIS_PROFILE") == "nightly" else 5


def test_sigkill_loses_no_acknowledged_block(tmp_backing: Path, data_backend: str) -> None:
    _sweep(tmp_backing, data_backend, _rounds())


@pytest.mark.slow
def test_sigkill_long_sweep_loses_no_acknowledged_block(
    tmp_backing: Path, data_backend: str
) -> None:
    """The slow tier's crash sweep: 30 rounds (CHM_KV_CRASH_ROUNDS overrides)."""
    _sweep(tmp_backing, data_backend, int(os.environ.get("CHM_KV_CRASH_ROUNDS") or 30))


def _sweep(tmp_backing: Path, data_backend: str, rounds: int) -> None:
    seed = int(os.environ.get("CHM_KV_CRASH_SEED") or random.randrange(1 << 30))
    print(f"crash test: {rounds} rounds on {data_backend}, CHM_KV_CRASH_SEED={seed}")
    res = run_rounds(tmp_backing / "crash", rounds, seed=seed, backend=data_backend)
    print(res)
    assert res.rounds == rounds
    assert res.acknowledged > 0, "no block was acknowledged: the writer never got going"
    assert res.lost == 0, f"{res.lost} acknowledged blocks lost (seed {seed})"
    assert res.wrong == 0, f"{res.wrong} blocks with wrong bytes (seed {seed})"
    assert res.recovered == res.acknowledged
    assert res.bytes_checked >= res.acknowledged * (16 << 10)  # every acked block was read back
    assert res.kills_while_writing >= 1, "every kill came after the writer had finished"
