"""chm.sim.replay.configure: presets, systems and scoped overrides by name."""

from __future__ import annotations

import pytest

from chm.sim.replay import SYSTEMS, configure, split_scoped


def test_defaults() -> None:
    s = configure()
    assert list(s.systems) == list(SYSTEMS)
    assert s.prefill.model.name == "llama-3.1-8b"
    assert s.prefill.gpu.name == "a100-80g"


def test_scoped_overrides_reach_their_object() -> None:
    s = configure(
        "qwen2.5-32b",
        "h100-sxm",
        ["fs-ssd", "local-dram-lru"],
        [
            "gpu.mfu=0.25",
            "model.layers=10",
            "fs-ssd.tier.bandwidth_Bps=3e9",
            "fs-ssd.tier_capacity_bytes=4T",
            "local-dram-lru.tier.latency_s=0.5",
        ],
    )
    assert list(s.systems) == ["fs-ssd", "local-dram-lru"]
    assert s.prefill.gpu.mfu == 0.25
    assert s.prefill.model.layers == 10
    assert s.systems["fs-ssd"].tier.bandwidth_Bps == 3e9
    assert s.systems["fs-ssd"].tier_capacity_bytes == 4 << 40
    assert s.systems["local-dram-lru"].tier.latency_s == 0.5
    # other systems' tiers are untouched
    assert s.systems["local-dram-lru"].tier.bandwidth_Bps == 25e9


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"model": "gpt-5"}, "unknown model 'gpt-5'"),
        ({"gpu": "tpu"}, "unknown GPU 'tpu'"),
        ({"systems": ["fs-ssd", "cxl"]}, "unknown system 'cxl'"),
        ({"systems": []}, "no systems to replay"),
        ({"overrides": ["gpu.mfu"]}, "expected NAME=VALUE"),
        ({"overrides": ["gpus.mfu=1"]}, "SCOPE one of"),
        ({"overrides": ["gpu.=1"]}, "SCOPE one of"),
        ({"overrides": ["gpu.flops=1"]}, "GpuPreset has no parameter 'flops'"),
        ({"overrides": ["fs-ssd.tier.speed=1"]}, "TierParams has no parameter 'speed'"),
        ({"systems": ["recompute"], "overrides": ["fs-ssd.tier_shared=1"]}, "SCOPE one of"),
    ],
)
def test_bad_setups_say_why(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        configure(**kw)  # type: ignore[arg-type]


def test_split_scoped_takes_the_longest_scope() -> None:
    got = split_scoped(["a.b.c=1", "a.d=2"], ["a", "a.b"])
    assert got == {"a.b": {"c": "1"}, "a": {"d": "2"}}
