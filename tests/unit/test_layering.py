"""The C core calls only downwards (docs/design.md §2 and §3).

Every file of ``csrc/`` (and ``include/chm.h``) belongs to one module, named by
its stem (``staging.c`` and ``staging.h`` are ``staging``), and every module to
one layer of ``LAYERS``, bottom first. A module may include the headers of, and
call the functions or use the tables defined in, modules of lower layers only:
nothing sideways, nothing up. So the include and call graph has no cycle, and a
new file has to be given its place here. Calls through a table of hooks (the
mode table, backend ops, an I/O's ``done``) are how a lower layer reaches an
upper one; they are not named calls and are not edges.

The checker is plain text analysis (comments and strings removed, top-level
definitions found by their braces at column 0), run on the real tree and, to
show that it can fail, on scratch copies with an upward include and an upward
call put in.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Bottom first: the public contract, then internal types, state tables and
# the mode table's type, then code.
LAYERS: list[list[str]] = [
    ["chm"],
    ["counters"],
    ["dev", "states", "mode", "errdetail"],
    ["timing", "pool", "fault", "clock", "targets", "gate", "names"],
    ["config"],
    ["backend_uring", "backend_pread", "backend_ghost"],
    ["iomap"],
    ["wbuf", "lru_index", "session", "resident"],
    ["staging"],
    ["mode_direct", "lru"],
    ["mode_prefetch"],
    ["device"],
    ["session_api"],
]

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# a top-level definition: a name and "(" on a line that starts at column 0,
# not a declaration (those end in ";") and not a static one
_FUNC = re.compile(r"^(?!static\b)(?![ \t#])[^;{}()\n]*?\b([A-Za-z_]\w*)\s*\([^;{]*?\)\s*\{", re.M)
_MODE = re.compile(r"CHM_MODE_(?:PREFETCH|LRU|DIRECT)\b")
_TABLE = re.compile(r"^(?!static\b)const\s+struct\s+\w+\s+([A-Za-z_]\w*)\s*=", re.M)


def module_of(path: Path) -> str:
    return path.stem


def sources(root: Path) -> list[Path]:
    csrc = root / "csrc"
    return sorted([*csrc.glob("*.c"), *csrc.glob("*.h"), root / "include" / "chm.h"])


def _code(path: Path, *, strings: bool = False) -> str:
    text = _COMMENT.sub(" ", path.read_text())
    return text if strings else _STRING.sub('""', text)


def graph(root: Path) -> dict[str, set[tuple[str, str]]]:
    """module -> {(module it depends on, why)} from includes and named calls."""
    files = sources(root)
    code = {p: _code(p) for p in files}
    defined: dict[str, str] = {}
    for p in files:
        if p.suffix != ".c":
            continue
        for m in [*_FUNC.finditer(code[p]), *_TABLE.finditer(code[p])]:
            defined[m.group(1)] = module_of(p)
    edges: dict[str, set[tuple[str, str]]] = {module_of(p): set() for p in files}
    for p in files:
        mod = module_of(p)
        for inc in _INCLUDE.findall(_code(p, strings=True)):
            target = Path(inc).stem
            if target != mod:
                edges[mod].add((target, f'{p.name} includes "{inc}"'))
        if p.suffix != ".c":
            continue  # a header declares; only code calls
        for name, owner in defined.items():
            # a call or a reference (a hook in a table); "struct chm_stats"
            # names the type, not the function
            if owner != mod and re.search(rf"(?<!struct )\b{re.escape(name)}\b", code[p]):
                edges[mod].add((owner, f"{p.name} uses {name}() of {owner}"))
    return edges


def violations(root: Path) -> list[str]:
    layer = {m: i for i, mods in enumerate(LAYERS) for m in mods}
    out: list[str] = []
    edges = graph(root)
    for mod in sorted(edges):
        if mod not in layer:
            out.append(f"{mod}: not in LAYERS (give the new module its layer)")
            continue
        for target, why in sorted(edges[mod]):
            if target not in layer:
                out.append(f"{why}: {target} is not in LAYERS")
            elif layer[target] >= layer[mod]:
                side = "sideways" if layer[target] == layer[mod] else "upwards"
                out.append(f"{why}: {side}, layer {layer[mod]} -> {layer[target]}")
    return out


def cycles(root: Path) -> list[list[str]]:
    """Every cycle found by depth-first search (empty when the graph is a DAG)."""
    edges = {m: {t for t, _ in e} for m, e in graph(root).items()}
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                found.append([*stack[stack.index(t) :], t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return found


def test_calls_and_includes_go_downwards() -> None:
    assert violations(ROOT) == []


def test_no_cycle() -> None:
    assert cycles(ROOT) == []


def test_the_checker_sees_the_core() -> None:
    edges = graph(ROOT)
    deps = {t for t, _ in edges["device"]}
    assert {"staging", "mode", "gate", "targets"} <= deps
    assert "iomap" in {t for t, _ in edges["wbuf"]}
    assert "staging" in {t for t, _ in edges["mode_prefetch"]}


def test_modes_are_a_table_not_branches() -> None:
    """CHM_MODE_* appears in config.c (parsing, validation, derived sizes), in
    names.c's name table and in device.c's mode table only; no other file
    branches on the mode."""
    for p in sorted((ROOT / "csrc").glob("*.[ch]")):
        if p.name in ("config.c", "device.c", "names.c"):
            continue
        assert not _MODE.search(_code(p)), f"{p.name} branches on the mode"
    device = _code(ROOT / "csrc" / "device.c")
    assert [m.group(0) for m in _MODE.finditer(device)] == [
        "CHM_MODE_PREFETCH",
        "CHM_MODE_LRU",
        "CHM_MODE_DIRECT",
    ]
    assert not re.search(r"mode\s*[!=]=", device)


def _scratch(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(ROOT / "csrc", root / "csrc")
    (root / "include").mkdir()
    shutil.copy(ROOT / "include" / "chm.h", root / "include" / "chm.h")
    return root


def test_an_upward_include_fails(tmp_path: Path) -> None:
    root = _scratch(tmp_path)
    iomap = root / "csrc" / "iomap.c"
    iomap.write_text(
        iomap.read_text().replace('#include "iomap.h"', '#include "iomap.h"\n#include "staging.h"')
    )
    (found,) = violations(root)
    assert found.startswith('iomap.c includes "staging.h": upwards, layer ')
    # staging calls iomap's mapping, so the include closes a cycle
    assert any({"iomap", "staging"} <= set(c) for c in cycles(root))


def test_an_upward_call_fails(tmp_path: Path) -> None:
    root = _scratch(tmp_path)
    clock = root / "csrc" / "clock.c"
    clock.write_text(
        clock.read_text().replace(
            "\tif (!dev->timing.enabled)\n", "\tchm_leave(dev);\n\tif (!dev->timing.enabled)\n"
        )
    )
    (found,) = violations(root)
    assert found.startswith("clock.c uses chm_leave() of gate: sideways, layer ")


def test_a_new_file_needs_a_layer(tmp_path: Path) -> None:
    root = _scratch(tmp_path)
    (root / "csrc" / "extra.c").write_text('/* extra.c */\n#include "dev.h"\n')
    assert violations(root) == ["extra: not in LAYERS (give the new module its layer)"]


@pytest.mark.parametrize("name", ["device", "staging", "lru", "mode_prefetch"])
def test_files_have_a_header_comment(name: str) -> None:
    text = (ROOT / "csrc" / f"{name}.c").read_text()
    assert text.startswith(f"/* {name}.c - ")
