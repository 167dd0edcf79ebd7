"""`make test` runs pytest on several pytest-xdist workers: tests marked
``xdist_group("name")`` must still run on one worker (the vLLM tests, the
sdist build), the others spread over all of them, and a failing test still
fails the run. A real pytest-xdist run of generated test files, with the
grouping hook of tests/conftest.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="pytest-xdist (the test extras) runs make test's workers")

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = f"""
import importlib.util

_path = {str(ROOT / "tests" / "conftest.py")!r}
_spec = importlib.util.spec_from_file_location("chm_tests_conftest", _path)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
pytest_collection_modifyitems = _mod.pytest_collection_modifyitems
"""

PROBES = """
import os
from pathlib import Path

import pytest

OUT = Path(os.environ["PROBE_OUT"])


def _note(kind, i):
    (OUT / f"{kind}-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    _note("grouped", i)


@pytest.mark.parametrize("i", range(6))
def test_free(i):
    _note("free", i)
"""


def _run(tmp_path: Path, extra: str = "") -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_probes.py").write_text(PROBES + extra)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3",
         "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "PROBE_OUT": str(out)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return proc, out


def _workers(out: Path, kind: str) -> set[str]:
    return {p.read_text() for p in out.glob(f"{kind}-*")}


def test_grouped_tests_share_one_worker_the_rest_spread_and_a_failure_fails(
    tmp_path: Path,
) -> None:
    """One real run (three workers start, so one run, not one per property)."""
    proc, out = _run(tmp_path, "\n\ndef test_fails():\n    assert False, 'the failing probe'\n")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"1 failed, 12 passed", proc.stdout), proc.stdout
    assert len(list(out.glob("grouped-*"))) == 6 and len(list(out.glob("free-*"))) == 6
    assert len(_workers(out, "grouped")) == 1, _workers(out, "grouped")
    # load scheduling hands each of the 3 workers tests at once: not one worker
    assert len(_workers(out, "free") | _workers(out, "grouped")) > 1


def test_make_runs_pytest_with_the_groups() -> None:
    """The fast tier on workers, with the groups, and the serving engines'
    files in one process of their own beside them (only it imports torch and
    the engines); the slow tier in one process."""

    def run_lines(target: str) -> list[str]:
        dry = subprocess.run(
            ["make", "-n", "--no-print-directory", target],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        return [x for x in dry.splitlines() if " -m pytest " in x]

    workers, engines = sorted(run_lines("pytest"), key=lambda x: " -n " not in x)
    assert re.search(r" -n [1-9]\d* ", workers) and "--dist loadgroup" in workers, workers
    assert " -n " not in engines and '-m "not slow"' in engines, engines
    files = {
        str(p.relative_to(ROOT))
        for e in ("lmcache", "sglang", "vllm")
        for p in (ROOT / "tests" / "integration").glob(f"test_integration_{e}*.py")
    }
    assert files and files == set(re.findall(r"(tests/\S+\.py)", engines))
    assert files == set(re.findall(r"--ignore=(\S+\.py)", workers))
    (slow,) = run_lines("pytest-slow")
    assert " -n " not in slow and " tests " in slow
