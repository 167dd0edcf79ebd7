"""The two test tiers are wired as docs/testing.md says: `make test` lints C
too and leaves the slow tier to `make test-all`, CI runs both, and pytest's
"no tests collected" is not a failure. Read from `make -n` (nothing runs)."""

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


def _c_programs(out: str) -> set[str]:
    runs = [line for line in out.splitlines() if "run-c-tests.sh" in line]
    assert len(runs) == 1, out
    return set(re.findall(r"build/c/\w+/(test_\w+)", runs[0]))


def test_make_test_runs_every_check_of_the_fast_tier() -> None:
    out = _dry("test")
    for target in ("lint-py", "lint-c", "c-tests", "pytest"):
        assert re.search(rf"\$\(MAKE\).*\b{target}\b|make .*\b{target}\b", out), target
    assert '-m "not slow"' in _dry("pytest")
    assert "-m slow" in _dry("pytest-slow")


def test_slow_c_programs_run_in_test_all_only() -> None:
    sources = sorted((ROOT / "tests" / "c").glob("test_*.c"))
    slow = {p.stem for p in sources if SLOW_LINE in p.read_text().splitlines()}
    assert slow, f"no C test is marked {SLOW_LINE}"
    fast, slow_run = _c_programs(_dry("c-tests")), _c_programs(_dry("c-tests-slow"))
    assert fast.isdisjoint(slow), sorted(fast & slow)
    assert slow_run == slow
    assert fast | slow_run == {p.stem for p in sources}


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
