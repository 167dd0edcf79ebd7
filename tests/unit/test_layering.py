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

The Python packages follow the same rule (the second half of this file): a
table of package groups and what each may import, checked over every import
of chm/ and emulator/ (as chm_emu) with the ast module, no import cycle
between modules beyond the known ones listed to be removed, and scratch
copies with an upward import, chm importing chm_emu, and a new cycle put in.
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
_IDENT = re.compile(r"(?<!struct )\b([A-Za-z_]\w*)")
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
        # a call or a reference (a hook in a table); "struct chm_stats"
        # names the type, not the function
        used = set(_IDENT.findall(code[p]))
        for name, owner in defined.items():
            if owner != mod and name in used:
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


# ---------------------------------------------------------------- Python packages
#
# The same rule one level up (docs/design.md §2): every module of chm/ and of
# emulator/ (installed as chm_emu) belongs to one package group, and a group
# imports only the groups its row of MAY_IMPORT names. Every import counts:
# module level, inside functions (lazy), and under TYPE_CHECKING, since each
# ties one module to another. Imports of the group's own modules are free.
#
# The groups' order, bottom first: the driver (core), then the KV layer, then
# what is built on them: the wire protocol (chm.remote.protocol), the daemon
# server (chm.daemon) and the remote client (chm.remote), which share only
# the protocol, the simulation (chm.sim: its workloads, then its replay), the
# engines' adapters, the test support; chm_emu (the commands) may use all of
# chm, and nothing in chm imports chm_emu. The rows of core, kv, remote and
# integrations name none of sim, workloads and replay: nothing there imports
# chm.sim; nor of daemon: the server is a library module that only the
# commands (and the tests) start.

import ast  # noqa: E402 - the Python half of the file keeps its own imports
import functools  # noqa: E402

PY_GROUPS: dict[str, str] = {
    # module prefix -> group; the longest matching prefix wins
    "chm": "core",
    "chm.kv": "kv",
    "chm.remote": "remote",
    "chm.remote.protocol": "protocol",
    "chm.daemon": "daemon",
    "chm.sim": "sim",
    "chm.sim.workloads": "workloads",
    "chm.sim.replay": "replay",
    "chm.integrations": "integrations",
    "chm.testing": "testing",
    "chm_emu": "chm_emu",
}

MAY_IMPORT: dict[str, set[str]] = {
    "core": {"core"},
    "kv": {"core"},
    "protocol": {"core"},
    "remote": {"core", "kv", "protocol"},
    "daemon": {"core", "kv", "protocol"},
    # chm.sim: the package itself names its two halves and imports neither
    "sim": {"core"},
    "workloads": {"core"},
    "replay": {"core", "kv", "workloads"},
    # the adapters open a local store, a daemon's or remote nodes' (chm.remote)
    "integrations": {"core", "kv", "remote"},
    "testing": {"core", "kv", "protocol", "remote", "workloads", "replay"},
    "chm_emu": {
        "core",
        "kv",
        "protocol",
        "remote",
        "daemon",
        "sim",
        "workloads",
        "replay",
        "integrations",
        "testing",
        "chm_emu",
    },
}

# Single edges allowed against the table, each with its reason.
PY_ALLOWED: dict[tuple[str, str], str] = {
    # chm.connect() is the driver's front door to a daemon: a lazy import, so
    # `import chm` never loads the client
    ("chm", "chm.remote"): "chm.connect()",
    # a daemon that is a remote storage node registers and publishes in the
    # Master and lends its memory to the Transfer Engine (chm.daemon.node)
    ("chm.daemon.node", "chm.remote.master"): "a storage node's Master",
    ("chm.daemon.node", "chm.remote.transfer"): "a storage node's data path",
}

# Only chm._lowlevel (the package and its modules) uses the cffi library (the
# one choke point for errors).
FFI_USERS = {"chm._lowlevel"}


def ffi_user(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in FFI_USERS)


# Import cycles between modules known today, each to be removed; the test
# fails when one is gone, so the entry goes with it. The top-level `chm`
# package (a facade that re-exports the driver) is not a node: a module that
# does `import chm` for chm.Device depends on the driver, not on everything
# the facade names.
KNOWN_CYCLES: list[set[str]] = []


def py_modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for chm/ and emulator/ (as chm_emu)."""
    out: dict[str, Path] = {}
    for base, name in (("chm", "chm"), ("emulator", "chm_emu")):
        for p in sorted((root / base).rglob("*.py")):
            parts = [name, *p.relative_to(root / base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


@functools.cache
def _import_nodes(text: str) -> tuple[tuple[int, str, tuple[str, ...]], ...]:
    """(level, module, names) of every import in a source text: -1 for
    ``import a, b``. Parsed once per text: most tests check the same files."""
    out: list[tuple[int, str, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out.append((-1, "", tuple(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or "", tuple(a.name for a in node.names)))
    return tuple(out)


def py_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules name imports, anywhere in the file."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for level, module, names in _import_nodes(path.read_text()):
        if level < 0:
            found.update(names)
            continue
        if level:
            base = pkg.split(".")[: len(pkg.split(".")) - level + 1]
            mod = ".".join([*base, *([module] if module else [])])
        else:
            mod = module
        for a in names:  # `from pkg import module` names the module
            sub = f"{mod}.{a}"
            found.add(sub if sub in known else mod)
    return {m for m in found if m.split(".")[0] in ("chm", "chm_emu") and m != name}


def py_group(module: str) -> str | None:
    best = None
    for prefix in PY_GROUPS:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best)
        ):
            best = prefix
    return None if best is None else PY_GROUPS[best]


def py_graph(root: Path) -> dict[str, set[str]]:
    mods = py_modules(root)
    known = set(mods)
    return {name: py_imports(name, path, known) for name, path in mods.items()}


def py_violations(root: Path) -> list[str]:
    out = []
    for mod, deps in sorted(py_graph(root).items()):
        src = py_group(mod)
        if src is None:
            out.append(f"{mod}: in no group of PY_GROUPS")
            continue
        for dep in sorted(deps):
            dst = py_group(dep)
            if dep.startswith("chm._ffi") or dep == "chm._chm_cffi":
                if not ffi_user(mod) and not mod.startswith("chm._ffi"):
                    out.append(f"{mod} imports {dep}: only chm._lowlevel uses the cffi library")
                continue
            if dst is None or dst == src or dst in MAY_IMPORT[src]:
                continue
            if (mod, dep) in PY_ALLOWED or (mod, dep.rpartition(".")[0]) in PY_ALLOWED:
                continue
            out.append(f"{mod} imports {dep}: {src} may not import {dst}")
    return out


def py_cycles(root: Path) -> list[set[str]]:
    """The module import cycles (strongly connected components of more than
    one module), the facade `chm` left out."""
    graph = {m: {d for d in ds if d != "chm"} for m, ds in py_graph(root).items() if m != "chm"}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_python_packages_import_downwards() -> None:
    assert py_violations(ROOT) == []


def test_python_checker_sees_the_packages() -> None:
    graph = py_graph(ROOT)
    groups = {py_group(m) for m in graph}
    assert groups == set(MAY_IMPORT), groups
    assert "chm.errors" in graph["chm.device"]
    assert "chm._lowlevel" in graph["chm.device"]
    assert "chm_emu.kv_cmd" in graph["chm_emu.cli"]  # `from .kv_cmd import kv`


def test_no_new_python_import_cycle() -> None:
    found = py_cycles(ROOT)
    new = [sorted(c) for c in found if not any(c == k for k in KNOWN_CYCLES)]
    assert new == [], f"new import cycles: {new}"
    gone = [sorted(k) for k in KNOWN_CYCLES if not any(c == k for c in found)]
    assert gone == [], f"known cycles no longer there (drop them from KNOWN_CYCLES): {gone}"


def _py_scratch(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "*.c")
    shutil.copytree(ROOT / "chm", root / "chm", ignore=ignore)
    shutil.copytree(ROOT / "emulator", root / "emulator", ignore=ignore)
    return root


def test_python_upward_import_fails(tmp_path: Path) -> None:
    root = _py_scratch(tmp_path)
    sizes = root / "chm" / "sizes.py"
    sizes.write_text(sizes.read_text() + "\n\ndef _late() -> None:\n    import chm.kv.store\n")
    assert py_violations(root) == ["chm.sizes imports chm.kv.store: core may not import kv"]


def test_chm_importing_chm_emu_fails(tmp_path: Path) -> None:
    root = _py_scratch(tmp_path)
    store = root / "chm" / "kv" / "index.py"
    store.write_text("from chm_emu.cli import main\n" + store.read_text())
    assert py_violations(root) == ["chm.kv.index imports chm_emu.cli: kv may not import chm_emu"]


@pytest.mark.parametrize(
    ("module", "group"),
    [
        ("device.py", "core"),
        ("kv/store.py", "kv"),
        ("integrations/lmcache.py", "integrations"),
        ("remote/client.py", "remote"),
    ],
)
def test_importing_the_daemon_from_below_fails(tmp_path: Path, module: str, group: str) -> None:
    root = _py_scratch(tmp_path)
    path = root / "chm" / module
    path.write_text("from chm.daemon.server import Daemon\n" + path.read_text())
    name = "chm." + module.removesuffix(".py").replace("/", ".")
    assert py_violations(root) == [
        f"{name} imports chm.daemon.server: {group} may not import daemon"
    ]


def test_the_daemon_and_its_connections_do_not_import_each_other() -> None:
    """The connection handler, the TCP front end and the metrics endpoint
    see the daemon through chm.daemon.options.Host, never chm.daemon.server."""
    graph = py_graph(ROOT)
    assert "chm.daemon.connection" in graph["chm.daemon.server"]
    for mod in ("chm.daemon.connection", "chm.daemon.tcp", "chm.daemon.metrics"):
        assert "chm.daemon.server" not in graph[mod], mod


@pytest.mark.parametrize(
    ("module", "group"),
    [
        ("device.py", "core"),
        ("kv/index.py", "kv"),
        ("integrations/lmcache.py", "integrations"),
        ("remote/node.py", "remote"),
    ],
)
def test_importing_the_simulation_from_below_fails(tmp_path: Path, module: str, group: str) -> None:
    root = _py_scratch(tmp_path)
    path = root / "chm" / module
    path.write_text("from chm.sim.replay.lru import LruBlocks\n" + path.read_text())
    name = "chm." + module.removesuffix(".py").replace("/", ".")
    assert py_violations(root) == [
        f"{name} imports chm.sim.replay.lru: {group} may not import replay"
    ]


def test_a_python_cycle_fails(tmp_path: Path) -> None:
    root = _py_scratch(tmp_path)
    errors = root / "chm" / "errors.py"
    errors.write_text(
        errors.read_text() + "\n\ndef _late() -> None:\n    from chm.config import Config\n"
    )
    assert any({"chm.config", "chm.errors"} <= c for c in py_cycles(root))
