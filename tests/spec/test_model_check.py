"""Model checking of fw_spec/staging.pml with spin.

The real model must verify clean in every run (safety and progress); every
deliberately broken variant in fw_spec/broken/ must be caught as it declares
(@expect run=... id=...), with a trail that `spin -t` replays. The model's
tables, values and invariant names must match the yaml spec.

Trails are printed: on failure always, on success with -v (or -rP).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
from pathlib import Path

import check_model
import pytest
import specdata

ROOT = Path(__file__).resolve().parents[2]
FW = ROOT / "fw_spec"
MODEL = FW / "staging.pml"
BROKEN = sorted((FW / "broken").glob("*.pml"))


SPEC = specdata.load()

MISSING = check_model.tools_missing()
needs_spin = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

EXPECTED = [(p, run, want) for p in BROKEN for run, want in check_model.expectations(p)]

# The default tier runs spin on the write-buffer model only (a few thousand
# states): it verifies, and a variant broken in it is caught. Every other run
# (millions of states, minutes each) is the slow tier (`make test-all`).
FAST_RUN = "wbuf"
FAST_BROKEN = next((e for e in EXPECTED if e[1] == FAST_RUN and e[2] != "end-state"), None)


def _selected(request: pytest.FixtureRequest, test: str) -> list[dict[str, object]]:
    """The parameters of the tests named ``test`` that this session runs."""
    return [
        item.callspec.params
        for item in request.session.items
        if getattr(item, "originalname", None) == test and hasattr(item, "callspec")
    ]


def _show(
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    res: check_model.Result,
) -> None:
    # captured, so shown when the test fails (or with -rP): everything
    print(check_model.format_report(res, full=True))
    if request.config.option.verbose > 0:
        with capsys.disabled():
            print("\n" + check_model.format_report(res))


@pytest.fixture(scope="module")
def real_results(request: pytest.FixtureRequest) -> dict[str, check_model.Result]:
    names = sorted({str(p["run"]) for p in _selected(request, "test_model_verifies")})
    runs = [check_model.RUNS[n] for n in names]
    return {r.run.name: r for r in check_model.check_many(MODEL, runs)}


@pytest.fixture(scope="module")
def broken_results(request: pytest.FixtureRequest) -> dict[tuple[Path, str], check_model.Result]:
    params = _selected(request, "test_broken_variant_is_caught")
    tasks = sorted({(Path(str(p["model"])), str(p["run"])) for p in params})
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as ex:
        futs = {t: ex.submit(check_model.check, t[0], check_model.RUNS[t[1]]) for t in tasks}
        return {t: f.result() for t, f in futs.items()}


@needs_spin
@pytest.mark.parametrize(
    "run",
    [
        pytest.param(r, marks=[] if r == FAST_RUN else [pytest.mark.slow])
        for r in sorted(check_model.RUNS)
    ],
)
def test_model_verifies(
    real_results: dict[str, check_model.Result],
    run: str,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    res = real_results[run]
    _show(request, capsys, res)
    assert not res.problem, res.problem
    assert res.errors == 0, f"{run}: spin found {res.kinds} ({res.failed_ids})"
    # a model whose processes never start would verify trivially
    assert res.states_stored > 1000, f"{run}: only {res.states_stored} states"


@needs_spin
@pytest.mark.parametrize(
    "model,run,want",
    [pytest.param(*e, marks=[] if e == FAST_BROKEN else [pytest.mark.slow]) for e in EXPECTED],
    ids=[f"{p.stem}-{r}-{w}" for p, r, w in EXPECTED],
)
def test_broken_variant_is_caught(
    broken_results: dict[tuple[Path, str], check_model.Result],
    model: Path,
    run: str,
    want: str,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    res = broken_results[(model, run)]
    _show(request, capsys, res)
    assert res.errors > 0, f"{model.name} passed {run}: the check cannot fail"
    assert want in res.failed_ids, f"caught as {res.failed_ids}, expected {want}"
    assert res.trail, "no trail was replayed"
    ltl = check_model.RUNS[run].ltl
    if want == "end-state":
        assert "invalid end state" in res.pan_output
    elif ltl:
        assert "START OF CYCLE" in res.trail and ltl in res.trail
    else:
        assert f"text of failed assertion: assert(({want}&&" in res.trail


def test_every_broken_variant_declares_what_catches_it() -> None:
    assert len(BROKEN) >= 1
    for p in BROKEN:
        exp = check_model.expectations(p)
        assert exp, f"{p.name} has no @expect line"
        for run, _ in exp:
            assert run in check_model.RUNS, f"{p.name}: unknown run {run}"
        inc = re.search(r'#define BUG_\w+\s*\n#include "\.\./(\w+\.pml)"', p.read_text())
        assert inc, f"{p.name} does not include a model"
        for run, _ in exp:
            assert check_model.RUNS[run].model == inc.group(1), (
                f"{p.name}: {run} checks another model"
            )


def _included(p: Path) -> Path:
    m = re.search(r'#include "\.\./(\w+\.pml)"', p.read_text())
    assert m, f"{p.name} includes no model"
    return FW / m.group(1)


def test_bugs_exist_in_model() -> None:
    for p in BROKEN:
        m = re.search(r"#define (BUG_\w+)", p.read_text())
        assert m, f"{p.name} defines no BUG_ macro"
        bug = m.group(1)
        model = _included(p)
        assert re.search(rf"#ifn?def {bug}\b", model.read_text()), f"{model.name} has no {bug}"


# ---- the model against the yaml (no spin needed) ----

PML = MODEL.read_text()
RES_PML = (FW / "resident.pml").read_text()


def _pml_table(macro: str, prefix: str, pml: str = PML) -> list[tuple[str, str, str]]:
    m = re.search(rf"#define {macro}\(f, t\) \((.*?)\n\n", pml, re.S)
    assert m, f"staging.pml has no {macro}(f, t)"
    body = m.group(1)
    rows = re.findall(
        rf"\(f == {prefix}(\w+) && t == {prefix}(\w+)\)\)?\s*(?:\|\|)?\s*"
        r"/\* (\w+) \*/",
        body,
    )
    return sorted(rows)


@pytest.mark.parametrize(
    "macro,prefix,machine",
    [
        ("SLOT_LEGAL", "SLOT_", "slot"),
        ("WB_LEGAL", "WB_", "entry"),
    ],
)
def test_model_table_matches_spec(macro: str, prefix: str, machine: str) -> None:
    rows = _pml_table(macro, prefix)
    assert rows == specdata.transitions(specdata.machines(SPEC)[machine])


def test_resident_model_matches_spec() -> None:
    m = specdata.machines(SPEC)["resident"]
    assert _pml_table("RES_LEGAL", "RES_", RES_PML) == specdata.transitions(m)
    d = {k: int(v) for k, v in re.findall(r"^#define RES_(\w+)\s+(\d+)\b", RES_PML, re.M)}
    assert d == {s["name"]: s["value"] for s in m["states"]}
    assert check_model.RUNS["resident"].model == "resident.pml"


def _pml_defines() -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^#define (\w+)\s+(\d+)\b", PML, re.M)}


@pytest.mark.parametrize(
    "prefix,machine",
    [
        ("SLOT_", "slot"),
        ("R_", "request"),
        ("WB_", "entry"),
    ],
)
def test_model_state_values_match_spec(prefix: str, machine: str) -> None:
    d = _pml_defines()
    model = {
        k[len(prefix) :]: v
        for k, v in d.items()
        if k.startswith(prefix) and k[len(prefix) :] not in ("LEGAL", "HIGH")
    }
    spec = {s["name"]: s["value"] for s in specdata.machines(SPEC)[machine]["states"]}
    assert model == spec


def test_model_error_values_match_spec() -> None:
    d = _pml_defines()
    for e in SPEC["commands"]["errors"]:
        if e["name"] in d:
            assert d[e["name"]] == e["value"], e["name"]
    used = set(re.findall(r"ret = (E[A-Z]+)", PML))
    assert used <= {e["name"] for e in SPEC["commands"]["errors"]}
    assert used <= set(d)
    assert d["SKIPPED"] == SPEC["commands"]["constants"]["CHM_WRITE_SKIPPED"]["value"]


def test_model_names_its_invariants() -> None:
    """Every invariant marked `model` is asserted (CHECK(id, ...)) or is an ltl
    property (ltl id_...) of staging.pml or resident.pml, and the models check
    no other."""
    both = PML + RES_PML
    hidden = set(re.findall(r"^hidden byte ([SWLR]\d+) = 1;", both, re.M))
    checked = set(re.findall(r"CHECK\(([SWLR]\d+),", both))
    ltl = {n.split("_")[0] for n in re.findall(r"^ltl (\w+)", PML, re.M)}
    assert hidden == checked, "declared and used invariant ids differ"
    want = {i["id"] for i in specdata.invariants(SPEC) if "model" in i["checked_by"]}
    assert checked | ltl == want
    assert {r.ltl.split("_")[0] for r in check_model.RUNS.values() if r.ltl} == ltl


def test_model_size() -> None:
    """At least 2 requesters and 3 slots in the staging and progress runs."""
    d = {k: int(v) for k, v in re.findall(r"#define (NSLOTS|NUSERS|QCAP)\s+(\d+)", PML)}
    assert d["NSLOTS"] >= 3 and d["NUSERS"] >= 2 and d["QCAP"] >= 1
    for name in ("staging", "staging_close", "staging_S11", "staging_S12"):
        assert not any(
            x.startswith(("-DNUSERS", "-DNSLOTS", "-DSTAGING"))
            for x in check_model.RUNS[name].defines
        ), name
