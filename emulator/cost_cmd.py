"""``chm-emu cost``: the paper's Table 1 with prices as parameters."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from chm.sim.replay.cost import CostInputs, PricedUnit, format_gb, parse_gb, parse_priced, table1

__all__ = ["cost"]


def _gb(ctx: click.Context, param: click.Parameter, value: str) -> Fraction:
    try:
        return parse_gb(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _priced(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...] | str
) -> tuple[PricedUnit, ...] | PricedUnit:
    try:
        if isinstance(value, str):
            return PricedUnit(*parse_priced(value))
        return tuple(PricedUnit(*parse_priced(v)) for v in value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@click.command()
@click.option(
    "--capacity",
    default="15.36T",
    show_default=True,
    callback=_gb,
    help="Capacity to provision, decimal units (15.36T = 15,360 GB).",
)
@click.option(
    "--dimm",
    "dimms",
    multiple=True,
    default=("128G=6517", "256G=13583"),
    show_default=True,
    callback=_priced,
    help="A DDR5 DIMM as CAPACITY=PRICE; repeat for several sizes.",
)
@click.option(
    "--ssd",
    default="15.36T=13600",
    show_default=True,
    callback=_priced,
    help="A Gen5 TLC SSD as CAPACITY=PRICE.",
)
@click.option(
    "--cxlhm-capacity",
    default="15.36T",
    show_default=True,
    callback=_gb,
    help="NAND capacity of one CXL-HM device.",
)
@click.option(
    "--cxlhm-dram",
    default="64G",
    show_default=True,
    callback=_gb,
    help="Internal DRAM of one CXL-HM device (priced as the first --dimm per GB).",
)
@click.option(
    "--cxlhm-controller-price",
    type=click.FloatRange(min=0),
    default=23150.0,
    show_default=True,
    help="Controller cost of one CXL-HM device.",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Also write rows here.")
def cost(
    capacity: Fraction,
    dimms: tuple[PricedUnit, ...],
    ssd: PricedUnit,
    cxlhm_capacity: Fraction,
    cxlhm_dram: Fraction,
    cxlhm_controller_price: float,
    json_path: Path | None,
) -> None:
    """Cost of a KV tier in DRAM, NAND and CXL-HM (the paper's Table 1).

    Each option buys whole parts; the multiple is its cost over NAND's. The
    default prices are those implied by the paper's totals.
    """
    try:
        inputs = CostInputs(
            capacity, dimms, ssd, cxlhm_capacity, cxlhm_dram, cxlhm_controller_price
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    rows = table1(inputs)
    table = Table(title=f"KV tier of {format_gb(capacity)}", title_justify="left")
    for col in ("option", "units", "unit price", "provisioned", "cost", "x NAND"):
        table.add_column(col, justify="left" if col == "option" else "right")
    for r in rows:
        table.add_row(
            r.option,
            str(r.units),
            f"${r.unit_price:,.0f}",
            format_gb(r.provisioned_gb),
            f"${r.cost:,.0f}",
            f"{r.multiple:.1f}x",
        )
    console = Console(highlight=False)
    console.print(table)
    nand, dram, ctrl = inputs.cxlhm_breakdown()
    console.print(
        f"one CXL-HM device = NAND ${nand:,.0f} + {format_gb(cxlhm_dram)} DRAM ${dram:,.0f} "
        f"+ controller ${ctrl:,.0f}"
    )
    if json_path is not None:
        doc = [
            {
                "option": r.option,
                "units": r.units,
                "unit_gb": float(r.unit_gb),
                "unit_price": r.unit_price,
                "provisioned_gb": float(r.provisioned_gb),
                "cost": r.cost,
                "multiple_of_nand": r.multiple,
            }
            for r in rows
        ]
        json_path.write_text(json.dumps(doc, indent=2) + "\n")
