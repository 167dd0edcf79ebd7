"""A file-backed tier must fit its filesystem (chm.kv.capacity), on the real
filesystem of the test directory (statvfs, st_blocks)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from chm.errors import InvalidArgument, NoSpace
from chm.kv.capacity import check_fits, free_bytes


def test_larger_than_the_free_space_is_refused_naming_both(tmp_path: Path) -> None:
    free = free_bytes(tmp_path)
    cap = free + (1 << 40)
    with pytest.raises(NoSpace) as ei:
        check_fits(tmp_path / "kv.img", cap, option="chm.sparse_overcommit")
    e = ei.value
    assert e.errno == errno.ENOSPC
    msg = str(e.strerror)
    assert f"({cap} bytes)" in msg
    assert "bytes) free" in msg and "chm.sparse_overcommit" in msg
    assert e.filename == os.fspath(tmp_path / "kv.img")
    assert not (tmp_path / "kv.img").exists()


def test_sparse_overcommit_allows_it(tmp_path: Path) -> None:
    free = free_bytes(tmp_path)
    assert check_fits(tmp_path / "kv.img", free + (1 << 40), sparse_overcommit=True) > free


def test_what_fits_passes_and_a_file_counts_its_own_blocks(tmp_path: Path) -> None:
    assert check_fits(tmp_path / "new" / "kv.img", "1M") == 1 << 20
    f = tmp_path / "kv.img"
    f.write_bytes(os.urandom(1 << 20))  # 1 MiB already allocated
    need = check_fits(f, 4 << 20)
    assert need == (4 << 20) - os.stat(f).st_blocks * 512
    assert need <= 3 << 20


def test_bad_capacity(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        check_fits(tmp_path / "kv.img", 0)
    with pytest.raises(InvalidArgument):
        check_fits(tmp_path / "kv.img", "lots")
