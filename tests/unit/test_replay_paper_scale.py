"""tools/replay/paper_scale.py in a reduced size, and its ghost setup."""

from __future__ import annotations

import json
import subprocess
import sys
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
    assert ("all 2 targets met" in last) == (p.returncode == 0)
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
