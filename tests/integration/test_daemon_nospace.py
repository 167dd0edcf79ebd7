"""The daemon's journal on a full filesystem: the flush that cannot be
journaled is answered to its client (NoSpace naming the journal file), that
client's connection and every other client stay served, blocks already
acknowledged stay readable, the next flush after space is freed succeeds,
and a restart finds every acknowledged block byte-exact.

The full filesystem is a real tmpfs of 128 KiB mounted for the test (root
only; skipped otherwise)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.errors import NoSpace
from chm.testing.daemon_proc import DaemonProcess


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _block(i: int) -> np.ndarray[Any, Any]:
    return np.full(4096, i % 251, np.uint8)


def test_full_journal_filesystem(small_fs: Path, tmp_path: Path) -> None:
    journal = small_fs / "kv.journal"
    args = ["--target", str(tmp_path / "t0.img"), "--create", "--capacity", "128M",
            "--dram", "40M", "--slot-size", "1M", "--backend", "pread",
            "--journal", str(journal)]  # fmt: skip
    sock = tmp_path / "chm.sock"
    acked: list[int] = []
    with DaemonProcess(args, sock) as d, chm.connect(d.socket) as c, chm.connect(d.socket) as o:
        kv = c.kv()
        filler = small_fs / "filler"
        i = 0
        with pytest.raises(NoSpace) as ei:
            while i < 4000:
                ks = [f"k{j}".encode() for j in range(i, i + 8)]
                kv.put(ks, [_block(j) for j in range(i, i + 8)], meta=[b"m" * 100] * 8)
                kv.flush()
                acked += range(i, i + 8)
                i += 8
                if i == 40:  # take what is left of the filesystem
                    with open(filler, "wb") as f, contextlib.suppress(OSError):
                        f.write(bytes(256 << 10))
        assert str(journal) in str(ei.value) and "no space" in str(ei.value)
        assert acked, "nothing was acknowledged before the filesystem filled"
        # the client that got the error, and the other one, are served on
        assert o.daemon_stats()["held"]["clients"] == 2
        out = [np.zeros(4096, np.uint8) for _ in acked]
        assert kv.get([f"k{j}".encode() for j in acked], out) == [True] * len(acked)
        assert all(np.array_equal(out[n], _block(j)) for n, j in enumerate(acked))
        filler.unlink()
        kv.put([b"after"], [_block(7)])
        kv.flush()  # space again: journaled
        acked.append(-1)
        assert not [e for e in d.events() if e.get("event") == "disconnect"]
    with DaemonProcess(args, sock) as d, chm.connect(d.socket) as c:
        kv = c.kv()
        names = [f"k{j}".encode() if j >= 0 else b"after" for j in acked]
        out = [np.zeros(4096, np.uint8) for _ in acked]
        assert kv.get(names, out) == [True] * len(acked)
        for n, j in enumerate(acked):
            assert np.array_equal(out[n], _block(j if j >= 0 else 7)), j
