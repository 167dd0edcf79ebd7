"""Does a file-backed tier fit its filesystem?

A device on a regular file creates it sparse: ``capacity: 1T`` on a disk with
69 GB free opens fine and fails (ENOSPC, blocks lost) only once the tier has
filled the disk. :func:`check_fits` refuses that up front::

    check_fits("/var/lib/chm/kv/kv.img", "1T")            # NoSpace naming both sizes
    check_fits("/var/lib/chm/kv/kv.img", "1T", sparse_overcommit=True)   # allowed

The space a file still needs is its capacity minus what it already occupies
(a reopened tier's blocks are counted as its own); that must not exceed the
free space of the filesystem (``statvfs`` ``f_bavail``: what an unprivileged
writer may use). Block devices and other non-regular targets are not checked.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from chm.errors import InvalidArgument, NoSpace
from chm.sizes import format_size, parse_size

__all__ = ["check_fits", "free_bytes"]


def _h(n: int) -> str:
    return format_size(n, exact=False)


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still allocate on ``path``'s filesystem."""
    st = os.statvfs(path)
    return int(st.f_bavail) * int(st.f_frsize)


def check_fits(
    target: str | os.PathLike[str],
    capacity: int | str,
    *,
    sparse_overcommit: bool = False,
    option: str = "sparse_overcommit",
) -> int:
    """Raises NoSpace if the file ``target`` (existing or to be created) could
    not grow to ``capacity`` bytes on its filesystem, naming both sizes and
    ``option`` (the configuration key that allows it anyway). Returns the
    bytes the file may still need. ``sparse_overcommit=True`` only returns
    them."""
    cap = parse_size(capacity)
    if cap <= 0:
        raise InvalidArgument(None, f"capacity={capacity!r}: expected bytes > 0")
    p = Path(target)
    used = 0
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            return 0  # a block device is as large as it is
        used = int(st.st_blocks) * 512
    need = max(0, cap - used)
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    free = free_bytes(parent)
    if need > free and not sparse_overcommit:
        err = NoSpace(
            errno.ENOSPC,
            f"{p}: capacity {_h(cap)} ({cap} bytes) needs {_h(need)} more but its "
            f"filesystem has {_h(free)} ({free} bytes) free; lower the "
            f"capacity, or set {option} to create it sparse anyway (writes fail with "
            "ENOSPC once the disk is full)",
        )
        err.filename = os.fspath(p)
        raise err
    return need
