"""Loads and checks the machine-readable chm device specification.

    fw_spec/commands.yaml   commands, error vocabulary, constants, handle format
    fw_spec/staging.yaml    slot and request machines, refill queue, S invariants
    fw_spec/wbuf.yaml       write-buffer entry machine, flusher, W invariants
    fw_spec/lru.yaml        LRU line machine, L invariants
    fw_spec/resident.yaml   resident entry machine, R invariants

Not a package module: tests load it by path. ``python3 fw_spec/specdata.py``
checks the files and prints a summary (exit 1 on problems);
``python3 fw_spec/specdata.py --tables`` prints the README's tables.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
FILES = ("commands", "staging", "wbuf", "lru", "resident")
ID_PREFIX = {"staging": "S", "wbuf": "W", "lru": "L", "resident": "R"}
CHECKERS = {"model", "property", "c", "unit", "spec"}


def load(root: Path = HERE) -> dict[str, Any]:
    """{"commands": ..., "staging": ..., "wbuf": ..., "lru": ..., "resident": ...}"""
    out = {}
    for name in FILES:
        with open(root / f"{name}.yaml", encoding="utf-8") as f:
            out[name] = yaml.safe_load(f)
    return out


def machines(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every state machine by name: slot, request, entry, line."""
    out: dict[str, dict[str, Any]] = {}
    for part in ("staging", "wbuf", "lru", "resident"):
        for name, m in spec[part]["machines"].items():
            out[name] = m
    return out


def invariants(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every invariant, with the spec part it belongs to as "part"."""
    out = []
    for part in ("staging", "wbuf", "lru", "resident"):
        for inv in spec[part]["invariants"]:
            out.append({**inv, "part": part})
    return out


def property_ids(spec: dict[str, Any]) -> dict[str, str]:
    """{id: text} of the invariants that the hypothesis state machines in
    chm/testing/ must check and name."""
    return {i["id"]: i["text"] for i in invariants(spec) if "property" in i["checked_by"]}


def transitions(machine: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The machine's rows as (from, to, event), sorted."""
    return sorted((t["from"], t["to"], t["event"]) for t in machine["transitions"])


def problems(spec: dict[str, Any]) -> list[str]:
    """Internal consistency of the spec files; [] when all is well."""
    bad: list[str] = []
    vocab = {e["name"]: e for e in spec["commands"]["errors"]}
    if len(vocab) != len(spec["commands"]["errors"]):
        bad.append("commands.yaml: an error name is listed twice")
    named = set(spec["commands"]["constants"]) | {"count"}

    funcs = set()
    for cmd in spec["commands"]["commands"]:
        where = f"commands.yaml: {cmd.get('name')}"
        # an unquoted comma in a flow mapping silently makes a new key
        for r in cmd.get("returns", []):
            if set(r) - {"code", "when"}:
                bad.append(f"{where}: return entry with unknown keys {r}")
        for a in cmd.get("args", []):
            if set(a) - {"name", "type", "dir", "rule"}:
                bad.append(f"{where}: argument with unknown keys {a}")
        for key in ("name", "function", "group", "args", "blocking", "effect", "returns", "errors"):
            if key not in cmd:
                bad.append(f"{where}: no {key}")
        if cmd["function"] in funcs:
            bad.append(f"{where}: {cmd['function']} described twice")
        funcs.add(cmd["function"])
        errs = set(cmd.get("errors", []))
        unknown = errs - set(vocab)
        if unknown:
            bad.append(f"{where}: errors outside the vocabulary: {sorted(unknown)}")
        codes = [r["code"] for r in cmd.get("returns", [])]
        ret_errs = {c for c in codes if c not in (0,) and c not in named}
        if ret_errs != errs:
            bad.append(f"{where}: returns list {sorted(ret_errs)} but errors {sorted(errs)}")

    for name, m in machines(spec).items():
        where = f"machine {name}"
        names = [s["name"] for s in m["states"]]
        values = [s["value"] for s in m["states"]]
        if len(set(names)) != len(names) or len(set(values)) != len(values):
            bad.append(f"{where}: state names or values repeat")
        if m["initial"] not in names:
            bad.append(f"{where}: initial state {m['initial']} is not a state")
        for s in m["states"]:
            if set(s) - {"name", "c_name", "value", "meaning", "stored"}:
                bad.append(f"{where}: state with unknown keys {s}")
            if not s.get("c_name") or not s.get("meaning"):
                bad.append(f"{where}: state {s['name']} lacks c_name or meaning")
        for tr in m["transitions"]:
            if set(tr) - {"from", "to", "event", "by", "action"}:
                bad.append(f"{where}: transition with unknown keys {tr}")
        rows = transitions(m)
        if len(set(rows)) != len(rows):
            bad.append(f"{where}: a transition row repeats")
        for f, t, e in rows:
            if f not in names or t not in names:
                bad.append(f"{where}: {f} -> {t} ({e}) names an unknown state")
            if f == t:
                bad.append(f"{where}: {f} -> {t} ({e}) is a self-loop")

    seen: set[str] = set()
    for part, prefix in ID_PREFIX.items():
        ids = [i["id"] for i in spec[part]["invariants"]]
        want = [f"{prefix}{n}" for n in range(1, len(ids) + 1)]
        if ids != want:
            bad.append(
                f"{part}.yaml: invariant ids must be {want[0]}..{want[-1]} in order, got {ids}"
            )
        for inv in spec[part]["invariants"]:
            if inv["id"] in seen:
                bad.append(f"{inv['id']} is defined twice")
            seen.add(inv["id"])
            if not str(inv.get("text", "")).strip():
                bad.append(f"{inv['id']}: no text")
            cb = inv.get("checked_by") or []
            if not cb or set(cb) - CHECKERS:
                bad.append(
                    f"{inv['id']}: checked_by must be a non-empty subset "
                    f"of {sorted(CHECKERS)}, got {cb}"
                )
    return bad


def invariant_ids_in(text: str) -> set[str]:
    """Invariant ids mentioned in text (S1, W10, L3, R2 ...)."""
    return set(re.findall(r"(?<![A-Za-z0-9_])([SWLR][1-9][0-9]*)(?![0-9A-Za-z])", text))


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|")


def markdown_tables(spec: dict[str, Any]) -> dict[str, list[str]]:
    """The README tables, generated from the yaml: {title: lines}. The README
    must contain every line (tests/spec/test_spec_schema.py)."""
    out: dict[str, list[str]] = {}
    for name, m in machines(spec).items():
        lines = ["| value | state | C name | meaning |", "|---|---|---|---|"]
        lines += [
            f"| {s['value']} | {s['name']} | `{s['c_name']}` | {_cell(s['meaning'])} |"
            for s in m["states"]
        ]
        out[f"{name} states"] = lines
        lines = ["| from | to | event | taken when | action |", "|---|---|---|---|---|"]
        lines += [
            f"| {t['from']} | {t['to']} | `{t['event']}` | {_cell(t.get('by', ''))} "
            f"| {_cell(t.get('action', ''))} |"
            for t in m["transitions"]
        ]
        out[f"{name} transitions"] = lines
    for part in ("staging", "wbuf", "lru", "resident"):
        lines = ["| id | invariant | checked by |", "|---|---|---|"]
        lines += [
            f"| {i['id']} | {_cell(i['text'])} | {', '.join(i['checked_by'])} |"
            for i in spec[part]["invariants"]
        ]
        out[f"{part} invariants"] = lines
    lines = ["| error | value | meaning | returned by |", "|---|---|---|---|"]
    for e in spec["commands"]["errors"]:
        cmds = [c["function"] for c in spec["commands"]["commands"] if e["name"] in c["errors"]]
        lines.append(f"| {e['name']} | {e['value']} | {_cell(e['meaning'])} | {', '.join(cmds)} |")
    out["errors"] = lines
    for c in spec["commands"]["commands"]:
        if not c["returns"]:
            continue
        lines = ["| returns | when |", "|---|---|"]
        for r in c["returns"]:
            code = r["code"]
            if code == 0:
                shown = "0"
            elif code == "count":
                shown = "a count"
            elif str(code).startswith("CHM_"):
                shown = code
            else:
                shown = f"-{code}"
            lines.append(f"| {shown} | {_cell(r.get('when', ''))} |")
        if c.get("other_errno"):
            lines.append(f"| other -errno | {_cell(c['other_errno'])} |")
        out[f"returns of {c['function']}"] = lines
    return out


def main() -> int:
    spec = load()
    if sys.argv[1:] == ["--tables"]:
        for title, lines in markdown_tables(spec).items():
            print(f"<!-- {title} -->")
            print("\n".join(lines))
            print()
        return 0
    bad = problems(spec)
    for b in bad:
        print("problem:", b)
    ms = machines(spec)
    invs = invariants(spec)
    print(
        f"{len(spec['commands']['commands'])} commands, "
        f"{len(spec['commands']['errors'])} error codes, {len(ms)} machines "
        f"({', '.join(ms)}), {len(invs)} invariants, "
        f"{len(property_ids(spec))} checked by the property tests"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
