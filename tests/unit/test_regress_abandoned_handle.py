"""A Handle dropped without ``release()`` gave its slot back only at ``close()``.

Six dropped handles left 7 of 13 slots free. A handle is now released when
it is finalised, with a ResourceWarning (as an unclosed file is), but never
while a view of its slot is still alive.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable

import pytest

import chm

MakeDevice = Callable[..., chm.Device]
MiB = 1 << 20


def _resource_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_dropped_handles_give_their_slots_back(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    total = dev.stats().slots_total
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokens = []
        for i in range(6):
            h = dev.prefetch(i * MiB, 4096)
            if i % 2:
                h.wait(timeout=10)
            tokens.append(h.token)
            del h
        gc.collect()
    st = dev.stats()
    assert st.slots_free == total, f"{st.slots_free} of {total} slots free"
    assert st.prefetch_released == 6
    texts = _resource_warnings(caught)
    assert len(texts) == 6, texts
    for tok in tokens:
        assert any(f"{tok:#x}" in t for t in texts), (tok, texts)


def test_dropped_handle_keeps_its_slot_while_a_view_lives(
    make_device: MakeDevice, backend: str
) -> None:
    dev = make_device(backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arr = dev.prefetch(0, 8192).array()
        mv = dev.prefetch(MiB, 8192).wait(timeout=10)
        gc.collect()
        st = dev.stats()
        assert st.slots_held == 2, "a viewed slot was released under its view"
        assert st.prefetch_released == 0
        assert len(arr) == 8192 and len(bytes(mv)) == 8192
        del arr
        gc.collect()
        assert dev.stats().prefetch_released == 1
        del mv
        gc.collect()
    st = dev.stats()
    assert st.prefetch_released == 2 and st.slots_held == 0
    assert len(_resource_warnings(caught)) == 2


def test_handle_dropped_in_another_thread(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    box = [dev.prefetch(0, 4096)]
    box[0].wait(timeout=10)

    def drop() -> None:
        box.clear()
        gc.collect()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        t = threading.Thread(target=drop)
        t.start()
        t.join()
    assert dev.stats().prefetch_released == 1


def test_released_or_closed_handles_do_not_warn(make_device: MakeDevice, backend: str) -> None:
    dev = make_device(backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = dev.prefetch(0, 4096)
        h.release()
        del h
        h2 = dev.prefetch(0, 4096)
        dev.close()
        del h2
        gc.collect()
    assert _resource_warnings(caught) == []


def _run(body: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import gc, sys, threading, warnings, chm\n"
        "dev = chm.Device.open(backend='pread', capacity='64M', dram='16M', wbuf='4M',"
        " slot_size='1M')\n" + textwrap.dedent(body)
    )
    return subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_finaliser_under_the_device_lock_does_not_deadlock() -> None:
    # gc can run a finaliser in any thread at any allocation, also in one
    # that holds the device's lock (e.g. inside wait() or close()).
    r = _run(
        """
        h = dev.prefetch(0, 4096)
        h.wait()
        cycle = [h]
        cycle.append(cycle)
        del h, cycle
        with dev._lock:
            gc.collect()
        print("free", dev.stats().slots_free == dev.stats().slots_total)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "free True" in r.stdout, (r.stdout, r.stderr[-2000:])


@pytest.mark.parametrize("close", [True, False])
def test_abandoned_handles_at_interpreter_exit(close: bool) -> None:
    r = _run(
        f"""
        held = [dev.prefetch(i << 20, 4096) for i in range(4)]
        held[0].wait()
        view = held[1].wait()
        arr = held[2].array()
        if {close}:
            del view, arr
            dev.close()
        print("exiting")
        """
    )
    assert r.returncode == 0 and "exiting" in r.stdout, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
