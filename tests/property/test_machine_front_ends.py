"""The device state machine uses the public device API only, so it runs
unchanged against any front end with chm.Device's API (the daemon client's
run is tests/integration/test_daemon_machine.py): here, one that exposes
nothing but chm.Device's public names. Its source imports no binding,
reaches into no private attribute and branches on no mode (what differs
between modes is in chm.testing.model's mode classes)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

import chm.testing.stateful as stateful
from chm.testing.model import MODE_MODELS, Geometry, KiB
from chm.testing.stateful import device_machine, open_embedded

SOURCE = Path(stateful.__file__).read_text(encoding="utf-8")
_MODE = re.compile(r"\bself\.mode\b")


class PublicOnly:
    """A device front end that forwards chm.Device's public names only: a
    private name used through it raises AttributeError."""

    def __init__(self, dev: Any) -> None:
        self.__dev = dev

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"the machine used the private name {name!r} of the device")
        return getattr(self.__dev, name)

    def __repr__(self) -> str:
        return f"PublicOnly({self.__dev!r})"


def public_only(targets: list[str], backend: str, mode: str, options: dict[str, Any]) -> Any:
    return PublicOnly(open_embedded(targets, backend, mode, options))


def test_public_only_refuses_private_names() -> None:
    with chm_device() as dev:
        front = PublicOnly(dev)
        assert front.capacity == dev.capacity
        with pytest.raises(AttributeError, match="_p"):
            front._p("x")


def chm_device() -> Any:
    import chm

    return chm.Device.open(capacity="1M", backend="ghost", dram="512K", wbuf="64K", slot_size="4K")


@pytest.mark.parametrize("mode", sorted(MODE_MODELS))
def test_machine_through_the_public_api_only(mode: str, tmp_backing: object) -> None:
    geom = Geometry(slots=2, refill_queue=1, wbuf=16 * KiB, max_write=24 * KiB)
    machine = device_machine(
        "pread", mode, geom, tmp_parent=str(tmp_backing), device_factory=public_only
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=10,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def test_machine_imports_no_binding_and_reaches_into_nothing_private() -> None:
    tree = ast.parse(SOURCE)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = {node.module or ""} | {a.name for a in node.names}
            assert not names & {"chm._lowlevel", "chm._ffi", "_lowlevel", "_ffi"}, names
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            # self.d.<x> / self.dev.<x>: the device's public names only
            base = node.value
            mine = isinstance(base.value, ast.Name) and base.value.id == "self"
            if mine and base.attr in ("d", "dev"):
                assert not node.attr.startswith("_"), f"self.{base.attr}.{node.attr}"


def test_machine_has_no_mode_branches() -> None:
    branches = [
        ast.unparse(node)
        for node in ast.walk(ast.parse(SOURCE))
        if isinstance(node, ast.Compare)
        and any(_MODE.search(ast.unparse(x)) for x in [node.left, *node.comparators])
    ]
    assert branches == []
