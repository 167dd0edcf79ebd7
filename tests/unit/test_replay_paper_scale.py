"""tools/replay/paper_scale.py in a reduced size, and its ghost setup."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chm.sim.replay import configure
from chm.sim.replay.cxlhm_run import GhostSetup, replay_virtual
from chm.sim.workloads import ChatWorkload, generate_chat

TOOL = Path(__file__).resolve().parents[2] / "tools" / "replay" / "paper_scale.py"


def test_paper_scale_reduced_covers_seven_systems(tmp_path: Path) -> None:
    args = [
        "--users",
        "2",
        "--turns",
        "2",
        "--workers",
        "1",
        "--scale",
        "64",
        "--no-plots",
        "--hbm-kv",
        "64M",
        "--wbuf-sweep",
        "256M,1G",
        "--sweep-lru-lines",
        "256K",
        "--sweep-scales",
        "",
        "--sweep-timings",
        "",
    ]
    p = subprocess.run(
        [sys.executable, str(TOOL), *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode in (0, 1), p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("paper_scale: ")
    assert ("all 4 targets met" in last) == (p.returncode == 0)
    doc = json.loads((tmp_path / "results.json").read_text())
    systems = {t["system"] for t in doc["per_turn"]}
    assert len(systems) == 7 and {"cxlhm-lru", "cxlhm-prefetch"} <= systems
    sweep = doc["wbuf_sweep"]
    assert [p["wbuf_bytes"] for p in sweep] == [256 << 20, 1 << 30]
    assert all(0 <= p["skip_rate"] <= 1 and p["writes_offered"] > 0 for p in sweep)
    assert doc["wbuf_sweep_repeats"] is True  # the flusher runs on the simulated clock
    prefix = doc["host_prefix"]
    assert set(prefix) == {"paper design (reload)", "host prefix buffer"}
    # the host buffer only takes loads off the device, never adds any
    assert (
        prefix["host prefix buffer"]["device_load_bytes"]
        <= prefix["paper design (reload)"]["device_load_bytes"]
    )
    bw = doc["load_bw_Bps"]
    assert doc["prefetch_over_lru"] == pytest.approx(bw["cxlhm-prefetch"] / bw["cxlhm-lru"])
    # the verdict names its modeling choice and the alternative replayed
    assert doc["modeling_choice"] == {"timing": "fpga-cxlhm", "lru_line_bytes": 65536, "scale": 64}
    by = doc["prefetch_over_lru_by_choice"]
    assert [c["lru_line_bytes"] for c in by] == [65536, 262144]
    assert by[0]["ratio"] == pytest.approx(doc["prefetch_over_lru"])
    verdict = next(ln for ln in p.stdout.splitlines() if "prefetch/lru load bandwidth [" in ln)
    assert "lru line 64 KiB, scale 64, fpga-cxlhm" in verdict and "lru line 256 KiB" in verdict
    assert "[none loop, 1 workers;" in verdict and doc["loop"] == "none"


def test_quick_is_a_smoke_run_judged_on_smoke_targets_with_json(tmp_path: Path) -> None:
    """--quick replays every system at smoke size and exits 0; --json without
    --out gets results.json's document, verdicts included."""
    out = tmp_path / "quick.json"
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, str(TOOL), "--quick", "--no-plots", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.monotonic() - t0
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[-1] == "paper_scale: all 4 targets met"  # verdicts last
    assert "--quick smoke target" in p.stdout and "a full run's target >= 1.35" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["quick"] is True and doc["workload"]["users"] == 3
    assert doc["workload"]["turns"] == 3 and doc["ghost"]["scale"] == 64
    assert doc["hbm_kv_bytes"] == 64 << 20
    assert len({t["system"] for t in doc["per_turn"]}) == 7
    # the device was reached: the smoke ratio is a measured figure
    assert doc["load_bw_Bps"]["cxlhm-lru"] > 0 and doc["prefetch_over_lru"] > 0
    v = doc["verdicts"]
    assert v["quick"] is True and v["all_met"] is True and len(v["targets"]) == 4
    names = " | ".join(t["name"] for t in v["targets"])
    assert "systems replayed" in names and "result files written" in names
    assert wall < 60, wall


def test_quick_misses_its_smoke_target_when_nothing_was_measured() -> None:
    """With the GPU preset's G1 (--hbm-kv 0) the 9 smoke requests never reach
    the device: no load bandwidth, no ratio, and the smoke target says so."""
    p = subprocess.run(
        [sys.executable, str(TOOL), "--quick", "--no-plots", "--hbm-kv", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    missed = next(ln for ln in p.stdout.splitlines() if ln.strip().startswith("MISSED:"))
    assert "prefetch/lru load bandwidth" in missed and "this run nan" in missed
    assert p.stdout.strip().splitlines()[-1].startswith("paper_scale: MISSED 1 of 4 targets")


def test_quick_with_out_writes_the_same_document_there(tmp_path: Path) -> None:
    out, js = tmp_path / "out", tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, str(TOOL), "--quick", "--no-plots", "--out", str(out), "--json", str(js)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    a, b = json.loads((out / "results.json").read_text()), json.loads(js.read_text())
    assert a == b and a["verdicts"]["all_met"] is True
    assert (out / "per_request.csv").stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--quick", "--json", "/nonexistent-chm-dir/r.json"], "does not exist"),
        (["--quick", "--json", "."], "is a directory"),
        ([], "Missing option '--out'"),
    ],
)
def test_bad_json_path_or_no_destination_is_a_usage_error(args: list[str], message: str) -> None:
    p = subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr and "Traceback" not in p.stderr
    assert "replaying" not in p.stdout and "workload:" not in p.stdout  # checked up front


def test_ghost_setup_scaling_and_bad_input() -> None:
    g = GhostSetup(scale=16)
    assert g.sized(64 << 30) == 4 << 30 and g.sized(2 << 40) == 128 << 30
    with pytest.raises(ValueError, match="scale must be >= 1"):
        GhostSetup(scale=0)
    reqs = generate_chat(ChatWorkload(users=1, turns=1))
    pm = configure().prefill
    with pytest.raises(ValueError, match="does not divide"):
        replay_virtual(reqs, "cxlhm-lru", pm, GhostSetup(scale=3))
    with pytest.raises(ValueError, match="unknown CXL-HM system"):
        replay_virtual(reqs, "cxlhm", pm, GhostSetup(scale=16))
