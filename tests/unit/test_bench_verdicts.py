"""Benchmarks end with their verdicts: the lines are printed last, and a
missed target is a non-zero exit status (tools/bench/_benchlib.Verdicts)."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import _benchlib as bl
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_all_met_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    v = bl.Verdicts("demo-bench")
    assert v.check("speedup", 2.0, 1.5) == "met"
    assert v.check("latency ms", 3.0, 5.0, higher=False, fmt=lambda x: f"{x:g}") == "met"
    assert v.finish() == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "demo-bench: all 2 targets met"
    assert lines[-3] == "  met: speedup = 2.00x (target >= 1.50x)"
    assert lines[-2] == "  met: latency ms = 3 (target <= 5)"


def test_a_miss_exits_one_and_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    v = bl.Verdicts("demo-bench")
    v.check("speedup", 1.2, 1.5)
    v.check("kept", 0.95, 0.9)
    assert v.check("no data", math.nan, 1.0) == "MISSED (no data)"
    assert [t.name for t in v.missed] == ["speedup", "no data"]
    assert v.finish() == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "demo-bench: MISSED 2 of 3 targets (speedup, no data)"
    assert v.to_dict()["all_met"] is False


def test_nothing_measured_is_not_a_miss(capsys: pytest.CaptureFixture[str]) -> None:
    assert bl.Verdicts("demo-bench").finish() == 0
    assert "no target was measured" in capsys.readouterr().out


def test_quick_judges_speed_figures_as_smoke_targets(capsys: pytest.CaptureFixture[str]) -> None:
    v = bl.Verdicts("demo-bench", quick=True)
    assert v.check("speedup", 0.01, 1.5, speed=True) == "met"  # measured: the code works
    assert v.check("p99 ms", 900.0, 5.0, higher=False, speed=True) == "met"
    assert v.check("blocks lost", 0, 0, higher=False) == "met"  # correctness keeps its target
    assert v.finish() == 0
    out = capsys.readouterr().out
    assert "--quick smoke target: a figure above zero; a full run's target is >= 1.50x" in out
    # a smoke target still fails when nothing (or nothing positive) was measured,
    # and correctness figures are judged as in a full run
    v = bl.Verdicts("demo-bench", quick=True)
    v.check("speedup", math.nan, 1.5, speed=True)
    v.check("rate", 0.0, 1.5, speed=True)
    v.check("p99 ms", math.inf, 5.0, higher=False, speed=True)
    v.check("blocks lost", 1, 0, higher=False)
    assert [t.name for t in v.missed] == ["speedup", "rate", "p99 ms", "blocks lost"]
    assert v.finish() == 1
    assert v.to_dict()["quick"] is True
    # the same figures in a full run are judged against their targets
    v = bl.Verdicts("demo-bench")
    v.check("speedup", 0.01, 1.5, speed=True)
    assert [t.name for t in v.missed] == ["speedup"]


def _refill_bw(tmp: Path, *extra: str, quick: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (scripts/setup.sh test installs it)")
    args = [
        sys.executable,
        str(ROOT / "tools/bench/refill_bw.py"),
        "--quick" if quick else "--reps=1",
        "--size=32M",
        "--object-size=4M",
        "--window=2",
        "--no-pread",
        "--cycle-seconds=0.05",
        f"--file={tmp / 'refill.img'}",
        *extra,
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def test_refill_bw_missed_target_fails_with_verdicts_last(tmp_backing: Path) -> None:
    """A full run (not --quick) judges speed figures against their targets."""
    proc = _refill_bw(tmp_backing, "--target-cycles=1e12", "--target-ratio=0.0001", quick=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("refill_bw: MISSED 2 of 3 targets (prefetch cycles/s")
    assert lines[-5] == "refill_bw verdicts:"


def test_refill_bw_quick_judges_smoke_targets(tmp_backing: Path) -> None:
    """Targets no host meets: a --quick run still exits 0, because the code worked;
    the profile asked for comes before the verdicts, never after."""
    proc = _refill_bw(tmp_backing, "--target-cycles=1e12", "--target-ratio=1e6", "--profile")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    lines = out.strip().splitlines()
    assert lines[-1] == "refill_bw: all 3 targets met"
    assert lines[-5] == "refill_bw verdicts (--quick: speed figures judged as smoke targets):"
    assert "cProfile of the 'explicit' loop" in out
    assert out.rindex("cProfile") < out.rindex("refill_bw verdicts")


def test_refill_bw_met_targets_exit_zero_without_profile(tmp_backing: Path) -> None:
    proc = _refill_bw(tmp_backing, "--target-cycles=1", "--target-ratio=0.0001", quick=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "refill_bw: all 3 targets met"
    assert "cProfile" not in proc.stdout
