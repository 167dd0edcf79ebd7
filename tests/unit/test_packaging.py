"""What the packaging ships: the sdist carries what `make test` needs, the
license is declared, and emulator/ is installed as chm_emu, not as a generic
top-level ``emulator``."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

# the sdist builds in the source tree (chm.egg-info): one build at a time, on one
# pytest-xdist worker
pytestmark = pytest.mark.xdist_group("sdist")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sdist_members(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tarfile.TarInfo]:
    pytest.importorskip("build", reason="the `build` package (test extras) makes the sdist")
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), "."],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (tarball,) = out.glob("chm-*.tar.gz")
    with tarfile.open(tarball) as tf:
        # strip the leading "chm-<version>/"
        return {m.name.partition("/")[2]: m for m in tf.getmembers()}


@pytest.mark.parametrize(
    "path",
    [
        "LICENSE",
        "Makefile",
        "pyproject.toml",
        "setup.py",
        "include/chm.h",
        "scripts/setup.sh",
        "scripts/apt-get-wait.sh",
        "tests/conftest.py",
        "tests/unit/test_packaging.py",
        "fw_spec/staging.pml",
        "fw_spec/specdata.py",
        "tools/bench/_benchlib.py",
        "tools/bench/refill_bw.py",
        "emulator/cli.py",
        "chm/daemon/server.py",
        "chm/testing/daemon_proc.py",
        ".ci/run",
    ],
)
def test_sdist_has(sdist_members: dict[str, tarfile.TarInfo], path: str) -> None:
    assert path in sdist_members, f"{path} is missing from the sdist"


def test_sdist_has_every_tracked_test_and_spec_file(
    sdist_members: dict[str, tarfile.TarInfo],
) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "tests", "fw_spec", "tools", "csrc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if tracked.returncode:
        pytest.skip(f"not a git checkout: {tracked.stderr.strip()}")
    missing = [p for p in tracked.stdout.split() if p not in sdist_members]
    assert not missing, f"tracked files missing from the sdist: {missing}"


def test_sdist_has_no_build_products(sdist_members: dict[str, tarfile.TarInfo]) -> None:
    bad = [
        p
        for p in sdist_members
        if p.endswith((".so", ".o", ".a", ".img", ".pyc")) or "__pycache__" in p
    ]
    assert not bad, f"build products in the sdist: {bad}"


def test_license_metadata() -> None:
    meta = importlib.metadata.metadata("chm")
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in (meta.get_all("License-File") or [])
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_emulator_installed_as_chm_emu(tmp_path: Path) -> None:
    # From a directory that is not the checkout, only installed names import.
    code = (
        "import importlib.util as u, pathlib; "
        "s = u.find_spec('chm_emu'); "
        "print(pathlib.Path(s.origin).parent.name, u.find_spec('emulator') is None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["emulator", "True"]
    scripts = importlib.metadata.entry_points(group="console_scripts")
    assert [e.value for e in scripts if e.name == "chm-emu"] == ["chm_emu.cli:main"]
