"""The paper's Table 1: what a KV tier of a given capacity costs in each medium.

Capacities here are vendors' decimal units (1 TB = 1000 GB), as DIMMs and SSDs
are sold, and held as exact fractions so unit counts are exact
(``ceil(15.36 TB / 128 GB)`` is 120, not 121 from a rounding error). Each
option buys whole units:

- DRAM: ``ceil(capacity / dimm)`` DIMMs at the DIMM price;
- NAND: ``ceil(capacity / ssd)`` SSDs at the SSD price;
- CXL-HM: ``ceil(capacity / device)`` devices, each its NAND at the SSD's
  price per GB, its internal DRAM at the first DIMM's price per GB, and a
  controller.

The multiple is an option's cost over the NAND option's. The default prices
are those implied by Table 1's totals (the paper gives totals only: 120 x
128 GB ~ $782K, 60 x 256 GB ~ $815K, 15.36 TB of Gen5 TLC ~ $13.6K, CXL-HM
~ $40K); the controller price is the one that makes the CXL-HM total ~$40K.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction

__all__ = ["CostInputs", "CostRow", "PricedUnit", "format_gb", "parse_gb", "parse_priced", "table1"]

_UNIT_GB: dict[str, Fraction] = {
    "": Fraction(1),
    "M": Fraction(1, 1000),
    "G": Fraction(1),
    "T": Fraction(1000),
    "P": Fraction(1000**2),
}
_GB_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([mMgGtTpP]?)[bB]?\s*$")


def parse_gb(text: str) -> Fraction:
    """``"15.36T"`` -> 15360 GB, exactly. Units M, G (the default), T, P, decimal."""
    m = _GB_RE.match(text)
    if m is None:
        raise ValueError(f"capacity {text!r}: expected a number with an optional M/G/T/P unit")
    gb = Fraction(m.group(1)) * _UNIT_GB[m.group(2).upper()]
    if gb <= 0:
        raise ValueError(f"capacity {text!r}: must be > 0")
    return gb


def format_gb(gb: Fraction) -> str:
    """15360 -> "15.36 TB"; 128 -> "128 GB"."""
    if gb >= 1000:
        return f"{float(gb / 1000):g} TB"
    return f"{float(gb):g} GB"


def parse_priced(text: str) -> tuple[Fraction, float]:
    """``"128G=6517"`` -> (128 GB, 6517.0): a unit's capacity and its price."""
    size, sep, price = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r}: expected CAPACITY=PRICE, e.g. 128G=6517")
    try:
        p = float(price)
    except ValueError:
        raise ValueError(f"{text!r}: price {price!r} is not a number") from None
    if not math.isfinite(p) or p < 0:
        raise ValueError(f"{text!r}: price must be a finite number >= 0")
    return parse_gb(size), p


@dataclass(frozen=True)
class PricedUnit:
    """A part sold whole: ``capacity_gb`` (decimal GB) for ``price``."""

    capacity_gb: Fraction
    price: float

    def __post_init__(self) -> None:
        if self.capacity_gb <= 0 or not math.isfinite(self.price) or self.price < 0:
            raise ValueError(
                f"PricedUnit: capacity must be > 0 and price a finite number >= 0, "
                f"got {self.capacity_gb} GB for {self.price!r}"
            )


@dataclass(frozen=True)
class CostInputs:
    """Capacity to provision and the prices (defaults: Table 1's)."""

    capacity_gb: Fraction = Fraction(15360)
    dimms: tuple[PricedUnit, ...] = (
        PricedUnit(Fraction(128), 6517.0),
        PricedUnit(Fraction(256), 13583.0),
    )
    ssd: PricedUnit = field(default_factory=lambda: PricedUnit(Fraction(15360), 13600.0))
    cxlhm_device_gb: Fraction = Fraction(15360)
    cxlhm_dram_gb: Fraction = Fraction(64)
    cxlhm_controller_price: float = 23150.0

    def __post_init__(self) -> None:
        if self.capacity_gb <= 0 or self.cxlhm_device_gb <= 0 or self.cxlhm_dram_gb < 0:
            raise ValueError("CostInputs: capacities must be > 0 (CXL-HM DRAM >= 0)")
        if not self.dimms:
            raise ValueError(
                "CostInputs: give at least one DIMM (its price per GB prices CXL-HM DRAM)"
            )
        if not math.isfinite(self.cxlhm_controller_price) or self.cxlhm_controller_price < 0:
            raise ValueError(
                f"CostInputs: cxlhm_controller_price must be a finite number >= 0, "
                f"got {self.cxlhm_controller_price!r}"
            )

    def cxlhm_breakdown(self) -> tuple[float, float, float]:
        """One device's (NAND, DRAM, controller) prices: NAND at the SSD's $/GB,
        DRAM at the first DIMM's $/GB."""
        nand = float(self.cxlhm_device_gb / self.ssd.capacity_gb) * self.ssd.price
        d = self.dimms[0]
        dram = float(self.cxlhm_dram_gb / d.capacity_gb) * d.price
        return nand, dram, self.cxlhm_controller_price

    def cxlhm_device_price(self) -> float:
        """One device's price: the sum of :meth:`cxlhm_breakdown`."""
        return sum(self.cxlhm_breakdown())


@dataclass(frozen=True)
class CostRow:
    """One option: ``units`` parts of ``unit_gb`` each, costing ``cost`` in all."""

    option: str
    units: int
    unit_gb: Fraction
    unit_price: float
    cost: float
    multiple: float  # cost / the NAND option's cost

    @property
    def provisioned_gb(self) -> Fraction:
        return self.units * self.unit_gb


def _units(capacity: Fraction, unit: Fraction) -> int:
    return math.ceil(capacity / unit)


def table1(inputs: CostInputs | None = None) -> list[CostRow]:
    """The rows of Table 1: each DIMM size, NAND, then CXL-HM."""
    c = inputs or CostInputs()
    parts: list[tuple[str, int, Fraction, float]] = []
    for d in c.dimms:
        parts.append(
            (
                f"DDR5 DIMM {format_gb(d.capacity_gb)}",
                _units(c.capacity_gb, d.capacity_gb),
                d.capacity_gb,
                d.price,
            )
        )
    parts.append(
        (
            f"Gen5 TLC SSD {format_gb(c.ssd.capacity_gb)}",
            _units(c.capacity_gb, c.ssd.capacity_gb),
            c.ssd.capacity_gb,
            c.ssd.price,
        )
    )
    parts.append(
        (
            f"CXL-HM {format_gb(c.cxlhm_device_gb)}",
            _units(c.capacity_gb, c.cxlhm_device_gb),
            c.cxlhm_device_gb,
            c.cxlhm_device_price(),
        )
    )
    nand_cost = parts[len(c.dimms)][1] * parts[len(c.dimms)][3]
    rows = []
    for name, n, unit_gb, price in parts:
        cost = n * price
        rows.append(
            CostRow(name, n, unit_gb, price, cost, cost / nand_cost if nand_cost else math.inf)
        )
    return rows
