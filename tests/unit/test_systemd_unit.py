"""contrib/systemd/chm-emu.service works after the documented install steps.

The steps (in the unit's header and docs/daemon.md) install chm into a
virtual environment whose ``bin/chm-emu`` must be the unit's ``ExecStart``.
``systemd-analyze verify`` then checks the unit for real; the install's
prefix is mapped to a scratch directory holding this tree's ``chm-emu``
(the test does not write to /opt). Skipped only where systemd-analyze is
not installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "contrib" / "systemd" / "chm-emu.service"
DOCS = ROOT / "docs" / "daemon.md"
CHM_EMU = Path(sys.executable).parent / "chm-emu"

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


def _exec_start() -> list[str]:
    m = re.search(r"^ExecStart=(.+)$", UNIT.read_text(), re.M)
    assert m, "the unit has no ExecStart"
    return m[1].split()


def _venv_prefixes(text: str) -> set[str]:
    """The prefixes of the documented `python3 -m venv PREFIX && PREFIX/bin/pip install .`."""
    out = set()
    for m in re.finditer(r"python3 -m venv (\S+) && (\S+)/bin/pip install \.", text):
        assert m[1] == m[2], f"the venv {m[1]} and the pip {m[2]}/bin/pip differ"
        out.add(m[1])
    return out


def test_exec_start_is_where_the_documented_install_puts_chm_emu() -> None:
    prefixes = _venv_prefixes(UNIT.read_text())
    assert prefixes == _venv_prefixes(DOCS.read_text()), "the unit and docs/daemon.md differ"
    assert len(prefixes) == 1, prefixes
    (prefix,) = prefixes
    exe, sub, *args = _exec_start()
    assert exe == f"{prefix}/bin/chm-emu"
    assert sub == "serve" and "--config" in args
    # pip installs the console script of that name
    assert re.search(r'^chm-emu = "', (ROOT / "pyproject.toml").read_text(), re.M)


def _verify(unit_text: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    unit = tmp / "chm-emu.service"
    unit.write_text(unit_text)
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120
    )


@needs_analyze
def test_systemd_analyze_verify_is_clean_after_the_install(tmp_path: Path) -> None:
    assert CHM_EMU.exists(), f"{CHM_EMU}: chm-emu is not installed beside this Python"
    (prefix,) = _venv_prefixes(UNIT.read_text())
    scratch = tmp_path / "root" / prefix.lstrip("/")
    (scratch / "bin").mkdir(parents=True)
    (scratch / "bin" / "chm-emu").symlink_to(CHM_EMU)
    text = UNIT.read_text().replace(f"ExecStart={prefix}/", f"ExecStart={scratch}/")
    assert text != UNIT.read_text()
    proc = _verify(text, tmp_path)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
    # the check can fail: a unit whose ExecStart nothing installed is reported
    bad = _verify(text.replace(f"{scratch}/bin/chm-emu", f"{tmp_path}/nothing/chm-emu"), tmp_path)
    assert bad.returncode != 0 and "is not executable" in bad.stderr, bad.stderr
