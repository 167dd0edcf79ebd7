"""tools/replay/replay_baselines.py: runs end to end and writes what it says."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "replay" / "replay_baselines.py"
TRACE = ROOT / "tests" / "data" / "mooncake_chat.jsonl"
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120
    )


def test_synthetic_replay_writes_results(tmp_path: Path) -> None:
    p = run("--users", "4", "--turns", "3", "--workers", "2", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "per system, whole workload" in p.stdout
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["workload"]["users"] == 4
    assert doc["workload"]["requests"] == 12
    assert doc["parameters"]["derived"]["block_bytes"] == 16 << 20
    systems = {t["system"] for t in doc["per_turn"]}
    assert systems == {"recompute", "gpu-prefix", "local-dram-lru", "remote-dram-pool", "fs-ssd"}
    with open(tmp_path / "per_request.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5 * 12
    assert all(r["hit_rate"] == "0.0" for r in rows if r["system"] == "recompute")
    turns = [t for t in doc["per_turn"] if t["system"] == "gpu-prefix"]
    assert [t["turn"] for t in turns] == [0, 1, 2]
    # a later turn reuses its predecessor's prompt: hit rate above turn 0's
    assert turns[2]["hit_rate"] > turns[0]["hit_rate"]
    if HAVE_MPL:
        for png in ("per_turn.png", "capacity.png"):
            assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_trace_replay_with_overrides(tmp_path: Path) -> None:
    p = run(
        "--trace",
        str(TRACE),
        "--workers",
        "1",
        "--systems",
        "local-dram-lru",
        "--set",
        "local-dram-lru.hbm_kv_bytes=1G",
        "--set",
        "local-dram-lru.tier_capacity_bytes=2G",
        "--capacities",
        "1G,4G",
        "--no-plots",
        "--out",
        str(tmp_path),
    )
    assert p.returncode == 0, p.stderr
    assert "no per-turn plot" not in p.stdout
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["workload"]["requests"] == 46
    assert doc["parameters"]["systems"]["local-dram-lru"]["tier_capacity_bytes"] == 2 << 30
    assert [c["capacity_bytes"] for c in doc["capacity_sweep"]] == [1 << 30, 4 << 30]
    assert not (tmp_path / "per_turn.png").exists()
    # no sessions in the trace and none inferred: one summary without a turn
    assert [t["turn"] for t in doc["per_turn"]] == [None]


def test_bad_trace_line_is_a_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(TRACE.read_text().splitlines()[0] + "\n" + '{"timestamp": 1}\n')
    p = run("--trace", str(bad), "--out", str(tmp_path / "o"))
    assert p.returncode == 1
    assert f"{bad} line 2: missing key 'input_length'" in p.stderr
    assert "Traceback" not in p.stderr


def test_bad_override_is_a_usage_error(tmp_path: Path) -> None:
    p = run("--set", "gpu.mfu=2", "--out", str(tmp_path))
    assert p.returncode == 2
    assert "mfu and memory_utilization must be in (0, 1]" in p.stderr
    p = run("--model", "qwen2.5-32b", "--set", "gpu.memory_bytes=16G", "--out", str(tmp_path))
    assert p.returncode == 2
    assert "qwen2.5-32b weights do not fit in a100-80g" in p.stderr
    assert "Traceback" not in p.stderr


def test_saved_trace_replays_like_the_workload(tmp_path: Path) -> None:
    args = ["--users", "3", "--turns", "3", "--workers", "1", "--no-plots"]
    saved = tmp_path / "chat.jsonl"
    p = run(*args, "--save-trace", str(saved), "--out", str(tmp_path / "a"))
    assert p.returncode == 0, p.stderr
    assert len(saved.read_text().splitlines()) == 9
    p = run(*args, "--trace", str(saved), "--out", str(tmp_path / "b"))
    assert p.returncode == 0, p.stderr
    a = json.loads((tmp_path / "a" / "results.json").read_text())["per_turn"]
    b = json.loads((tmp_path / "b" / "results.json").read_text())["per_turn"]
    # the same requests, sessions and turns (from session_id)
    assert [(t["system"], t["turn"], t["input_tokens"]) for t in a] == [
        (t["system"], t["turn"], t["input_tokens"]) for t in b
    ]
    # a partial 512-token block is not reused from the trace: never more hits
    assert all(tb["cached_tokens"] <= ta["cached_tokens"] for ta, tb in zip(a, b, strict=True))
    p = run("--trace", str(saved), "--save-trace", str(tmp_path / "x"), "--out", str(tmp_path))
    assert p.returncode == 2
    assert "--save-trace writes a synthetic workload" in p.stderr


def test_closed_loop_replay(tmp_path: Path) -> None:
    p = run(
        *("--users", "4", "--turns", "2", "--arrival", "closed", "--concurrency", "2"),
        *("--systems", "recompute,gpu-prefix", "--no-plots", "--out", str(tmp_path)),
    )
    assert p.returncode == 0, p.stderr
    with open(tmp_path / "per_request.csv") as f:
        rows = list(csv.DictReader(f))
    last = {
        r["system"]: max(float(x["arrival_s"]) for x in rows if x["system"] == r["system"])
        for r in rows
    }
    # recomputation is slower, so its last user arrives later
    assert last["recompute"] > last["gpu-prefix"]


def test_without_matplotlib_the_plots_are_skipped_with_a_reason(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('matplotlib hidden for this test')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    p = subprocess.run(
        [sys.executable, str(TOOL), "--users", "2", "--turns", "2", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert "no plots: plots need matplotlib: pip install 'chm[plots]'" in " ".join(p.stdout.split())
    assert (tmp_path / "o" / "results.json").exists()
    assert not (tmp_path / "o" / "per_turn.png").exists()
