"""The device specification (fw_spec/*.yaml) against the code: the C enums,
transition tables, error codes and constants as printed by
tests/c/test_spec_tables.c, and the error codes that include/chm.h lists in
the comment of each call. Every comparison is exact, in both directions."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import specdata

ROOT = Path(__file__).resolve().parents[2]
CHM_H = ROOT / "include" / "chm.h"
DEV_H = ROOT / "csrc" / "dev.h"
STATES_H = ROOT / "csrc" / "states.h"


SPEC = specdata.load()
MACHINES = specdata.machines(SPEC)
COMMANDS = {c["function"]: c for c in SPEC["commands"]["commands"]}


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def header_enums(path: Path) -> dict[str, dict[str, int]]:
    """Every `enum name { A = 1, ... }` of a header; values must be explicit."""
    out = {}
    for m in re.finditer(r"enum\s+(\w+)\s*\{(.*?)\}", _strip_comments(path.read_text()), re.S):
        vals = {}
        for item in m.group(2).split(","):
            item = item.strip()
            if not item:
                continue
            name, eq, val = item.partition("=")
            assert eq, f"{path.name}: enum {m.group(1)}: {name.strip()} has no explicit value"
            vals[name.strip()] = int(val.strip(), 0)
        out[m.group(1)] = vals
    return out


def header_functions(path: Path) -> dict[str, set[str]]:
    """{function: errno names in the "Returns ..." part of the comment right
    above its prototype} (the rest of a comment may describe what others
    return, e.g. close's blocked waiters)."""
    text = path.read_text()
    out = {}
    pat = re.compile(
        r"/\*((?:(?!\*/).)*)\*/\s*(?:int|void|const\s+char\s*\*)\s*(chm_\w+)\s*\(", re.S
    )
    for m in pat.finditer(text):
        comment = m.group(1)
        i = comment.find("Returns")
        out[m.group(2)] = set(re.findall(r"-(E[A-Z]+)\b", comment[i:])) if i >= 0 else set()
    return out


def header_vocabulary(path: Path) -> set[str]:
    text = path.read_text()
    m = re.search(r"Error vocabulary:(.*?)- Thread safety", text, re.S)
    assert m, "include/chm.h has no 'Error vocabulary:' paragraph"
    return set(re.findall(r"-(E[A-Z]+)\b", m.group(1)))


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The JSON printed by tests/c/test_spec_tables.c."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: cannot build tests/c/test_spec_tables.c")
    exe = tmp_path_factory.mktemp("spec_tables") / "test_spec_tables"
    build = subprocess.run(
        [
            gcc,
            "-std=gnu11",
            "-O2",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Iinclude",
            "-Icsrc",
            "tests/c/test_spec_tables.c",
            "-o",
            str(exe),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, f"build failed:\n{build.stderr}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    print(run.stderr)
    assert run.returncode == 0, f"test_spec_tables failed its own checks:\n{run.stderr}"
    tables: dict[str, Any] = json.loads(run.stdout)
    return tables


# ---- enums ----


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_state_enum_matches_spec(code: dict[str, Any], machine: str) -> None:
    m = MACHINES[machine]
    spec_enum = {s["c_name"]: s["value"] for s in m["states"]}
    assert m["c_enum"] in code["enums"], f"the C program does not print {m['c_enum']}"
    assert code["enums"][m["c_enum"]] == spec_enum


def test_c_program_prints_the_header_enums(code: dict[str, Any]) -> None:
    """The program's hand-written enum lists are complete: they equal what the
    headers declare, so an enumerator added to a header cannot slip past."""
    declared = header_enums(CHM_H) | header_enums(STATES_H)
    declared["chm_req_state"] = header_enums(DEV_H)["chm_req_state"]
    assert set(code["enums"]) == set(declared)
    for name, vals in declared.items():
        assert code["enums"][name] == vals, name


def test_every_state_enum_has_a_machine() -> None:
    state_enums = {"chm_slot_state", "chm_wbuf_state", "chm_line_state", "chm_res_state"}
    assert state_enums <= set(header_enums(STATES_H))
    assert not state_enums & set(header_enums(CHM_H)), "internal states in the public header"
    assert {m["c_enum"] for m in MACHINES.values()} == state_enums | {"chm_req_state"}


def test_prefetch_flags_match_spec(code: dict[str, Any]) -> None:
    flags = code["enums"]["chm_prefetch_flags"]
    consts = SPEC["commands"]["constants"]
    assert flags == {f: consts[f]["value"] for f in ("CHM_PF_NOQUEUE", "CHM_PF_RETAIN")}


# ---- transition tables ----


def _named_rows(machine: dict[str, Any], rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    by_value = {s["value"]: s["name"] for s in machine["states"]}
    out = []
    for r in rows:
        assert r["from"] in by_value and r["to"] in by_value, f"unknown state in {r}"
        out.append((by_value[r["from"]], by_value[r["to"]], r["event"]))
    return sorted(out)


@pytest.mark.parametrize("machine", sorted(n for n, m in MACHINES.items() if m["c_table"]))
def test_transition_table_matches_spec(code: dict[str, Any], machine: str) -> None:
    m = MACHINES[machine]
    c_rows = _named_rows(m, code["tables"][m["c_table"]])
    spec_rows = specdata.transitions(m)
    only_c = sorted(set(c_rows) - set(spec_rows))
    only_spec = sorted(set(spec_rows) - set(c_rows))
    assert not only_c and not only_spec, (
        f"{m['c_table']} vs fw_spec: only in C: {only_c}; only in the spec: {only_spec}"
    )
    assert c_rows == spec_rows  # same multiplicity too


def test_every_c_table_is_specified(code: dict[str, Any]) -> None:
    declared = set(
        re.findall(r"static const struct chm_transition (\w+)\[\]", STATES_H.read_text())
    )
    assert declared == set(code["tables"]), "test_spec_tables.c misses a table"
    assert declared == {m["c_table"] for m in MACHINES.values() if m["c_table"]}


# ---- error codes and constants ----


def test_error_codes_match(code: dict[str, Any]) -> None:
    spec_errors = {e["name"]: e["value"] for e in SPEC["commands"]["errors"]}
    assert code["errors"] == spec_errors


def test_error_vocabulary_is_the_headers() -> None:
    assert {e["name"] for e in SPEC["commands"]["errors"]} == header_vocabulary(CHM_H)


def test_constants_match(code: dict[str, Any]) -> None:
    for name, c in SPEC["commands"]["constants"].items():
        assert code["constants"].get(name) == c["value"], name


def test_handle_layout(code: dict[str, Any]) -> None:
    """The fields tile the 64 bits for every index width k (1..24, the bit
    length of the number of request entries), leaving the generation at least
    24 bits."""
    fields = SPEC["commands"]["handle"]["fields"]
    assert SPEC["commands"]["handle"]["bits"] == code["handle_bits"] == 64
    assert [f["name"] for f in fields] == ["tag", "generation", "index"]

    def bit(expr: str, k: int) -> int:
        return int(eval(expr, {"__builtins__": {}}, {"k": k}))  # e.g. "k-1"

    for k in range(1, 25):
        top = 63
        for f in fields:
            hi, lo = (bit(x, k) for x in f["bits"].split(".."))
            assert hi == top and lo <= hi, f"handle field {f['name']} is not contiguous at k={k}"
            top = lo - 1
        assert top == -1, f"handle fields do not cover 64 bits at k={k}"
        gen = next(f for f in fields if f["name"] == "generation")
        hi, lo = (bit(x, k) for x in gen["bits"].split(".."))
        assert hi - lo + 1 >= 24


# ---- commands against the comments of include/chm.h ----

HEADER_FUNCS = header_functions(CHM_H)


def test_every_header_function_is_a_command() -> None:
    assert set(HEADER_FUNCS) == set(COMMANDS), (
        f"only in chm.h: {sorted(set(HEADER_FUNCS) - set(COMMANDS))}; "
        f"only in commands.yaml: {sorted(set(COMMANDS) - set(HEADER_FUNCS))}"
    )


@pytest.mark.parametrize("func", sorted(HEADER_FUNCS))
def test_header_errors_are_in_spec(func: str) -> None:
    missing = HEADER_FUNCS[func] - set(COMMANDS[func]["errors"])
    assert not missing, f"chm.h says {func} returns {sorted(missing)}, the spec does not"


@pytest.mark.parametrize("func", sorted(HEADER_FUNCS))
def test_spec_errors_are_in_header(func: str) -> None:
    extra = set(COMMANDS[func]["errors"]) - HEADER_FUNCS[func]
    assert not extra, f"the spec says {func} returns {sorted(extra)}, chm.h does not"


def test_the_issue_commands_are_specified() -> None:
    names = {c["name"] for c in COMMANDS.values()}
    for n in (
        "prefetch",
        "wait",
        "release",
        "read",
        "write",
        "flush",
        "stats",
        "open",
        "close",
        "configure.init",
        "configure.set",
        "configure.validate",
    ):
        assert n in names, n
