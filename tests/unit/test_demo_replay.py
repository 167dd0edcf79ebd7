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


def test_summary_sentences_follow_the_numbers() -> None:
    from chm.replay.demo import DemoTurn, summary_sentences

    def t(system: str, turn: int, hit: float, nbytes: int, bw: float, ttft: float) -> DemoTurn:
        return DemoTurn(system, turn, 1, hit, nbytes, bw, ttft, 0)

    rows = [
        t("local-dram-lru", 0, 0.5, 0, 0.0, 0.1),
        t("local-dram-lru", 1, 0.2, 0, 0.0, 0.3),
        t("cxlhm-lru", 0, 0.5, 0, 0.0, 0.1),
        t("cxlhm-lru", 1, 0.9, 2_000_000_000, 1e9, 0.3),  # 2 s of loading
        t("cxlhm-prefetch", 0, 0.5, 0, 0.0, 0.1),
        t("cxlhm-prefetch", 1, 0.9, 2_000_000_000, 2e9, 0.2),  # 1 s
    ]
    text = summary_sentences(rows)
    assert "from 50% to 20%" in text and "keeps more reuse (90%)" in text
    assert "2.00 GB/s against lru mode's 1.00 GB/s (2.00x)" in text
    assert "150 ms vs 200 ms" in text
