"""Modeled prefill compute: model and GPU presets and the time to prefill.

Prefill of ``n`` new tokens after ``c`` cached ones costs

- ``2 * params * n`` FLOPs in the weight matmuls, and
- ``4 * layers * hidden * (n*c + n*(n+1)/2)`` FLOPs in attention (each new
  token attends to the cached tokens and to the new ones up to itself; QK^T
  and AV each take 2 FLOPs per multiply-add over ``hidden`` = heads x head
  dim),

run at ``peak_flops * mfu``. When every token of a prompt is cached the
engine still computes the last one (it needs its logits), so ``n >= 1``.
KV bytes per token = 2 (K and V) x layers x KV heads x head dim x dtype bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from chm.sim.replay.params import param

__all__ = ["GPUS", "MODELS", "GpuPreset", "ModelPreset", "PrefillModel"]


@dataclass(frozen=True)
class ModelPreset:
    """What prefill cost and KV footprint depend on, for one model."""

    name: str = param("llama-3.1-8b", "", "preset name")
    params: float = param(8.03e9, "parameters", "weights")
    layers: int = param(32, "", "transformer layers")
    hidden: int = param(4096, "", "attention width (query heads x head dim)")
    kv_bytes_per_token: int = param(131072, "bytes", "KV cache per token, all layers")
    weight_bytes_per_param: int = param(2, "bytes", "weight precision")
    note: str = param(
        "Llama-3.1-8B config: 32 layers, 8 KV heads of 128, bf16 (KV 128 KiB/token)",
        "",
        "where the numbers come from",
    )

    def __post_init__(self) -> None:
        if self.params <= 0 or self.layers < 1 or self.hidden < 1:
            raise ValueError(f"ModelPreset {self.name!r}: params, layers and hidden must be > 0")
        if self.kv_bytes_per_token < 1 or self.weight_bytes_per_param < 1:
            raise ValueError(f"ModelPreset {self.name!r}: byte sizes must be >= 1")

    def block_bytes(self, block_tokens: int) -> int:
        """KV bytes of one block of ``block_tokens`` tokens."""
        return self.kv_bytes_per_token * block_tokens


@dataclass(frozen=True)
class GpuPreset:
    """The GPU a worker prefills on."""

    name: str = param("a100-80g", "", "preset name")
    peak_flops: float = param(312e12, "FLOP/s", "peak dense BF16 throughput")
    mfu: float = param(0.5, "", "fraction of peak a prefill achieves (assumed)")
    memory_bytes: int = param(80 << 30, "bytes", "HBM")
    memory_utilization: float = param(0.9, "", "share of HBM the engine takes (vLLM default)")
    note: str = param("NVIDIA A100 80GB datasheet", "", "where the numbers come from")

    def __post_init__(self) -> None:
        if self.peak_flops <= 0:
            raise ValueError(f"GpuPreset {self.name!r}: peak_flops must be > 0")
        if not 0 < self.mfu <= 1 or not 0 < self.memory_utilization <= 1:
            raise ValueError(
                f"GpuPreset {self.name!r}: mfu and memory_utilization must be in (0, 1]"
            )


MODELS: dict[str, ModelPreset] = {
    "llama-3.1-8b": ModelPreset(),
    "qwen2.5-32b": ModelPreset(
        name="qwen2.5-32b",
        params=32.76e9,
        layers=64,
        hidden=5120,
        kv_bytes_per_token=262144,
        note="Qwen2.5-32B config: 64 layers, 8 KV heads of 128, bf16 (KV 256 KiB/token)",
    ),
}

GPUS: dict[str, GpuPreset] = {
    "a100-80g": GpuPreset(),
    "h100-sxm": GpuPreset(
        name="h100-sxm",
        peak_flops=989e12,
        memory_bytes=80 << 30,
        note="NVIDIA H100 SXM datasheet",
    ),
}


@dataclass(frozen=True)
class PrefillModel:
    """Prefill time of one request for a model on a GPU."""

    model: ModelPreset
    gpu: GpuPreset

    def flops(self, new_tokens: int, cached_tokens: int) -> float:
        """FLOPs to prefill ``new_tokens`` after ``cached_tokens`` (see the module doc)."""
        if new_tokens < 0 or cached_tokens < 0:
            raise ValueError(
                f"token counts must be >= 0, got new={new_tokens}, cached={cached_tokens}"
            )
        n, c = max(new_tokens, 1), cached_tokens
        m = self.model
        pairs = n * c + n * (n + 1) // 2
        return 2.0 * m.params * n + 4.0 * m.layers * m.hidden * pairs

    def compute_s(self, new_tokens: int, cached_tokens: int) -> float:
        """Seconds of GPU compute for the prefill."""
        return self.flops(new_tokens, cached_tokens) / (self.gpu.peak_flops * self.gpu.mfu)

    def hbm_kv_bytes(self) -> int:
        """HBM left for KV after the weights: memory x utilisation - weights."""
        free = (
            int(self.gpu.memory_bytes * self.gpu.memory_utilization)
            - int(self.model.params) * self.model.weight_bytes_per_param
        )
        if free <= 0:
            raise ValueError(
                f"{self.model.name} weights do not fit in {self.gpu.name} memory "
                f"({self.gpu.memory_bytes} bytes x {self.gpu.memory_utilization})"
            )
        return free
