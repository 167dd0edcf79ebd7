"""chm.sim.replay.prefill / tiers / params: the modeled TTFT by hand, and overrides."""

from __future__ import annotations

import pytest

from chm.sim.replay import (
    GPUS,
    MODELS,
    TIERS,
    PrefillModel,
    SystemSpec,
    apply_overrides,
    param_rows,
    parse_overrides,
)

LLAMA_A100 = PrefillModel(MODELS["llama-3.1-8b"], GPUS["a100-80g"])


def test_kv_sizes_per_model() -> None:
    assert MODELS["llama-3.1-8b"].kv_bytes_per_token == 128 << 10
    assert MODELS["qwen2.5-32b"].kv_bytes_per_token == 256 << 10
    # 16 MiB and 32 MiB per 128-token block, as in the paper
    assert MODELS["llama-3.1-8b"].block_bytes(128) == 16 << 20
    assert MODELS["qwen2.5-32b"].block_bytes(128) == 32 << 20


def test_prefill_flops_and_time_by_hand() -> None:
    # 1000 new tokens, nothing cached:
    #   2 * 8.03e9 * 1000                = 1.606e13
    #   4 * 32 * 4096 * (1000*1001/2)    = 524288 * 500500 = 2.62406144e11
    assert LLAMA_A100.flops(1000, 0) == pytest.approx(1.606e13 + 2.62406144e11, rel=1e-12)
    # at 312e12 * 0.5 FLOP/s
    assert LLAMA_A100.compute_s(1000, 0) == pytest.approx(1.632240614e13 / 1.56e14, rel=1e-9)
    # 100 new tokens after 4000 cached: attention pairs 100*4000 + 100*101/2 = 405050
    assert LLAMA_A100.flops(100, 4000) == pytest.approx(
        2 * 8.03e9 * 100 + 524288 * 405050, rel=1e-12
    )
    # a fully cached prompt still computes its last token
    assert LLAMA_A100.flops(0, 4096) == LLAMA_A100.flops(1, 4096)
    with pytest.raises(ValueError, match="token counts must be >= 0"):
        LLAMA_A100.flops(-1, 0)


def test_qwen_on_h100_by_hand() -> None:
    pm = PrefillModel(MODELS["qwen2.5-32b"], GPUS["h100-sxm"])
    # 2*32.76e9*512 + 4*64*5120*(512*513/2) = 3.354624e13 + 1310720*131328
    want = 3.354624e13 + 1310720 * 131328
    assert pm.compute_s(512, 0) == pytest.approx(want / (989e12 * 0.5), rel=1e-9)


def test_hbm_left_for_kv_by_hand() -> None:
    # 80 GiB * 0.9 = 77,309,411,328; minus 8.03e9 params * 2 bytes
    assert LLAMA_A100.hbm_kv_bytes() == 77_309_411_328 - 16_060_000_000
    qwen = PrefillModel(MODELS["qwen2.5-32b"], GPUS["a100-80g"])
    assert qwen.hbm_kv_bytes() == 77_309_411_328 - 65_520_000_000
    small = apply_overrides(GPUS["a100-80g"], {"memory_bytes": "16G"})
    with pytest.raises(ValueError, match=r"qwen2\.5-32b weights do not fit in a100-80g"):
        PrefillModel(MODELS["qwen2.5-32b"], small).hbm_kv_bytes()


def test_tier_load_time_by_hand() -> None:
    fs = TIERS["fs-ssd"]
    assert fs.load_s(0) == 0.0
    # 64 MiB at 6.5 GB/s after 100 us
    assert fs.load_s(64 << 20) == pytest.approx(100e-6 + 67_108_864 / 6.5e9)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        fs.load_s(-1)


def test_parameters_print_with_units() -> None:
    rows = {r[0]: r for r in param_rows(TIERS["remote-dram"])}
    assert rows["bandwidth_Bps"][1:3] == ("2.5e+10", "B/s")
    assert rows["latency_s"][1:3] == ("2e-05", "s")
    assert "200 Gbps" in rows["note"][1]
    gpu = {r[0]: r for r in param_rows(GPUS["a100-80g"])}
    assert gpu["memory_bytes"][1] == "85899345920 (80 GiB)"
    with pytest.raises(TypeError, match="expected a dataclass instance"):
        param_rows(SystemSpec)


def test_overrides_parse_by_field_type() -> None:
    fs = apply_overrides(TIERS["fs-ssd"], parse_overrides(["bandwidth_Bps=12.5e9"]))
    assert fs.bandwidth_Bps == 12.5e9
    assert fs.latency_s == TIERS["fs-ssd"].latency_s
    s = apply_overrides(
        SystemSpec(), {"tier_capacity_bytes": "64G", "tier_shared": "yes", "name": "x"}
    )
    assert (s.tier_capacity_bytes, s.tier_shared, s.name) == (64 << 30, True, "x")
    m = apply_overrides(MODELS["llama-3.1-8b"], {"layers": "40"})
    assert m.layers == 40


@pytest.mark.parametrize(
    ("obj", "overrides", "match"),
    [
        (TIERS["fs-ssd"], {"bandwith_Bps": "1"}, "TierParams has no parameter 'bandwith_Bps'"),
        (TIERS["fs-ssd"], {"bandwidth_Bps": "fast"}, r"TierParams.bandwidth_Bps='fast'"),
        (TIERS["fs-ssd"], {"bandwidth_Bps": "inf"}, "expected a finite number"),
        (TIERS["fs-ssd"], {"bandwidth_Bps": "0"}, "bandwidth_Bps must be > 0"),
        (GPUS["a100-80g"], {"mfu": "1.5"}, r"mfu and memory_utilization must be in \(0, 1\]"),
        (MODELS["qwen2.5-32b"], {"layers": "4.5"}, "ModelPreset.layers='4.5': expected an integer"),
        (SystemSpec(), {"tier_capacity_bytes": "12Q"}, "SystemSpec.tier_capacity_bytes='12Q'"),
        (SystemSpec(), {"gpu_cache": "maybe"}, "expected true or false"),
        (SystemSpec(), {"tier": "x"}, "cannot be set"),
    ],
)
def test_bad_overrides_name_the_field(obj: object, overrides: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        apply_overrides(obj, overrides)


def test_override_syntax() -> None:
    assert parse_overrides([" a = 1 ", "b=2G"]) == {"a": "1", "b": "2G"}
    for bad in ("a", "=1", "a="):
        with pytest.raises(ValueError, match="expected NAME=VALUE"):
            parse_overrides([bad])
