"""One client cannot hurt another through the daemon's shared device and store.

- Raw writes and the KV store never share addresses: with a KV store the
  daemon serves no raw addresses unless started with ``--raw SIZE``, and then
  only the top SIZE bytes, which the store's segments never reach; another
  client's puts never overwrite flushed raw data.
- Who may put and remove shared keys is the operator's choice
  (``--kv-writer``); the others only read, and are told so (EACCES) without
  losing their connection.
- A request that fails (removing a key another client is loading, reporting
  a bad checksum on a block another client holds) is answered to the client
  that made it; its connection, handles and pins stay.
"""

from __future__ import annotations

import errno
import grp
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
import chm.remote  # loaded before a fork: the child may not read the interpreter's files
from chm.errors import Busy, ChmError
from chm.remote.protocol import Op
from chm.testing.daemon_proc import DaemonProcess

MIB = 1 << 20
NOBODY = 65534
GROUP = "users"


def serve_args(tmp: Path, *extra: str) -> list[str]:
    return [
        "--target", str(tmp / "t0.img"), "--create", "--capacity", "128M",
        "--dram", "40M", "--slot-size", "1M", "--backend", "pread", *extra,
    ]  # fmt: skip


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    with DaemonProcess(serve_args(tmp_path), tmp_path / "chm.sock") as d:
        yield d


def _blocks(n: int, size: int = MIB, fill: int = 7) -> list[np.ndarray[Any, Any]]:
    return [np.full(size, fill, np.uint8) for _ in range(n)]


def test_no_raw_access_beside_the_kv_store_by_default(daemon: DaemonProcess) -> None:
    """The reported case: a raw write at 8 MiB, flushed, then another
    client's puts of 1 MiB blocks overwrote it. Now the raw write is refused."""
    with chm.connect(daemon.socket) as c, chm.connect(daemon.socket) as other:
        assert c.capacity == 0
        with pytest.raises(ChmError) as ei:
            c.write(8 << 20, b"\xab" * 65536)
        assert ei.value.errno == errno.EACCES
        assert "raw region" in str(ei.value) and "--raw" in str(ei.value)
        with pytest.raises(ChmError) as ei:
            c.read(8 << 20, 4)
        assert ei.value.errno == errno.EACCES
        (h,) = c.prefetch_many([8 << 20], [4096])
        assert isinstance(h, ChmError) and h.errno == errno.EACCES
        kv = other.kv()
        keys = [f"k{i}".encode() for i in range(16)]
        kv.put(keys, _blocks(16))
        kv.flush()
        assert c.daemon_stats()["held"]["clients"] == 2  # both still served


def test_raw_region_and_kv_segments_never_overlap(tmp_path: Path) -> None:
    """--raw 32M: clients' raw addresses 0..32M are the device's top 32 MiB;
    the store cycles through all of its own 96 MiB (evicting) and the raw
    data stays byte-exact."""
    with (
        DaemonProcess(serve_args(tmp_path, "--raw", "32M"), tmp_path / "chm.sock") as d,
        chm.connect(d.socket) as c,
        chm.connect(d.socket) as other,
    ):
        assert c.capacity == 32 * MIB and c.config.capacity == 128 * MIB
        pattern = {a: bytes([0xA0 + i]) * 65536 for i, a in enumerate(range(0, 32 * MIB, 4 * MIB))}
        for a, data in pattern.items():
            assert c.write(a, data) is True
        c.flush()
        kv = other.kv()
        for r in range(3):  # 3 x 96 blocks of 1 MiB: every segment of the store written
            keys = [f"r{r}-{i}".encode() for i in range(96)]
            kv.put(keys, _blocks(96, fill=0x07))
            kv.flush()
        for a, data in pattern.items():
            assert c.read(a, len(data)) == data, hex(a)
        with pytest.raises(ChmError) as ei:  # past the raw region
            c.write(32 * MIB, b"\xab" * 4096)
        assert ei.value.errno == errno.EACCES
        # the address a staged raw object reports is the client's own
        (h,) = c.prefetch_many([4 * MIB], [4096])
        assert not isinstance(h, ChmError)
        view = h.wait(timeout=10)
        assert bytes(view) == pattern[4 * MIB][:4096]
        assert h.place is not None and h.place[0] == 4 * MIB
        del view
        h.release()


def _reasons(d: DaemonProcess, n: int) -> list[str]:
    """The first n disconnect reasons the daemon logs (each as its thread ends)."""
    deadline = time.monotonic() + 10
    while True:
        reasons = [e["reason"] for e in d.events() if e.get("event") == "disconnect"]
        if len(reasons) >= n or time.monotonic() > deadline:
            return reasons
        time.sleep(0.02)


def _key_pair(dev: chm.remote.RemoteDevice, name: bytes) -> list[int]:
    ks = dev.kv().namespace.keys([name])
    return [int(ks[0]["hi"]), int(ks[0]["lo"])]


def test_remove_of_a_key_another_client_loads_is_busy(daemon: DaemonProcess) -> None:
    with chm.connect(daemon.socket) as loader, chm.connect(daemon.socket) as remover:
        kv = remover.kv()
        kv.put([b"shared"], _blocks(1))
        kv.flush()
        pair = _key_pair(loader, b"shared")
        ((rc, tok, _n, _sum),) = loader._call(Op.KV_LOOKUP, [[pair], False])  # pinned
        assert rc == 0
        with pytest.raises(Busy) as ei:
            kv.remove([b"shared"])
        assert "pinned" in str(ei.value)
        # the remover's connection, and what it holds, stay
        assert kv.contains([b"shared"]) == [True]
        assert remover.daemon_stats()["held"]["pins"] == 1
        assert loader._call(Op.KV_DONE, [[*pair, tok, 0]]) == [0]
        assert kv.remove([b"shared"]) == [True]
    assert _reasons(daemon, 2) == ["closed by the client"] * 2


def test_bad_checksum_report_on_a_held_block(daemon: DaemonProcess) -> None:
    """KV_DONE bad=1 while another client holds the block: answered; the
    block is dropped once the other client hands it back."""
    with chm.connect(daemon.socket) as holder, chm.connect(daemon.socket) as reporter:
        kv = reporter.kv()
        kv.put([b"torn"], _blocks(1))
        kv.flush()
        pair = _key_pair(holder, b"torn")
        ((rc_h, tok_h, _, _),) = holder._call(Op.KV_LOOKUP, [[pair], False])
        ((rc_r, tok_r, _, _),) = reporter._call(Op.KV_LOOKUP, [[pair], False])
        assert rc_h == rc_r == 0
        assert reporter._call(Op.KV_DONE, [[*pair, tok_r, 1]]) == [0]
        assert kv.contains([b"torn"]) == [True]  # still held by the other client
        assert holder._call(Op.KV_DONE, [[*pair, tok_h, 0]]) == [0]
        assert kv.contains([b"torn"]) == [False]  # dropped: a miss from now on
        s = reporter.daemon_stats()
        assert s["daemon"]["kv_checksum_errors"] == 1
        assert s["held"] == {"clients": 2, "handles": 0, "pins": 0}
    assert _reasons(daemon, 2) == ["closed by the client"] * 2


def _as_nobody(sock: str, groups: list[int]) -> str:
    """Forks, drops to uid NOBODY with the groups, tries the shared store."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery from here on
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(groups[0])
            os.setuid(NOBODY)
            out = []
            try:
                with chm.connect(sock) as dev:
                    kv = dev.kv()
                    buf = np.zeros(4096, np.uint8)
                    out.append(f"get={kv.get([b'owned'], [buf])} byte={int(buf[0])}")
                    for call in (
                        lambda: kv.put([b"mine"], [np.ones(4096, np.uint8)]),
                        lambda: kv.remove([b"owned"]),
                    ):
                        try:
                            call()
                            out.append("allowed")
                        except ChmError as exc:
                            out.append(f"errno={exc.errno}")
                    out.append(f"write={dev.welcome['kv_write']}")
                    out.append(f"still={dev.daemon_stats()['held']['clients']}")
            except BaseException as exc:
                out.append(f"other {type(exc).__name__}: {exc}")
            os.write(w, " ".join(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode()
    os.waitpid(pid, 0)
    return got


def test_kv_writers_others_only_read(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing uid needs root")
    try:
        gid = grp.getgrnam(GROUP).gr_gid
    except KeyError:
        pytest.skip(f"no group {GROUP!r} on this host")
    sockdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"chm-iso-{os.getpid()}"
    sockdir.mkdir(mode=0o755, exist_ok=True)
    try:
        args = serve_args(tmp_path, "--group", GROUP, "--kv-writer", "root")
        with (
            DaemonProcess(args, sockdir / "chm.sock", log=str(tmp_path / "log")) as d,
            chm.connect(d.socket) as root,
        ):
            assert root.welcome["kv_write"] is True
            kv = root.kv()
            kv.put([b"owned"], [np.full(4096, 9, np.uint8)])
            kv.flush()
            got = _as_nobody(d.socket, [gid])
            assert got == (
                f"get=[True] byte=9 errno={errno.EACCES} errno={errno.EACCES} write=False still=2"
            ), got
            assert kv.contains([b"owned", b"mine"]) == [True, False]
    finally:
        (sockdir / "chm.sock").unlink(missing_ok=True)
        sockdir.rmdir()
