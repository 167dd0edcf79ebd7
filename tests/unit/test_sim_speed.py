"""tools/replay/sim_speed.py in a reduced size: runs, reports, verdicts last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "replay" / "sim_speed.py"


def test_sim_speed_reduced(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    args = ["--users", "3", "--turns", "2", "--capacities", "64G,512G", "--dram", "4G"]
    p = subprocess.run(
        [sys.executable, str(TOOL), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # a tiny run misses the 1,000,000-access target: exit 1, verdicts last
    assert p.returncode == 1, p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("sim_speed: MISSED")
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert {(r["mode"], r["capacity"]) for r in runs} == {
        (m, c) for m in ("prefetch", "lru") for c in (64 << 30, 512 << 30)
    }
    for r in runs:
        assert r["accesses"] == r["reads"] + r["writes"] > 0
        assert r["wall_s"] > 0 and r["rss_peak"] > 0
    # the same workload on every device: the same accesses whatever the capacity
    by_mode = {m: {r["accesses"] for r in runs if r["mode"] == m} for m in ("prefetch", "lru")}
    assert all(len(v) == 1 for v in by_mode.values()), by_mode
    names = [t["name"] for t in doc["verdicts"]["targets"]]
    assert "prefetch peak RSS 512 GiB / 64 GiB" in names


def test_sim_speed_with_concurrent_workers(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    args = ["--users", "4", "--turns", "2", "--capacities", "64G", "--dram", "4G"]
    p = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            *args,
            "--modes",
            "prefetch",
            "--workers",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1, p.stderr  # far from a million accesses
    assert "open loop, 2 worker(s)" in p.stdout
    (run,) = json.loads(out.read_text())["runs"]
    assert run["workers"] == 2 and run["accesses"] > 0
