"""The two test tiers are wired as docs/testing.md says: `make test` lints C
too and leaves the slow tier (with the C tests' TSan builds) to `make
test-all`, CI runs both, and pytest's "no tests collected" is not a failure.
Read from `make -n` (nothing runs)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOW_LINE = "/* tier: slow */"


def _dry(*targets: str, **vars_: str) -> str:
    args = ["make", "-n", "--no-print-directory", *targets, *(f"{k}={v}" for k, v in vars_.items())]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _c_runs(out: str) -> set[tuple[str, str]]:
    """The (build, program) pairs a target's run-c-tests.sh line runs."""
    runs = [line for line in out.splitlines() if "run-c-tests.sh" in line]
    assert len(runs) == 1, out
    return set(re.findall(r"build/c/(\w+)/(test_\w+)", runs[0]))


def test_make_test_runs_every_check_of_the_fast_tier() -> None:
    out = _dry("test")
    for target in ("ext", "lint-py", "lint-c", "c-tests", "pytest-engines", "pytest-workers"):
        assert re.search(rf"\$\(MAKE\).*\b{target}\b|make .*\b{target}\b", out), target
    assert '-m "not slow"' in _dry("pytest")
    assert "-m slow" in _dry("pytest-slow")


def test_slow_c_programs_and_tsan_builds_run_in_test_all_only() -> None:
    sources = sorted((ROOT / "tests" / "c").glob("test_*.c"))
    slow = {p.stem for p in sources if SLOW_LINE in p.read_text().splitlines()}
    assert slow, f"no C test is marked {SLOW_LINE}"
    every = {p.stem for p in sources}
    fast_runs, slow_runs = _c_runs(_dry("c-tests")), _c_runs(_dry("c-tests-slow"))
    fast = {prog for _, prog in fast_runs}
    assert fast.isdisjoint(slow), sorted(fast & slow)
    # make test: the plain and ASan/UBSan builds of every fast program
    assert fast_runs == {(b, p) for b in ("plain", "san") for p in every - slow}
    # make test-all: the TSan builds of those, and every build of the slow ones
    assert slow_runs == {("tsan", p) for p in every - slow} | {
        (b, p) for b in ("plain", "san", "tsan") for p in slow
    }


def test_ci_runs_both_tiers() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\b(?!-)", ci, re.M) and re.search(r"^make test-all\b", ci, re.M)


@pytest.mark.parametrize("target", ["pytest", "pytest-slow"])
def test_no_tests_collected_is_not_a_failure(target: str) -> None:
    """pytest exits 5 when a tier selects nothing; the target reports it and succeeds."""
    proc = subprocess.run(
        ["make", "--no-print-directory", target, "PYTEST=sh -c 'exit 5' --"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pytest: no tests collected" in proc.stdout
    failing = subprocess.run(
        ["make", "--no-print-directory", target, "PYTEST=sh -c 'exit 1' --"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert failing.returncode != 0
