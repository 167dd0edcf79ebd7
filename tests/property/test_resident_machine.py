"""The resident-region state machine (chm.testing.resident) on the backends
that move data: a prefetch the model calls resident must be a hit with no SSD
read and the newest bytes, and the entry count must match the model's."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from chm.testing.resident import resident_machine


@pytest.mark.parametrize("backend", ["pread"])
def test_resident_machine(backend: str) -> None:
    base = settings()
    kw: dict[str, object] = {
        "deadline": None,
        "suppress_health_check": [HealthCheck.too_slow],
        "stateful_step_count": 40,
    }
    if settings.get_current_profile_name() in ("default", "ci"):
        kw["max_examples"] = min(base.max_examples, 40)
    run_state_machine_as_test(resident_machine(backend), settings=settings(base, **kw))  # type: ignore[arg-type]
