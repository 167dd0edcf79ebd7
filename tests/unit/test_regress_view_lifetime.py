"""Views into device DRAM must never outlive the pool they point into.

Each risky sequence runs in a child interpreter: the defect is a segfault.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Callable

import chm

MakeDevice = Callable[..., chm.Device]

_OPEN = (
    "import chm\n"
    "dev = chm.Device.open(backend='pread', capacity='64M', dram='16M', wbuf='4M',"
    " slot_size='1M')\n"
)


def _run(body: str) -> subprocess.CompletedProcess[str]:
    code = _OPEN + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_gc_of_device_with_numpy_view_alive_does_not_crash() -> None:
    # dev._views -> Handle -> dev is a cycle; the numpy array keeps neither alive,
    # so gc runs the ffi.gc net (chm_dev_close, pool unmapped) under the array.
    r = _run(
        """
        import gc
        h = dev.prefetch(0, 1 << 20)
        arr = h.array()
        del h, dev
        gc.collect()
        print(int(arr[:16].sum()))
        print("survived")
        """
    )
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_adopted_duplicate_handle_view_is_ended_by_close() -> None:
    # Two Handle objects for one token: the second wait() overwrites the first
    # in dev._views, so close() never ends the first handle's view.
    r = _run(
        """
        h1 = dev.prefetch(0, 1 << 20)
        v1 = h1.wait()
        v2 = dev.adopt(h1.token).wait()
        del v2
        dev.close()
        try:
            bytes(v1[:8])
        except ValueError:
            print("view ended")
        print("survived")
        """
    )
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_release_of_adopted_duplicate_raises_chm_error_not_keyerror(
    make_device: MakeDevice,
) -> None:
    dev = make_device()
    h1 = dev.prefetch(0, 1 << 20)
    h1.wait().release()
    h2 = dev.adopt(h1.token)
    h2.wait().release()
    h2.release()
    # StaleHandle (released through another route) is fine; KeyError is not.
    with contextlib.suppress(chm.ChmError):
        h1.release()


def test_concurrent_waits_on_one_handle_leave_no_untracked_view() -> None:
    # Both threads pass `_buf is None` and block in C; each then installs its
    # own buffer. release() only checks the last one, so it frees the slot
    # under the other thread's view; after close() that view reads unmapped memory.
    r = _run(
        """
        import threading
        from chm.errors import ViewInUse
        dev.inject_fault("slow", 1, 300_000_000)
        h = dev.prefetch(0, 1 << 20)
        views = []
        ts = [threading.Thread(target=lambda: views.append(h.wait(5.0))) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        try:
            h.release()
        except ViewInUse:
            print("release refused")
        else:
            dev.close()
            for v in views:
                try:
                    bytes(v[:4])
                except ValueError:
                    pass
        print("survived")
        """
    )
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stderr[-2000:])
