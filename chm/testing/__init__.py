"""Test support shipped with chm: a model of the device and a hypothesis
state machine that checks a device against it.

    from chm.testing import device_machine
    TestPread = device_machine("pread", "prefetch").TestCase

:mod:`chm.testing.model` needs only numpy; :mod:`chm.testing.stateful`
needs hypothesis (the ``test`` extra) and is imported on first use.
"""

from __future__ import annotations

from typing import Any

from chm.testing.model import Geometry, StagingModel, initial_image, read_backing

__all__ = [
    "DeviceMachine",
    "Geometry",
    "StagingModel",
    "device_machine",
    "initial_image",
    "read_backing",
]


def __getattr__(name: str) -> Any:
    if name in ("DeviceMachine", "device_machine"):
        from chm.testing import stateful

        return getattr(stateful, name)
    raise AttributeError(f"module 'chm.testing' has no attribute {name!r}")
