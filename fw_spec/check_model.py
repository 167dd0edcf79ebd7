#!/usr/bin/env python3
"""Model-check the chm device model (fw_spec/staging.pml, resident.pml) with spin.

Each *run* is one verification: spin -a with some -D settings, gcc on the
generated pan.c, then ./pan for safety (assertions and invalid end states)
or for one ltl property under weak fairness (acceptance cycles). A run that
finds an error has its trail replayed with `spin -t -p`; the invariant id of
a failed assertion (S1, W3, ...) or the name of the violated ltl property is
reported.

    python3 fw_spec/check_model.py                      # every run, each on its model
    python3 fw_spec/check_model.py -r staging -r wbuf_W8
    python3 fw_spec/check_model.py --expect fw_spec/broken/refill_while_held.pml
    python3 fw_spec/check_model.py --list

Exit status: 0 all runs clean (with --expect: every expected failure was
found), 1 a run found errors (with --expect: an expected failure was not
found), 2 the check itself could not be done (no spin or gcc, compile error,
search incomplete, out of memory).

Broken variants declare what must catch them with lines such as
``@expect run=staging id=S1`` in their header comment; ``id=end-state``
means an invalid end state (a process stuck forever).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = HERE / "staging.pml"


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    defines: tuple[str, ...]
    ltl: str | None  # None: safety run
    what: str
    model: str = "staging.pml"  # the real model of the run, in fw_spec/
    # gcc optimisation for this run's pan.c when none is asked for: -O0 for
    # a search of a few thousand states (pan ends in milliseconds, and -O1
    # spends 12 s of CPU compiling pan.c where -O0 spends 1.5 s)
    cc_opt: str = "-O1"


# Sizes: 3 slots, refill queue 1, 2 requesters with 2 handles each (one
# requester in the combined run), 2 write-buffer entries, 3 writes.
RUNS: dict[str, Run] = {
    r.name: r
    for r in (
        Run(
            "staging",
            ("-DWBUF=0", "-DCLOSER=0"),
            None,
            "staging safety: 2 requesters (NOQUEUE, repeated and stale calls), "
            "3 slots, queue 1, fills may fail",
        ),
        Run(
            "staging_close",
            ("-DWBUF=0", "-DFILL_ERRORS=0"),
            None,
            "staging safety with chm_dev_close at any moment",
        ),
        Run(
            "wbuf",
            ("-DSTAGING=0",),
            None,
            "write buffer safety: writer, flusher with failing batches, close",
            cc_opt="-O0",
        ),
        Run(
            "combined",
            ("-DNUSERS=1",),
            None,
            "everything at once: 1 requester, writer, engine, flusher, close",
        ),
        Run(
            "views",
            ("-DDATA=1", "-DREADER=1", "-DNUSERS=1", "-DCLOSER=0", "-DFILL_ERRORS=0"),
            None,
            "object bytes as versions, a pinned-hit reader: held views are snapshots (W11), "
            "views and reads hold every admitted write (W10), pins hold (S17), catch-ups copy "
            "unread (S18)",
        ),
        Run(
            "resident",
            (),
            None,
            "resident region (resident.pml): 2 requesters retaining or not, a writer, an "
            "evictor; hits are newest (R2), held views snapshots (R3), accounting (R4)",
            "resident.pml",
        ),
        Run(
            "staging_S11",
            ("-DWBUF=0", "-DCLOSER=0"),
            "S11_fill_progress",
            "progress: every issued prefetch ends READY or FAILED",
        ),
        Run(
            "staging_S12",
            ("-DWBUF=0", "-DCLOSER=0"),
            "S12_wait_returns",
            "progress: every blocked wait returns",
        ),
        Run(
            "wbuf_W8",
            ("-DSTAGING=0",),
            "W8_flush_returns",
            "progress: every flush barrier returns",
        ),
    )
}

PAN_DEPTH = "-m200000"
PAN_MEMLIM_MB = 6144
RUN_TIMEOUT_S = 600

# the invariant id of the assertion that failed, in pan's and in spin's words
_FAILED_ID = re.compile(
    r"(?:assertion violated \(|text of failed assertion: assert\(\()([SWLR][0-9]+)&&"
)
_EXPECT = re.compile(r"@expect\s+run=(\S+)\s+id=(\S+)")


@dataclasses.dataclass
class Result:
    run: Run
    model: Path
    errors: int = -1
    states_stored: int = -1
    depth: int = -1
    elapsed_s: float = 0.0
    kinds: list[str] = dataclasses.field(default_factory=list)
    failed_ids: list[str] = dataclasses.field(default_factory=list)
    pan_output: str = ""
    trail: str = ""  # the replay of the error trail, when errors > 0
    problem: str = ""  # why the check could not be completed

    @property
    def ok(self) -> bool:
        return not self.problem and self.errors == 0

    def summary(self) -> str:
        if self.problem:
            return f"{self.run.name}: NOT CHECKED: {self.problem}"
        s = (
            f"{self.run.name}: errors: {self.errors}, "
            f"{self.states_stored} states, stored, depth {self.depth}, "
            f"{self.elapsed_s:.1f} s"
        )
        if self.errors:
            s += f" [{', '.join(self.kinds)}; ids: {', '.join(self.failed_ids) or '-'}]"
        return s


def tools_missing() -> str | None:
    """Returns what is missing to run checks, or None."""
    for tool in ("spin", "gcc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {tool})"
    return None


def expectations(model: Path) -> list[tuple[str, str]]:
    """The (run, id) pairs a broken model declares with @expect lines."""
    return _EXPECT.findall(model.read_text())


def _stage(model: Path, workdir: Path) -> Path:
    """Copies the model and the .pml files it may include into workdir;
    returns the model's copy (spin is run in its directory)."""
    model = model.resolve()
    root = HERE if model.is_relative_to(HERE) else model.parent
    for src in root.rglob("*.pml"):
        dst = workdir / src.relative_to(root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    return workdir / model.relative_to(root)


def _sh(cmd: list[str], cwd: Path, timeout: float = RUN_TIMEOUT_S) -> tuple[int, str]:
    p = subprocess.run(
        cmd,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return p.returncode, p.stdout


def _int(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else -1


def _build(
    model: Path, defines: tuple[str, ...], safety: bool, cc_opt: str, workdir: Path
) -> tuple[Path, str]:
    """Stages model in workdir, runs spin -a and compiles pan. Returns the
    model's copy and "" on success, or the reason it failed."""
    copy = _stage(model, workdir)
    cwd = copy.parent
    rc, out = _sh(["spin", *defines, "-a", copy.name], cwd)
    if rc != 0 or not (cwd / "pan.c").exists():
        return copy, "spin -a failed:\n" + out
    cflags = [cc_opt, f"-DMEMLIM={PAN_MEMLIM_MB}"]
    if safety:
        cflags += ["-DSAFETY", "-DNOCLAIM"]
    rc, out = _sh(["gcc", *cflags, "-o", "pan", "pan.c"], cwd)
    if rc != 0:
        return copy, "gcc pan.c failed:\n" + out
    return copy, ""


def _verify(copy: Path, run: Run, res: Result) -> None:
    """Runs the built pan for run and fills res."""
    cwd, name = copy.parent, copy.name
    pan = ["./pan", PAN_DEPTH]
    if run.ltl is not None:
        pan += ["-a", "-f", "-N", run.ltl]
    t0 = time.monotonic()
    _, out = _sh(pan, cwd)
    res.elapsed_s += time.monotonic() - t0
    res.pan_output = out
    res.errors = _int(r"errors: (\d+)", out)
    res.states_stored = _int(r"(\d+) states, stored", out)
    res.depth = _int(r"depth reached (\d+)", out)
    if res.errors < 0:
        res.problem = "pan printed no result:\n" + out[-2000:]
        return
    if "out of memory" in out or "reached -DMEMLIM" in out:
        res.problem = "pan ran out of memory"
    elif res.errors == 0 and ("Search not completed" in out or "max search depth too small" in out):
        res.problem = "search incomplete (depth limit)"
    for kind in (
        "assertion violated",
        "invalid end state",
        "acceptance cycle",
        "non-progress cycle",
    ):
        if re.search(r"^pan:\d+: " + kind, out, re.M):
            res.kinds.append(kind)
    trail = copy.with_name(name + ".trail")
    if res.errors:
        res.failed_ids += _FAILED_ID.findall(out)
        if run.ltl and "acceptance cycle" in res.kinds:
            res.failed_ids.append(run.ltl.split("_")[0])
        if "invalid end state" in res.kinds:
            res.failed_ids.append("end-state")
        if trail.exists():
            _, res.trail = _sh(["spin", *run.defines, "-t", "-p", name], cwd)
            res.failed_ids += _FAILED_ID.findall(res.trail)
        res.failed_ids = sorted(set(res.failed_ids))
    trail.unlink(missing_ok=True)


def model_for(model: Path, run: Run) -> Path:
    """The model a run checks: its own (run.model) when asked for the
    default one, else the given one (a broken variant of it)."""
    if Path(model).resolve() == DEFAULT_MODEL.resolve():
        return HERE / run.model
    return Path(model)


def _check_group(model: Path, runs: list[Run], cc_opt: str | None) -> list[Result]:
    """Runs that share -D settings and mode share one build (cc_opt, or
    else the runs' own)."""
    model = model_for(model, runs[0])
    results = [Result(run=r, model=Path(model)) for r in runs]
    missing = tools_missing()
    if missing:
        for res in results:
            res.problem = missing
        return results
    with tempfile.TemporaryDirectory(prefix=f"chm-spin-{runs[0].name}-") as tmp:
        t0 = time.monotonic()
        opt = cc_opt or runs[0].cc_opt
        copy, problem = _build(Path(model), runs[0].defines, runs[0].ltl is None, opt, Path(tmp))
        build_s = time.monotonic() - t0
        for run, res in zip(runs, results, strict=True):
            res.elapsed_s = build_s
            if problem:
                res.problem = problem
            else:
                _verify(copy, run, res)
    return results


def check(model: Path, run: Run, cc_opt: str | None = None) -> Result:
    """Runs one verification of model (pan.c built with cc_opt, by default
    the run's own); never raises for a failed check."""
    return _check_group(model, [run], cc_opt)[0]


def check_many(
    model: Path, runs: list[Run], jobs: int | None = None, cc_opt: str | None = None
) -> list[Result]:
    """Runs several verifications, builds shared and in parallel; the
    results are in the order of runs."""
    groups: dict[tuple[tuple[str, ...], bool, str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.defines, r.ltl is None, r.model, r.cc_opt), []).append(r)
    jobs = jobs or min(len(groups), os.cpu_count() or 1)
    by_run: dict[str, Result] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        for results in ex.map(lambda g: _check_group(model, g, cc_opt), groups.values()):
            for res in results:
                by_run[res.run.name] = res
    return [by_run[r.name] for r in runs]


def format_report(res: Result, full: bool = False) -> str:
    """The result, pan's error lines and the replayed trail: its last steps
    and spin's verdict, or (full) all of it."""
    out = [res.summary()]
    if res.errors > 0 or full:
        out += [
            "    " + ln[:300]
            for ln in res.pan_output.splitlines()
            if ln.startswith("pan:") or "errors:" in ln
        ]
    if res.trail:
        lines = res.trail.splitlines()
        if full:
            shown, note = lines, ""
        else:
            # the last steps up to where the trail ends, then spin's verdict
            end = next(
                (i for i, ln in enumerate(lines) if ln.startswith("spin: trail ends")), len(lines)
            )
            steps = [ln for ln in lines[:end] if not ln.startswith("ltl ")]
            shown = steps[-40:] + lines[end : end + 1]
            note = ", last steps; -v for all"
        out.append(f"    --- spin -t -p replay ({len(lines)} lines{note}) ---")
        out += ["    " + ln[:300] for ln in shown]
    return "\n".join(out)


def _report(res: Result, verbose: bool) -> None:
    print(format_report(res, verbose))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=DEFAULT_MODEL)
    ap.add_argument(
        "-r", "--run", action="append", choices=sorted(RUNS), help="run only these (default: all)"
    )
    ap.add_argument(
        "--expect",
        action="store_true",
        help="the model is a broken variant: succeed iff every @expect line of it is caught",
    )
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument(
        "-O",
        dest="cc_opt",
        default=None,
        help="gcc optimisation for pan.c (default: the run's own, -O1, or -O0 for the "
        "small write-buffer run; pan.c is large, and -O2 compiles slower than these "
        "searches gain)",
    )
    ap.add_argument(
        "-v", "--verbose", action="store_true", help="print pan's summary and the whole replay"
    )
    ap.add_argument("--list", action="store_true", help="list the runs")
    args = ap.parse_args(argv)

    if args.list:
        for r in RUNS.values():
            mode = f"ltl {r.ltl}" if r.ltl else "safety"
            print(f"{r.name:14} {mode:22} {' '.join(r.defines):28} {r.what}")
        return 0
    missing = tools_missing()
    if missing:
        print(f"check_model: {missing}", file=sys.stderr)
        return 2
    if not args.model.exists():
        print(f"check_model: no such model {args.model}", file=sys.stderr)
        return 2

    if args.expect:
        exp = expectations(args.model)
        if not exp:
            print(f"check_model: {args.model} has no @expect lines", file=sys.stderr)
            return 2
        results = check_many(args.model, [RUNS[r] for r, _ in exp], args.jobs, args.cc_opt)
        status = 0
        for (run, want), res in zip(exp, results, strict=True):
            _report(res, args.verbose)
            if res.problem and res.errors <= 0:
                status = max(status, 2)
            elif want in res.failed_ids:
                print(f"    caught as expected: {want}")
            else:
                print(f"    NOT caught: expected {want} in run {run}")
                status = max(status, 1)
        return status

    runs = [RUNS[n] for n in args.run] if args.run else list(RUNS.values())
    status = 0
    for res in check_many(args.model, runs, args.jobs, args.cc_opt):
        _report(res, args.verbose)
        if res.problem:
            status = max(status, 2)
        elif res.errors:
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
