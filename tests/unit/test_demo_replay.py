"""`chm-emu demo`: the multi-turn replay in a reduced size."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from emulator.cli import main


def test_demo_replay_reduced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["demo", "--users", "2", "--turns", "3", "--backend", "pread", "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "local DRAM cache" in r.output and "Prefetch mode loaded at" in r.output
    doc = json.loads((out / "demo.json").read_text())
    systems = {t["system"] for t in doc["turns"]}
    assert systems == {"local-dram-lru", "cxlhm-lru", "cxlhm-prefetch"}
    assert len(doc["turns"]) == 3 * 3
    # every turn after the first reuses the previous turn's prompt in CXL-HM
    later = [t for t in doc["turns"] if t["system"] != "local-dram-lru" and t["turn"] > 0]
    assert all(t["hit_rate"] > 0 and t["load_bw_Bps"] > 0 for t in later)
    assert (out / "demo_turns.csv").read_text().startswith("system,turn,")
