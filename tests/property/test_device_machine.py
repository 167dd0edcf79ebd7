"""The model-based state machine (chm.testing.stateful) on every backend and mode.

uring and pread compare data (reads, held views, backing files after flush
and close); ghost moves no data, so there states and counters are compared.
prefetch mode exercises the staging window and the write buffer, lru mode
prefetch hints through the cache, direct mode reads/writes straight through
(and prefetch raising NotSupported).

Runtime: the ``default`` and ``ci`` profiles run EXAMPLES examples per
machine (the fast tier's file: about 50 s of CPU); the ``nightly`` profile
runs its own, much larger, counts. The slow tier (``make test-all``) runs
each backend x mode for LONG_EXAMPLES examples.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from chm.testing.model import Geometry, KiB
from chm.testing.stateful import device_machine

MODES = ("prefetch", "lru", "direct")
EXAMPLES = 12
LONG_EXAMPLES = 100

# Two targets striped finely (every slot spans both), and a slot size that is
# not a multiple of 4 KiB: an unaligned object of slot_size bytes fills the
# slot's stride exactly.
STRIPED = Geometry(targets=2, stripe_unit=16 * KiB, slot_size=60000, hot=192 * KiB)
# One slot, a one-entry queue: every second prefetch queues or is rejected.
NARROW = Geometry(slots=1, refill_queue=1, wbuf=16 * KiB, max_write=24 * KiB)


def machine_settings() -> settings:
    """The active hypothesis profile, sized for a state machine that opens a
    device per example."""
    base = settings()
    kw: dict[str, object] = {
        "deadline": None,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
    }
    if settings.get_current_profile_name() in ("default", "ci"):
        kw["max_examples"] = min(base.max_examples, EXAMPLES)
    return settings(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_device_machine(backend: str, mode: str, tmp_backing: object) -> None:
    machine = device_machine(backend, mode, tmp_parent=str(tmp_backing))
    run_state_machine_as_test(machine, settings=machine_settings())


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_device_machine_long(backend: str, mode: str, tmp_backing: object) -> None:
    machine = device_machine(backend, mode, tmp_parent=str(tmp_backing))
    base = machine_settings()
    n = max(base.max_examples, LONG_EXAMPLES)
    run_state_machine_as_test(machine, settings=settings(base, max_examples=n))


@pytest.mark.parametrize("mode", ["prefetch", "lru"])
def test_device_machine_striped(data_backend: str, mode: str, tmp_backing: object) -> None:
    machine = device_machine(data_backend, mode, STRIPED, tmp_parent=str(tmp_backing))
    run_state_machine_as_test(machine, settings=machine_settings())


def test_device_machine_narrow_window(data_backend: str, tmp_backing: object) -> None:
    machine = device_machine(data_backend, "prefetch", NARROW, tmp_parent=str(tmp_backing))
    run_state_machine_as_test(machine, settings=machine_settings())


@pytest.mark.parametrize("mode", ["prefetch", "lru"])
def test_device_machine_ghost_virtual_clock(mode: str, tmp_backing: object) -> None:
    geom = Geometry(options=(("clock", "virtual"),))
    machine = device_machine("ghost", mode, geom, tmp_parent=str(tmp_backing))
    run_state_machine_as_test(machine, settings=machine_settings())
