"""The default temporary target's directory, also after a SIGKILL.

A device opened without targets keeps its backing file in a fresh temporary
directory, removed by ``close()``. A SIGKILLed process left it behind for good
(a sparse file as large as the device); the next open now removes such
directories, and only those whose owning process is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import chm

_CHILD = textwrap.dedent(
    """
    import sys, time, chm
    dev = chm.Device.open(backend="pread", capacity="64M", dram="16M", wbuf="4M",
                          slot_size="1M")
    with dev.prefetch(0, 4096) as h:
        h.wait()
    print(dev.tmpdir, flush=True)
    time.sleep(120)
    """
)

SMALL = {"capacity": "64M", "dram": "16M", "wbuf": "4M", "slot_size": "1M"}


@pytest.fixture
def tmp_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    parent = tmp_path / "scratch"
    parent.mkdir()
    monkeypatch.setenv("CHM_TMPDIR", str(parent))
    return parent


def _start_child(parent: Path) -> tuple[subprocess.Popen[str], Path]:
    env = dict(os.environ, CHM_TMPDIR=str(parent))
    p = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line, "the child did not open its device"
    return p, Path(line)


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def test_close_removes_the_temporary_directory(tmp_parent: Path) -> None:
    dev = chm.Device.open(backend="pread", **SMALL)
    tmp = dev.tmpdir
    assert tmp is not None and Path(tmp).parent == tmp_parent
    assert any(Path(tmp).iterdir())
    dev.close()
    assert not Path(tmp).exists()
    assert list(tmp_parent.iterdir()) == []


def test_open_removes_directories_of_sigkilled_processes_only(
    tmp_parent: Path, tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    dead, dead_dir = _start_child(tmp_parent)
    children.append(dead)
    live, live_dir = _start_child(tmp_parent)
    children.append(live)
    dead.send_signal(signal.SIGKILL)
    assert dead.wait(timeout=30) == -signal.SIGKILL
    assert dead_dir.is_dir(), "SIGKILL ran no cleanup: the directory is left behind"

    # decoys named like a dead process's directory: never followed, never removed
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    link = tmp_parent / f"chm-{dead.pid}-link"
    link.symlink_to(outside, target_is_directory=True)
    foreign = tmp_parent / f"not-chm-{dead.pid}"
    foreign.mkdir()

    dev = chm.Device.open(backend="pread", **SMALL)
    try:
        assert not dead_dir.exists(), "the SIGKILLed process's directory was not removed"
        assert live_dir.is_dir() and any(live_dir.iterdir()), "a live process lost its directory"
        assert link.is_symlink() and (outside / "precious").read_text() == "keep me"
        assert foreign.is_dir()
        with dev.prefetch(0, 4096) as h:
            assert len(h.wait(timeout=10)) == 4096
    finally:
        dev.close()

    # the live child is unharmed: it still owns its directory until it ends
    assert live.poll() is None
    live.send_signal(signal.SIGKILL)
    live.wait(timeout=30)
    chm.Device.open(backend="pread", **SMALL).close()
    assert not live_dir.exists()
