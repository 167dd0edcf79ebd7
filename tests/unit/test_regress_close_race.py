"""Device.close() racing calls in other threads.

The races are widened with a delay at the exact point where the real code can
be descheduled (the GIL is re-taken after a C call, or between reading
``dev._ptr`` and calling C), so the outcome is deterministic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

_OPEN = (
    "import threading, time, chm\n"
    "dev = chm.Device.open(backend='pread', capacity='64M', dram='16M', wbuf='4M',"
    " slot_size='1M')\n"
)


def _code(body: str) -> str:
    return _OPEN + textwrap.dedent(body)


def test_wait_that_returns_while_close_runs_gives_no_view_over_freed_pool() -> None:
    # Handle.wait(): C wait succeeds, then the thread waits for the GIL while
    # another thread's close() (which only ends views already in dev._views)
    # frees the pool; the waiter then registers and returns a view of it.
    code = _code(
        """
        import chm.handle as d
        h = dev.prefetch(0, 1 << 20)
        real = d._wait_buffer
        returned = threading.Event()
        def late(*a):
            buf = real(*a)
            returned.set()
            time.sleep(0.3)
            return buf
        d._wait_buffer = late
        out = []
        def waiter():
            try:
                out.append(h.wait(5.0))
            except chm.ChmError as exc:
                out.append(exc)
        t = threading.Thread(target=waiter)
        t.start()
        returned.wait()
        try:
            dev.close()
        except chm.ChmError:
            pass
        t.join()
        v = out[0]
        if isinstance(v, memoryview):
            try:
                bytes(v[:16])
            except ValueError:
                pass
        print("survived")
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stderr[-2000:])


@pytest.mark.slow  # valgrind: the slow tier
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_call_in_flight_when_close_frees_device_is_not_use_after_free() -> None:
    # Device.read(): `self._p()` hands the raw pointer to chm._lowlevel; if
    # close() runs before the C call starts, chm_read() gets a freed chm_dev
    # (the header forbids any call starting after close has begun).
    code = _code(
        """
        import chm._lowlevel as ll
        real = ll.read
        got = threading.Event()
        def late(ptr, *a):
            got.set()
            time.sleep(0.3)
            return real(ptr, *a)
        ll.read = late
        def reader():
            try:
                dev.read(0, 4096)
            except chm.ChmError:
                pass
        t = threading.Thread(target=reader)
        t.start()
        got.wait()
        dev.close()
        t.join()
        print("done")
        """
    )
    r = subprocess.run(
        ["valgrind", "--undef-value-errors=no", "-q", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONMALLOC": "malloc"},
    )
    assert "done" in r.stdout, r.stderr[-3000:]
    first = min(
        (i for i in (r.stderr.find("Invalid read"), r.stderr.find("Invalid write")) if i >= 0),
        default=-1,
    )
    assert first < 0, r.stderr[first : first + 1500]
