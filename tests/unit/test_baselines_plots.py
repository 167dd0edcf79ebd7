"""chm.sim.replay.plots and capacity_sweep: PNGs from replay results."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from chm.sim.replay import (
    GpuPreset,
    ModelPreset,
    PrefillModel,
    SystemSpec,
    TurnSummary,
    capacity_sweep,
    per_turn,
    simulate,
)
from chm.sim.workloads import ChatWorkload, Request, generate_chat

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
needs_mpl = pytest.mark.skipif(
    not HAVE_MPL, reason="matplotlib is not installed (pip install 'chm[plots]')"
)

TINY = PrefillModel(
    ModelPreset(name="tiny", params=1e3, layers=1, hidden=1, kv_bytes_per_token=1),
    GpuPreset(name="toy", peak_flops=1e6, mfu=1.0, memory_bytes=1 << 20),
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _workload() -> list[Request]:
    return generate_chat(
        ChatWorkload(users=4, turns=3, system_prompt_tokens=64, block_tokens=16, seed=4)
    )


def test_capacity_sweep_matches_simulate_and_grows() -> None:
    reqs = _workload()
    caps = [0, 16 * 8, 16 * 64, 16 * 100_000]  # bytes: 1 token = 1 byte here
    sweep = capacity_sweep(reqs, caps, TINY)
    assert [c for c, _ in sweep] == caps
    rates = [h for _, h in sweep]
    assert rates[0] == 0.0
    assert rates == sorted(rates)
    assert rates[-1] > rates[1]
    one = simulate(
        reqs,
        SystemSpec("x", gpu_cache=False, tier_capacity_bytes=caps[2], tier_shared=True),
        TINY,
    )
    assert rates[2] == sum(r.cached_tokens for r in one) / sum(r.input_tokens for r in reqs)
    with pytest.raises(ValueError, match="needs at least one request"):
        capacity_sweep([], caps, TINY)


@needs_mpl
def test_per_turn_plot_is_a_png(tmp_path: Path) -> None:
    from chm.sim.replay.plots import plot_per_turn

    reqs = _workload()
    results = simulate(reqs, SystemSpec("a", hbm_kv_bytes=16 * 4), TINY)
    results += simulate(reqs, SystemSpec("b", hbm_kv_bytes=16 * 1000), TINY)
    out = tmp_path / "turns.png"
    plot_per_turn(per_turn(results), out, title="t")
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert out.stat().st_size > 10_000


@needs_mpl
def test_per_turn_plot_needs_turns(tmp_path: Path) -> None:
    from chm.sim.replay.plots import plot_per_turn

    none = TurnSummary("a", None, 1, 10, 0, 0, 0, 0.1)
    with pytest.raises(ValueError, match="no summary has a turn"):
        plot_per_turn([none], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


@needs_mpl
def test_capacity_plot_is_a_png(tmp_path: Path) -> None:
    from chm.sim.replay.plots import plot_capacity_sweep

    out = tmp_path / "cap.png"
    plot_capacity_sweep({"lru": [(1 << 30, 0.2), (1 << 40, 0.9)]}, out)
    assert out.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="no points"):
        plot_capacity_sweep({"lru": []}, tmp_path / "y.png")
