"""README.md and every page of docs/ are tested: what they show runs, what they name exists.

- every fenced ``python`` block runs as written, each in a fresh interpreter,
  in a scratch directory holding the files its page shows (a fenced block
  whose info string carries ``file=NAME``, e.g. ```` ```toml file=device.toml ````);
- in the ``sh`` blocks, ``chm-emu ...`` commands run, ``make TARGET...`` runs
  as ``make -n TARGET...``, and ``python SCRIPT`` runs as ``SCRIPT --help``;
  any other command (package installs, venv creation) is not run;
- every ``chm-emu SUBCOMMAND``, ``make TARGET``, layout-table path, repository
  path, ``chm.*`` name written in code spans and relative link exists.

Blocks are found by parsing, so pages and sections added later are covered
without a change here.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from chm_emu.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    lang: str
    attrs: dict[str, str]
    text: str
    line: int  # 1-based line of the opening fence
    page: str = "README.md"  # path relative to the repository root

    @property
    def id(self) -> str:
        return f"{self.page}:{self.lang or 'plain'}@L{self.line}"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def parse_blocks(markdown: str, page: str = "README.md") -> list[Block]:
    """The fenced code blocks of a CommonMark document, in order."""
    blocks: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m["fence"], m["info"].strip()
        words = info.split()
        lang = words[0].lower() if words else ""
        attrs = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = lines[i].strip()
            if close.startswith(fence[0] * len(fence)) and not close.strip(fence[0]):
                break
            body.append(lines[i])
            i += 1
        else:
            raise AssertionError(f"{page}:{start + 1}: fenced block is never closed")
        blocks.append(Block(lang, attrs, "\n".join(body) + "\n", start + 1, page))
        i += 1
    return blocks


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


TEXTS = {_rel(p): p.read_text() for p in PAGES}
BLOCKS_OF = {page: parse_blocks(text, page) for page, text in TEXTS.items()}
BLOCKS = [b for page in TEXTS for b in BLOCKS_OF[page]]
PYTHON = [b for b in BLOCKS if b.lang in ("python", "py", "python3")]
SHELL = [b for b in BLOCKS if b.lang in ("sh", "bash", "shell", "console")]


def _text_outside_blocks(markdown: str, blocks: list[Block]) -> str:
    keep: list[str] = []
    lines = markdown.splitlines()
    inside = {b.line + k for b in blocks for k in range(b.text.count("\n") + 2)}
    for n, line in enumerate(lines, 1):
        if n not in inside:
            keep.append(line)
    return "\n".join(keep)


PROSE_OF = {page: _text_outside_blocks(text, BLOCKS_OF[page]) for page, text in TEXTS.items()}
PROSE = "\n".join(PROSE_OF.values())
SPANS = re.findall(r"`([^`\n]+)`", PROSE)


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("CHM_TMPDIR", str(tmp))
    return env


def _write_fixtures(tmp: Path, page: str) -> None:
    for b in BLOCKS_OF[page]:
        if "file" not in b.attrs:
            continue
        name = b.attrs["file"]
        assert not os.path.isabs(name) and ".." not in Path(name).parts, name
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(b.text)


# ---------------------------------------------------------------- parsing


def test_parser_finds_blocks_and_fixtures() -> None:
    sample = "text\n```python\nx = 1\n```\n\n````toml file=a.toml\nk = 1\n````\n~~~sh\nls\n~~~\n"
    got = parse_blocks(sample)
    assert [(b.lang, b.attrs, b.text, b.line) for b in got] == [
        ("python", {}, "x = 1\n", 2),
        ("toml", {"file": "a.toml"}, "k = 1\n", 6),
        ("sh", {}, "ls\n", 9),
    ]
    with pytest.raises(AssertionError, match="never closed"):
        parse_blocks("```python\nx = 1\n")


def test_readme_has_examples() -> None:
    readme = BLOCKS_OF["README.md"]
    assert any(b.lang == "python" for b in readme), "README.md has no python block"
    assert any(b.lang == "sh" for b in readme), "README.md has no shell block"


def test_docs_pages_are_checked() -> None:
    pages = set(TEXTS)
    want = {f"docs/{n}.md" for n in ("design", "driver", "kv", "daemon", "replay")}
    want |= {f"docs/{n}.md" for n in ("integrations", "benchmarks", "troubleshooting")}
    assert want <= pages, sorted(want - pages)
    assert {b.page for b in PYTHON} >= {"README.md", "docs/driver.md", "docs/kv.md"}


# ---------------------------------------------------------------- python blocks


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    _write_fixtures(tmp_path, block.page)
    script = tmp_path / f"{Path(block.page).stem}_L{block.line}.py"
    script.write_text(block.text)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"{block.where}: the python block failed (exit {proc.returncode})\n"
        f"--- block ---\n{block.text}--- stderr ---\n{proc.stderr}"
    )


# ---------------------------------------------------------------- shell blocks


def _commands(block: Block) -> list[list[str]]:
    out = []
    for raw in block.text.splitlines():
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        for part in re.split(r"\s*&&\s*", line):
            words = shlex.split(part, comments=True)
            if words:
                out.append(words)
    return out


def _safe_form(words: list[str]) -> list[str] | None:
    """How a README command is run here, or None when it is not run."""
    name = os.path.basename(words[0])
    if name == "chm-emu":
        return [str(BIN / "chm-emu"), *words[1:]]
    if name == "make":
        return ["make", "-n", *words[1:]]
    if re.fullmatch(r"python3?(\.\d+)?", name) and len(words) > 1 and words[1].endswith(".py"):
        return [sys.executable, str(ROOT / words[1]), "--help"]
    return None


SHELL_COMMANDS = [(b, w) for b in SHELL for w in _commands(b)]


def _is_full_demo(words: list[str]) -> bool:
    """`chm-emu demo` at its full size: ~20 s of real-time replay (slow tier)."""
    return os.path.basename(words[0]) == "chm-emu" and words[1:2] == ["demo"]


def _distinct_commands() -> list[object]:
    """Each command once (the first block that shows it), the full demo marked slow."""
    seen: set[tuple[str, ...]] = set()
    out: list[object] = []
    for b, w in SHELL_COMMANDS:
        key = (os.path.basename(w[0]), *w[1:])
        if key in seen:
            continue
        seen.add(key)
        marks = [pytest.mark.slow] if _is_full_demo(w) else []
        out.append(pytest.param(b, w, marks=marks, id=f"{b.id}:{' '.join(w)[:40]}"))
    return out


def test_small_demo_runs(tmp_path: Path) -> None:
    """The fast variant of the pages' `chm-emu demo`: the same replay, 2 users x 2 turns."""
    assert any(_is_full_demo(w) for _, w in SHELL_COMMANDS), "no page shows `chm-emu demo`"
    cmd = [str(BIN / "chm-emu"), "demo", "--users", "2", "--turns", "2", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert list(tmp_path.glob("*.json")), "the demo wrote no JSON results"


@pytest.mark.parametrize(("block", "words"), _distinct_commands())
def test_shell_command(block: Block, words: list[str], tmp_path: Path) -> None:
    form = _safe_form(words)
    if form is None:
        pytest.skip(f"{block.where}: not run here (changes the system): {' '.join(words)}")
    proc = subprocess.run(
        form,
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"{block.where}: `{' '.join(words)}` (run as `{' '.join(form)}`) "
        f"exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    )


# ---------------------------------------------------------------- names


def _subcommands() -> set[str]:
    return set(getattr(cli_main, "commands", {}))


# Words that follow a prose `chm-emu` without naming a subcommand of it.
_PROSE_WORDS = {"and", "or", "command", "commands", "subcommand", "subcommands", "says", "is"}


def test_chm_emu_subcommands_exist() -> None:
    commands = [" ".join(w) for _, w in SHELL_COMMANDS] + SPANS
    named = {m[1] for c in commands for m in re.finditer(r"\bchm-emu\s+([a-z][\w-]*)", c)}
    # "the `chm-emu` daemon" in prose claims a subcommand as well
    prose = set(re.findall(r"`chm-emu`\s+([a-z][\w-]*)", PROSE)) - _PROSE_WORDS
    named |= prose
    assert named, "README.md or docs/ name no chm-emu subcommand"
    missing = named - _subcommands()
    assert not missing, f"README.md or docs/ name chm-emu subcommands not there: {sorted(missing)}"


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M))


def test_make_targets_exist() -> None:
    commands = [" ".join(w) for _, w in SHELL_COMMANDS] + SPANS
    named = {m[1] for c in commands if (m := re.match(r"make\s+([a-z][\w-]*)", c.strip()))}
    assert {"demo", "test"} <= named
    missing = named - _make_targets()
    assert not missing, f"README.md or docs/ name make targets that do not exist: {sorted(missing)}"


def _layout_paths() -> list[str]:
    text = TEXTS["README.md"]
    m = re.search(r"^## Layout\n(.*?)(?=^## )", text, re.M | re.S)
    assert m, "README.md has no '## Layout' section"
    rows = re.findall(r"^\|\s*`([^`]+)`\s*\|", m[1], re.M)
    assert rows, "the layout table lists no paths"
    return rows


def test_layout_paths_exist() -> None:
    missing = [p for p in _layout_paths() if not (ROOT / p).exists()]
    assert not missing, f"README.md layout lists paths that do not exist: {missing}"


_TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} | {".ci"}


def _repo_paths() -> set[str]:
    """Code spans that are repository paths: a/b[/...] under an existing top level."""
    out = set()
    words = [w for _, ws in SHELL_COMMANDS for w in ws]
    for span in [*SPANS, *words]:
        for word in span.split():
            word = word.rstrip(".,;:)")
            path_like = re.fullmatch(r"[\w.-]+(/[\w.*-]+)*/?", word) and "/" in word
            if path_like and word.split("/", 1)[0] in _TOP:
                out.add(word)
    return out


def test_repo_paths_exist() -> None:
    paths = _repo_paths()
    assert "tools/bench/refill_bw.py" in paths  # the scan sees the benchmark paths
    missing = sorted(p for p in paths if not list(ROOT.glob(p.rstrip("/"))))
    assert not missing, f"README.md or docs/ name paths that do not exist: {missing}"


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_chm_names_exist() -> None:
    names = set()
    for span in SPANS:
        m = re.fullmatch(r"(chm(?:\.\w+)+)(?:\(\))?", span.strip())
        if m:
            names.add(m[1])
    assert "chm.errors.NotSupported" in names
    missing = []
    for name in sorted(names):
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name} ({exc})")
    assert not missing, f"README.md or docs/ name chm objects that do not exist: {missing}"


def test_stats_names_exist() -> None:
    import chm

    named = set(re.findall(r"\bStats\.(\w+)", "\n".join(TEXTS.values())))
    assert named
    missing = sorted(n for n in named if not hasattr(chm.Stats, n))
    assert not missing, f"README.md or docs/ name Stats fields that do not exist: {missing}"


# ---------------------------------------------------------------- links

_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(text: str, blocks: list[Block]) -> set[str]:
    prose = _text_outside_blocks(text, blocks)
    return {_slug(m[1]) for m in re.finditer(r"^#{1,6}\s+(.*)$", prose, re.M)}


def test_slug_is_githubs() -> None:
    assert _slug("Writes, modes and the timing model") == "writes-modes-and-the-timing-model"
    assert _slug("The daemon: chm-emu serve") == "the-daemon-chm-emu-serve"


def test_relative_links_resolve() -> None:
    bad = []
    for page, prose in PROSE_OF.items():
        base = (ROOT / page).parent
        for target in _LINK.findall(prose):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            dest = (base / path).resolve() if path else ROOT / page
            if not dest.exists():
                bad.append(f"{page}: ({target}): no {path}")
                continue
            if anchor and dest.suffix == ".md":
                rel = _rel(dest)
                text = TEXTS.get(rel, dest.read_text())
                blocks = BLOCKS_OF.get(rel) or parse_blocks(text, rel)
                if anchor not in _anchors(text, blocks):
                    bad.append(f"{page}: ({target}): no heading #{anchor} in {rel}")
    assert not bad, "broken links:\n" + "\n".join(bad)
