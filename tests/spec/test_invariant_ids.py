"""The hypothesis state machines in chm/testing/ name the invariants they
check. Every invariant that fw_spec marks `checked_by: [..., property]` must
appear as an id (S1, W2, L4 ...) in chm/testing's Python code in one of
these places:

- the name of a function or method (an @invariant, a @rule, a helper):
  ``def inv_S4_slot_accounting(self)``;
- its docstring: ``"S4: slots_free + ... + slots_failed == slots_total"``;
- the message of a check, as a string that starts with the id and a colon
  (or is just the id): ``assert ok, f"S3: second release of {req}"``,
  ``raises(StaleHandle, "S9: wait on released handle")``.

Every id named there must exist in the spec.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import specdata

ROOT = Path(__file__).resolve().parents[2]
TESTING = ROOT / "chm" / "testing"


SPEC = specdata.load()
_NAME_ID = re.compile(r"^[SWLRswlr][1-9][0-9]*$")
# "S3: ...", "S4, W2: ...", or just "W1"
_MESSAGE_IDS = re.compile(r"^\s*([SWLR][1-9][0-9]*(?:\s*,\s*[SWLR][1-9][0-9]*)*)\s*(?::|$)")


def _message_ids(s: str) -> set[str]:
    m = _MESSAGE_IDS.match(s)
    return set(re.findall(r"[SWLR][1-9][0-9]*", m.group(1))) if m else set()


def named_ids(source: str) -> set[str]:
    """Invariant ids in function names, docstrings and check messages."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found |= {tok.upper() for tok in node.name.split("_") if _NAME_ID.match(tok)}
            found |= specdata.invariant_ids_in(ast.get_docstring(node) or "")
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found |= _message_ids(first.value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= _message_ids(node.value)
    return found


def ids_in_testing() -> tuple[set[str], list[Path]]:
    files = sorted(TESTING.rglob("*.py")) if TESTING.is_dir() else []
    found: set[str] = set()
    for f in files:
        found |= named_ids(f.read_text(encoding="utf-8"))
    return found, files


_PARSER_SAMPLE = '''
class M:
    def s4_slot_accounting(self):
        "Checks S4 and W6, not S40x or AS1."
    def inv_L1(self):
        pass
    def release_twice(self):
        """S3: the second release is -ESTALE."""
    def rule(self, x):
        assert x, f"S8: prefetch {x} got EAGAIN"
        assert x, "S2, W10: view differs"
        self.read(x, "W1")
        assert x, "see S9 and W7"
        assert x, f"{x}: S13 later"
'''


def test_name_parser() -> None:
    # ids in the middle of a message are not claims: S9, W7, S13 do not count
    assert named_ids(_PARSER_SAMPLE) == {"S4", "W6", "L1", "S3", "S8", "S2", "W10", "W1"}


def test_some_invariants_are_for_the_property_tests() -> None:
    ids = specdata.property_ids(SPEC)
    assert any(i.startswith("S") for i in ids)


def test_property_invariants_are_named_in_chm_testing() -> None:
    want = specdata.property_ids(SPEC)
    found, files = ids_in_testing()
    missing = sorted(set(want) - found, key=lambda i: (i[0], int(i[1:])))
    detail = "\n".join(f"  {i}: {want[i]}" for i in missing)
    assert not missing, (
        f"{len(missing)} invariant(s) marked `property` in fw_spec are not named by "
        f"the state machines in chm/testing/ ({len(files)} Python file(s)):\n{detail}"
    )


def test_chm_testing_names_only_spec_invariants() -> None:
    known = {i["id"] for i in specdata.invariants(SPEC)}
    found, _ = ids_in_testing()
    assert found <= known, f"unknown invariant ids in chm/testing/: {sorted(found - known)}"
