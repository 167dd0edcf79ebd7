"""Scratch directories for the default backing file of a :class:`chm.Device`.

A device opened without targets keeps a sparse backing file in a fresh
directory ``chm-<pid>-<random>`` under ``CHM_TMPDIR`` (default: the system
temporary directory), removed when the device closes. For as long as the
directory is in use its owner holds an exclusive ``flock`` on the file
``.owner`` inside it, so a directory outlives its use only when the owner
died without cleaning up (SIGKILL, a crash, power loss).

:func:`reap` removes such leftovers, and nothing else. An entry of the parent
directory is removed only when all of these hold:

- its name is ``chm-<pid>-<suffix>`` and no process ``<pid>`` exists;
- it is a directory itself (never a symlink: nothing is followed) owned by
  this user;
- nobody holds the lock on its ``.owner`` file (a child forked by the dead
  owner inherits the lock and keeps the directory), which it keeps locked
  while removing it (``shutil.rmtree`` never follows symlinks either).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile

__all__ = ["LOCK_NAME", "ScratchDir", "reap"]

LOCK_NAME = ".owner"
_NAME = re.compile(r"chm-(\d+)-[A-Za-z0-9_]+")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, someone else's
        return True
    return True


def _try_remove(parent_fd: int, parent: str, name: str) -> bool:
    """Removes parent/name if it is an abandoned scratch directory (see the
    module docstring); True when removed."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False
    try:
        dfd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:  # ELOOP: replaced by a symlink meanwhile
        return False
    lock = -1
    try:
        if not os.path.samestat(st, os.fstat(dfd)):
            return False
        # no lock file: the owner died between making the directory and locking it
        with contextlib.suppress(FileNotFoundError):
            lock = os.open(LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        if lock >= 0:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: a live process still uses it
                return False
        shutil.rmtree(os.path.join(parent, name))  # the fd-based walk: no symlink followed
        return True
    except OSError:
        return False
    finally:
        if lock >= 0:
            os.close(lock)
        os.close(dfd)


def reap(parent: str | None = None) -> list[str]:
    """Removes the scratch directories of dead processes under ``parent``
    (default: the system temporary directory); returns the paths removed.
    Never raises for a directory it cannot inspect or remove: it skips it."""
    parent = parent or tempfile.gettempdir()
    try:
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return []
    removed: list[str] = []
    me = os.getpid()
    try:
        for name in os.listdir(pfd):
            m = _NAME.fullmatch(name)
            if m is None:
                continue
            pid = int(m.group(1))
            if pid == me or _alive(pid):
                continue
            if _try_remove(pfd, parent, name):
                removed.append(os.path.join(parent, name))
    finally:
        os.close(pfd)
    return removed


class ScratchDir:
    """A fresh ``chm-<pid>-*`` directory, locked for as long as it exists.

    ``remove()`` (idempotent) deletes it and drops the lock; it holds no
    reference to whatever uses the directory, so it can be a finaliser.
    """

    __slots__ = ("_lock", "path")

    def __init__(self, parent: str | None = None) -> None:
        reap(parent)
        self.path = tempfile.mkdtemp(prefix=f"chm-{os.getpid()}-", dir=parent)
        try:
            self._lock = os.open(
                os.path.join(self.path, LOCK_NAME),
                os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def remove(self) -> None:
        lock, self._lock = self._lock, -1
        if lock < 0:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(lock)
