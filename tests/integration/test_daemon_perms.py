"""Who may connect: the socket is 0660, owned by the daemon's user and the
configured group. A process of another uid without the group is refused; with
the group (as a supplementary group) it is served. Needs root to change uid
(skipped otherwise). The child is a fork of the test process that drops to
uid 65534, since the interpreter's own files may not be readable by that user.
"""

from __future__ import annotations

import grp
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import chm
import chm.remote  # loaded before the fork: the child cannot read the interpreter's files
from chm.testing.daemon_proc import DaemonProcess

NOBODY = 65534
GROUP = "users"


@pytest.fixture
def sockdir() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("changing uid needs root")
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        pytest.skip(f"no group {GROUP!r} on this host")
    d = Path(tempfile.mkdtemp(prefix="chm-perm-", dir="/tmp"))
    d.chmod(0o755)  # reachable by anyone: the socket's own mode decides
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _connect_as(sock: str, gid: int, groups: list[int]) -> str:
    """Forks, drops to uid NOBODY with the given groups, connects; what happened."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery from here on
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(NOBODY)
            try:
                with chm.connect(sock) as dev:
                    msg = f"served {dev.config.capacity}"
            except PermissionError as exc:
                msg = f"refused {exc.strerror}"
            except BaseException as exc:
                msg = f"other {type(exc).__name__}: {exc}"
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_other_uid_without_group_refused(sockdir: Path, tmp_path: Path) -> None:
    gid = grp.getgrnam(GROUP).gr_gid
    args = ["--target", str(tmp_path / "t0.img"), "--create", "--capacity", "64M", "--dram",
            "40M", "--slot-size", "1M", "--backend", "pread", "--group", GROUP]  # fmt: skip
    with DaemonProcess(args, sockdir / "chm.sock", log=str(tmp_path / "log")) as d:
        st = os.stat(d.socket)
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_gid == gid
        refused = _connect_as(d.socket, NOBODY, [NOBODY])
        assert refused.startswith("refused"), refused
        assert "0660" in refused
        served = _connect_as(d.socket, NOBODY, [NOBODY, gid])
        assert served == f"served {64 << 20}", served
