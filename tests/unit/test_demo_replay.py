"""`chm-emu demo`: the multi-turn replay in a reduced size."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from chm.sim.replay.demo import (
    DemoPacing,
    DemoTurn,
    pacing_sentence,
    scaled_max_io,
    summary_sentences,
)
from emulator.cli import main


def test_demo_replay_reduced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["demo", "--users", "2", "--turns", "3", "--backend", "pread", "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "local DRAM cache" in r.output and "over the run prefetch mode loaded" in r.output
    assert "Pacing (device time, dilated x64)" in r.output
    doc = json.loads((out / "demo.json").read_text())
    assert doc["config"]["time_dilation"] == "64"
    pacing = {p["system"]: p for p in doc["pacing"]}
    assert set(pacing) == {"cxlhm-lru", "cxlhm-prefetch"}
    assert all(p["device_ns"] > 0 and p["late"] >= 0 for p in pacing.values())
    # the output says whether the host kept up, as the counters do
    if all(p["kept_up"] for p in pacing.values()):
        assert "The host kept up" in r.output
    else:
        assert "THE HOST DID NOT KEEP UP" in r.output
    systems = {t["system"] for t in doc["turns"]}
    assert systems == {"local-dram-lru", "cxlhm-lru", "cxlhm-prefetch"}
    assert len(doc["turns"]) == 3 * 3
    # every turn after the first reuses the previous turn's prompt in CXL-HM
    later = [t for t in doc["turns"] if t["system"] != "local-dram-lru" and t["turn"] > 0]
    assert all(t["hit_rate"] > 0 and t["load_bw_Bps"] > 0 for t in later)
    assert (out / "demo_turns.csv").read_text().startswith("system,turn,")


def _turn(system: str, turn: int, hit: float, nbytes: int, bw: float, ttft: float) -> DemoTurn:
    return DemoTurn(system, turn, 1, hit, nbytes, bw, ttft, 0)


def test_summary_sentences_follow_the_numbers() -> None:
    rows = [
        _turn("local-dram-lru", 0, 0.5, 0, 0.0, 0.1),
        _turn("local-dram-lru", 1, 0.2, 0, 0.0, 0.3),
        _turn("cxlhm-lru", 0, 0.5, 1_000_000_000, 4e9, 0.1),  # 0.25 s of loading
        _turn("cxlhm-lru", 1, 0.9, 2_000_000_000, 1e9, 0.3),  # 2 s
        _turn("cxlhm-prefetch", 0, 0.5, 1_000_000_000, 2e9, 0.1),  # 0.5 s
        _turn("cxlhm-prefetch", 1, 0.8, 2_000_000_000, 2e9, 0.2),  # 1 s
    ]
    text = summary_sentences(rows)
    assert "fell from 50% to 20%" in text
    assert "kept more reuse (90% in lru mode, 80% in prefetch mode)" in text
    assert "because its SSD holds" in text
    assert "Lru mode's load bandwidth fell from 4.0 GB/s at turn 1 to 1.0 GB/s at turn 2" in text
    assert "prefetch mode's load bandwidth stayed at 2.0 GB/s from turn 1 to turn 2" in text
    # 3e9 bytes in 2.25 s vs 1.5 s
    assert "loaded faster than lru mode, 2.0 GB/s against 1.3 GB/s (1.50x)" in text
    assert "150 ms vs 200 ms" in text


def test_summary_sentences_say_when_prefetch_is_slower() -> None:
    rows = [
        _turn("local-dram-lru", 0, 0.5, 0, 0.0, 0.1),
        _turn("local-dram-lru", 1, 0.6, 0, 0.0, 0.1),
        _turn("cxlhm-lru", 0, 0.5, 0, 0.0, 0.1),
        _turn("cxlhm-lru", 1, 0.5, 2_000_000_000, 2e9, 0.1),
        _turn("cxlhm-prefetch", 0, 0.5, 0, 0.0, 0.1),
        _turn("cxlhm-prefetch", 1, 0.5, 2_000_000_000, 1e9, 0.2),
    ]
    text = summary_sentences(rows)
    assert "rose from 50% to 60%" in text and "kept less reuse" in text
    assert "because" not in text
    assert "loaded at 2.0 GB/s in turn 2 only" in text
    assert "loaded slower than lru mode, 1.0 GB/s against 2.0 GB/s (0.50x)" in text


def test_pacing_sentence_says_plainly_when_the_host_fell_behind() -> None:
    ok = DemoPacing("cxlhm-lru", late=3, late_ns=1_000_000, device_ns=1_000_000_000)
    behind = DemoPacing("cxlhm-prefetch", late=900, late_ns=200_000_000, device_ns=10**9)
    assert ok.kept_up and not behind.kept_up and behind.late_share == 0.2
    good = pacing_sentence([ok], 64)
    assert "dilated x64" in good and "3 late" in good and "The host kept up" in good
    bad = pacing_sentence([ok, behind], 64)
    assert "THE HOST DID NOT KEEP UP in cxlhm-prefetch" in bad
    assert "not the model" in bad and "--dilation" in bad


def test_max_io_scales_with_the_blocks() -> None:
    assert scaled_max_io(8.0) == 128 << 10  # 16 pieces per block, as 16 MiB in 1 MiB
    assert scaled_max_io(1.0) == 1 << 20
    assert scaled_max_io(3.0) % 4096 == 0
    assert scaled_max_io(1e6) == 4096


def test_dilation_flag_is_checked() -> None:
    r = CliRunner().invoke(main, ["demo", "--dilation", "0"])
    assert r.exit_code == 2 and "--dilation" in r.output
