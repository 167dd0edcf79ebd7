"""Where cached KV is loaded from, and what a load costs.

Loading ``b`` bytes from a tier takes ``latency_s + b / bandwidth_Bps`` (no
load when ``b == 0``). Blocks already in GPU HBM cost nothing to load.
"""

from __future__ import annotations

from dataclasses import dataclass

from chm.sim.replay.params import param

__all__ = ["TIERS", "TierParams"]


@dataclass(frozen=True)
class TierParams:
    """A KV tier's load path."""

    name: str = param("local-dram", "", "tier name")
    bandwidth_Bps: float = param(25e9, "B/s", "load bandwidth into the GPU")
    latency_s: float = param(10e-6, "s", "fixed cost of one request's load")
    note: str = param(
        "host DRAM to GPU over PCIe 4.0 x16 (~25 GB/s)", "", "where the numbers come from"
    )

    def __post_init__(self) -> None:
        if self.bandwidth_Bps <= 0 or self.latency_s < 0:
            raise ValueError(
                f"TierParams {self.name!r}: bandwidth_Bps must be > 0 and latency_s >= 0, "
                f"got {self.bandwidth_Bps!r}, {self.latency_s!r}"
            )

    def load_s(self, nbytes: int) -> float:
        """Seconds to load ``nbytes`` from this tier (0 for nothing)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        return self.latency_s + nbytes / self.bandwidth_Bps if nbytes else 0.0


TIERS: dict[str, TierParams] = {
    "local-dram": TierParams(),
    "remote-dram": TierParams(
        name="remote-dram",
        bandwidth_Bps=25e9,
        latency_s=20e-6,
        note="RDMA at 200 Gbps, the paper's storage-node NIC",
    ),
    "fs-ssd": TierParams(
        name="fs-ssd",
        bandwidth_Bps=6.5e9,
        latency_s=100e-6,
        note="NVMe-oF with XFS mounted: ~6.5 GB/s (paper, Fig. 9)",
    ),
    "nvmeof-raw": TierParams(
        name="nvmeof-raw",
        bandwidth_Bps=23e9,
        latency_s=100e-6,
        note="NVMe-oF raw block device over RDMA: ~23 GB/s, near 200 Gb/s (paper, Fig. 9)",
    ),
    "redis": TierParams(
        name="redis",
        bandwidth_Bps=12.5e9,
        latency_s=200e-6,
        note="remote Redis over TCP at 100 Gb/s line rate, single-digit GB/s per stream "
        "in practice (assumed; the paper gives no figure)",
    ),
}
