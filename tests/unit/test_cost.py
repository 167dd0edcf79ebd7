"""chm.sim.replay.cost and ``chm-emu cost``: Table 1's arithmetic by hand."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner

from chm.sim.replay.cost import CostInputs, PricedUnit, format_gb, parse_gb, parse_priced, table1
from chm_emu.cli import main


def test_parse_gb_is_exact_and_decimal() -> None:
    assert parse_gb("15.36T") == 15360
    assert parse_gb("15.36TB") == 15360
    assert parse_gb("128G") == 128
    assert parse_gb("128") == 128
    assert parse_gb("1.5P") == 1_500_000
    assert parse_gb("500M") == Fraction(1, 2)
    for bad in ("", "12Q", "-1T", "0", "1e3G", "T"):
        with pytest.raises(ValueError, match="capacity"):
            parse_gb(bad)
    assert format_gb(Fraction(15360)) == "15.36 TB"
    assert format_gb(Fraction(128)) == "128 GB"


def test_parse_priced() -> None:
    assert parse_priced("128G=6517") == (Fraction(128), 6517.0)
    for bad, match in (
        ("128G", "expected CAPACITY=PRICE"),
        ("128G=cheap", "price 'cheap' is not a number"),
        ("128G=-1", "price must be a finite number >= 0"),
        ("128G=nan", "price must be a finite number >= 0"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_priced(bad)


def test_table1_defaults_by_hand() -> None:
    rows = table1()
    assert [r.option for r in rows] == [
        "DDR5 DIMM 128 GB",
        "DDR5 DIMM 256 GB",
        "Gen5 TLC SSD 15.36 TB",
        "CXL-HM 15.36 TB",
    ]
    # 15,360 GB / 128 GB = 120 DIMMs exactly (a float 15.36 * 1000 would give 121)
    assert [r.units for r in rows] == [120, 60, 1, 1]
    assert rows[0].cost == 120 * 6517 == 782_040  # paper: ~$782K
    assert rows[1].cost == 60 * 13583 == 814_980  # paper: ~$815K
    assert rows[2].cost == 13_600  # paper: ~$13.6K
    # CXL-HM: NAND 13,600 + 64 GB DRAM at 6517/128 per GB (3,258.5) + controller 23,150
    assert rows[3].cost == pytest.approx(13_600 + 64 * 6517 / 128 + 23_150)  # paper: ~$40K
    assert [round(r.multiple, 1) for r in rows] == [57.5, 59.9, 1.0, 2.9]  # the paper's column
    assert all(r.provisioned_gb == 15360 for r in rows)


def test_table1_rounds_units_up_and_takes_prices() -> None:
    inputs = CostInputs(
        capacity_gb=Fraction(1000),
        dimms=(PricedUnit(Fraction(96), 100.0),),
        ssd=PricedUnit(Fraction(3840), 400.0),
        cxlhm_device_gb=Fraction(2000),
        cxlhm_dram_gb=Fraction(48),
        cxlhm_controller_price=1000.0,
    )
    dimm, ssd, cxl = table1(inputs)
    assert (dimm.units, dimm.cost) == (11, 1100.0)  # ceil(1000 / 96)
    assert dimm.provisioned_gb == 1056
    assert (ssd.units, ssd.cost) == (1, 400.0)
    # one device: 2000 GB of NAND at 400/3840 per GB + 48 GB at 100/96 per GB + 1000
    assert cxl.units == 1
    assert cxl.cost == pytest.approx(2000 * 400 / 3840 + 48 * 100 / 96 + 1000)
    assert cxl.multiple == pytest.approx(cxl.cost / 400)
    assert inputs.cxlhm_breakdown() == pytest.approx((2000 * 400 / 3840, 50.0, 1000.0))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="PricedUnit: capacity must be > 0"):
        PricedUnit(Fraction(0), 1.0)
    with pytest.raises(ValueError, match="give at least one DIMM"):
        CostInputs(dimms=())
    with pytest.raises(ValueError, match="cxlhm_controller_price must be"):
        CostInputs(cxlhm_controller_price=float("inf"))


def test_cost_command_prints_table1(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    r = CliRunner().invoke(main, ["cost", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "$782,040" in r.output
    assert "57.5x" in r.output
    assert "controller $23,150" in r.output
    doc = json.loads(out.read_text())
    assert [d["units"] for d in doc] == [120, 60, 1, 1]
    assert doc[2]["multiple_of_nand"] == 1.0


def test_cost_command_takes_prices() -> None:
    r = CliRunner().invoke(
        main,
        ["cost", "--capacity", "1T", "--dimm", "64G=300", "--ssd", "2T=200"],
    )
    assert r.exit_code == 0, r.output
    # ceil(1000 / 64) = 16 DIMMs of $300; one 2 TB SSD
    assert "$4,800" in r.output
    assert "24.0x" in r.output


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--capacity", "lots"], "--capacity"),
        (["--dimm", "64G"], "--dimm"),
        (["--ssd", "2T=free"], "--ssd"),
        (["--cxlhm-controller-price", "-5"], "--cxlhm-controller-price"),
    ],
)
def test_cost_command_bad_values_are_usage_errors(args: list[str], option: str) -> None:
    r = CliRunner().invoke(main, ["cost", *args])
    assert r.exit_code == 2, r.output
    assert option in r.output
