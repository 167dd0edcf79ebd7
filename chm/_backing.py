"""Backing files of an embedded device: the flocks that keep one device per
file, and the scratch directory of a device opened without targets."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Sequence

from chm._scratch import ScratchDir
from chm.errors import Busy, ChmError, error_for

__all__ = ["lock_targets", "scratch_dir", "unlock"]


def _flock_holder(path: str) -> str:
    """Who holds a flock on path ('pid N', from /proc/locks), or a hint."""
    try:
        ino = os.stat(path).st_ino
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].endswith(f":{ino}"):
                    return f"pid {parts[4]}"
    except (OSError, ValueError):
        pass
    return "an unknown process"


def lock_targets(paths: Sequence[str], fds: dict[str, int]) -> None:
    """Takes exclusive non-blocking flocks on the regular-file targets not in fds.

    A second embedded opener of the same backing file (in this process or
    another) gets Busy naming the path and the holder, instead of two
    devices sharing a file with private caches. Block devices are opened
    O_EXCL by the C core instead.
    """
    new: list[int] = []
    try:
        for p in paths:
            if p in fds:
                continue
            # Only regular files are locked here, and only they are opened:
            # opening a FIFO for reading would block until a writer came, a
            # character device may act on open. The C core refuses those,
            # naming the path and what it is; a path this process may not
            # reach (missing, unsearchable directory) it reports likewise.
            try:
                if not stat.S_ISREG(os.stat(p).st_mode):
                    continue
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError:
                continue
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
                os.close(fd)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                err = Busy(
                    errno.EBUSY,
                    f"target {p}: already open by {_flock_holder(p)} (one device per backing "
                    "file; close the other first)",
                    call="chm_dev_open",
                )
                err.filename = p
                raise err from None
            fds[p] = fd
            new.append(fd)
    except BaseException:
        for fd in new:
            os.close(fd)
        raise


def unlock(fds: dict[str, int]) -> None:
    while fds:
        os.close(fds.popitem()[1])


def scratch_dir() -> ScratchDir:
    """A fresh scratch directory for a device opened without targets; a
    parent this process may not write is a ChmError (PermissionDenied for
    EACCES) naming it and what to do, not a bare OSError."""
    parent = _default_tmp_parent()
    try:
        return ScratchDir(parent)
    except ChmError:
        raise
    except OSError as exc:
        code = exc.errno or errno.EIO
        where = parent if parent is not None else tempfile.gettempdir()
        err = error_for(code)(
            code,
            f"scratch backing file under {where} (CHM_TMPDIR or the system temporary "
            f"directory): {exc.strerror}; set CHM_TMPDIR to a directory this process "
            "may write, or pass targets",
            call="Device",
        )
        err.filename = exc.filename if exc.filename is not None else where
        raise err from exc


def _default_tmp_parent() -> str | None:
    env = os.environ.get("CHM_TMPDIR")
    if env:
        return env
    return None
