"""The spec files on their own: the yaml is consistent, and fw_spec/README.md
carries exactly the yaml's tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import specdata

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "fw_spec" / "README.md"


SPEC = specdata.load()
TABLES = specdata.markdown_tables(SPEC)


def test_spec_is_consistent() -> None:
    assert specdata.problems(SPEC) == []


def test_problems_are_found() -> None:
    """The consistency check can fail: break a copy of the spec."""
    import copy

    bad = copy.deepcopy(SPEC)
    bad["staging"]["machines"]["slot"]["transitions"].append(
        {"from": "HELD", "to": "NOWHERE", "event": "x"}
    )
    bad["wbuf"]["invariants"][0]["checked_by"] = ["telepathy"]
    bad["commands"]["commands"][0]["errors"].append("EWHATEVER")
    found = specdata.problems(bad)
    assert any("NOWHERE" in p for p in found)
    assert any("W1" in p and "checked_by" in p for p in found)
    assert any("EWHATEVER" in p for p in found)


@pytest.mark.parametrize("title", sorted(TABLES))
def test_readme_carries_the_table(title: str) -> None:
    """README tables are the yaml's (regenerate rows with
    `python3 fw_spec/specdata.py --tables`)."""
    text = README.read_text()
    missing = [ln for ln in TABLES[title] if ln not in text]
    assert not missing, f"README lacks these rows of '{title}':\n" + "\n".join(missing)


def test_readme_names_no_other_invariants() -> None:
    ids = {i["id"] for i in specdata.invariants(SPEC)}
    rows = set(re.findall(r"^\| ([SWLR][0-9]+) \|", README.read_text(), re.M))
    assert rows == ids


def test_readme_covers_every_command_and_error() -> None:
    text = README.read_text()
    for c in SPEC["commands"]["commands"]:
        assert c["function"] in text, c["function"]
    for e in SPEC["commands"]["errors"]:
        assert f"| {e['name']} | {e['value']} |" in text, e["name"]


def test_header_points_at_the_spec_files() -> None:
    header = (ROOT / "include" / "chm.h").read_text()
    for name in re.findall(r"fw_spec/(\w+\.yaml)", header):
        assert (ROOT / "fw_spec" / name).exists(), f"chm.h names fw_spec/{name}"
