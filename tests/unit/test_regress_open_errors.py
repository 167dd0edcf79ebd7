"""Errors that say what happened, at device open and at flush.

A target that is a FIFO, a character device, a socket or a directory is
refused at once as InvalidArgument naming the path and what it is (a FIFO
used to hang the open: locking it opened it for reading); a target behind a
directory the caller may not search is PermissionDenied naming the path and
the directory; a full filesystem under the backing file is NoSpace naming
the file and its free space, not a bare "backing I/O error". A close that
has to drop writes it could not write back raises NoSpace naming the file
and the bytes lost, once closed (a daemon's shutdown logs it at ERROR).

All real: a real FIFO, socket and /dev/null, a real unprivileged process
(root bypasses permission checks, so the open runs in a forked child that
drops to uid/gid 65534), and a real tiny tmpfs filled by the device's own
write-back.
"""

from __future__ import annotations

import errno
import gc
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

import chm
from chm import errors

SMALL = {"capacity": "64M", "dram": "128M", "backend": "pread"}


def _open_in_child(target: str, timeout: float = 20.0) -> str:
    """Opens a device over target in a fresh interpreter (a hang cannot take
    the test run with it); returns what it printed."""
    code = textwrap.dedent(
        f"""
        import chm
        try:
            chm.Device.open(targets=[{target!r}], **{SMALL!r}).close()
            print("OPENED")
        except chm.ChmError as e:
            print(type(e).__name__, e.errno, e.filename, "|", e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_fifo_target_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    try:
        line = _open_in_child(str(fifo))
    except subprocess.TimeoutExpired:
        pytest.fail(f"opening a device over the FIFO {fifo} hung")
    assert line.startswith(f"InvalidArgument {errno.EINVAL} {fifo} |"), line
    assert "FIFO" in line and "regular file or a block device" in line


def _other_kinds(tmp_path: Path) -> list[tuple[str, str]]:
    sock_path = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    s.close()  # the socket file stays
    d = tmp_path / "dir"
    d.mkdir()
    return [("/dev/null", "character device"), (str(sock_path), "socket"), (str(d), "directory")]


def test_other_non_regular_targets_are_refused_naming_them(tmp_path: Path) -> None:
    for path, kind in _other_kinds(tmp_path):
        with pytest.raises(errors.InvalidArgument) as exc:
            chm.Device.open(targets=[path], **SMALL)
        assert exc.value.filename == path
        assert path in str(exc.value) and kind in str(exc.value)


def _as_nobody(fn_src: str) -> str:
    """Runs fn_src (which prints its result) in a forked child that dropped
    to uid/gid 65534; returns what it printed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            buf: list[str] = []
            exec(fn_src, {"chm": chm, "out": buf.append, "SMALL": SMALL})
            os.write(w, "\n".join(buf).encode())
        except BaseException as e:  # reported to the parent
            os.write(w, f"CHILD FAILED {e!r}".encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
def test_a_target_in_an_unsearchable_directory_is_permission_denied() -> None:
    # not under tmp_path: pytest's own base directory is 0700
    base = Path(tempfile.mkdtemp(prefix="chm-perm-"))
    try:
        _check_unsearchable(base)
    finally:
        shutil.rmtree(base)


def _check_unsearchable(base: Path) -> None:
    os.chmod(base, 0o755)
    private = base / "private"
    private.mkdir(mode=0o700)
    target = private / "t.img"
    got = _as_nobody(
        textwrap.dedent(
            f"""
            try:
                chm.Device.open(targets=[{str(target)!r}], create=True, **SMALL)
                out("OPENED")
            except BaseException as e:
                out(f"{{type(e).__name__}}|{{e.errno}}|{{e.filename}}|"
                    f"{{isinstance(e, chm.ChmError)}}|{{isinstance(e, PermissionError)}}|{{e}}")
            """
        )
    )
    name, code, filename, is_chm, is_perm, text = got.split("|", 5)
    assert (name, int(code), filename) == ("PermissionDenied", errno.EACCES, str(target)), got
    assert is_chm == "True" and is_perm == "True", got
    assert f"directory {private}" in text and "not searchable by uid 65534" in text, got
    assert not target.exists()


@pytest.fixture
def tiny_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real 8 MiB tmpfs (needs root; tmpfs takes O_DIRECT since Linux 6.6)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    rc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if rc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {rc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize(
    ("mode", "backend"),
    [("prefetch", "pread"), ("lru", "pread"), ("direct", "pread"), ("prefetch", "uring")],
)
def test_a_full_filesystem_is_no_space_naming_the_file(
    tiny_fs: Path, mode: str, backend: str
) -> None:
    """The filesystem fills under the device's write-back: flush (a write,
    in direct mode) raises NoSpace naming the file and the free space left;
    nothing acknowledged is lost, so once space is freed the next flush
    succeeds and every byte reads back after a reopen."""
    ballast = tiny_fs / "ballast"
    ballast.write_bytes(b"\0" * (6 << 20))  # leaves about 2 MiB of the 8
    target = tiny_fs / "t.img"
    opts = {"capacity": "64M", "dram": "128M", "mode": mode, "backend": backend}
    try:
        dev = chm.Device.open(targets=[target], create=True, **opts)
    except (errors.NotSupported, errors.PermissionDenied) as refused:
        pytest.skip(f"backend {backend} on tmpfs unavailable here: {refused}")
    chunk = 1 << 20
    data = [bytes([i + 1]) * chunk for i in range(4)]
    written = 0
    try:
        # direct mode writes through, so the write itself fails; the others
        # buffer it and the flush does
        with pytest.raises(errors.NoSpace) as exc:
            for i, d in enumerate(data):
                dev.write(i * chunk, d)
                written = i + 1
            dev.flush()
        err = exc.value
        assert err.errno == errno.ENOSPC
        assert err.filename == str(target)
        free = os.statvfs(tiny_fs)
        assert f"({free.f_bavail * free.f_frsize} bytes free)" in str(err), str(err)
        assert "no space left" in str(err) and str(target) in str(err)
        assert not isinstance(err, errors.DeviceIOError)
        ballast.unlink()
        for i in range(written, len(data)):  # direct: what was refused, again
            dev.write(i * chunk, data[i])
        dev.flush()
    finally:
        if ballast.exists():
            ballast.unlink()
        dev.close()
    with chm.Device.open(targets=[target], **opts) as dev:
        for i, d in enumerate(data):
            assert dev.read(i * chunk, chunk) == d, f"chunk {i} changed"


def test_a_default_that_conflicts_says_which_and_what_to_pass(tmp_path: Path) -> None:
    """dram below the default wbuf (or slot_size) names the default, not a
    value the caller never set, and the option to pass."""
    target = tmp_path / "t.img"
    with pytest.raises(errors.InvalidArgument) as exc:
        chm.Device.open(targets=[target], capacity="64M", dram="16M", create=True)
    text = str(exc.value)
    assert "default write buffer" in text and "pass a smaller wbuf" in text, text
    with pytest.raises(errors.InvalidArgument) as exc:
        chm.Device.open(targets=[target], capacity="64M", dram="40M", create=True)
    text = str(exc.value)
    assert "default slot_size" in text and "pass a smaller slot_size" in text, text
    # a value the caller did set is named as such, with no talk of defaults
    with pytest.raises(errors.InvalidArgument) as exc:
        chm.Device.open(targets=[target], capacity="64M", dram="16M", wbuf="20M", create=True)
    assert "default" not in str(exc.value) and "wbuf: 20971520" in str(exc.value)
    assert not target.exists()


def test_a_failed_create_leaves_no_file_behind(tmp_path: Path) -> None:
    """A real ramfs has no O_DIRECT: Linux creates the file, then fails the
    O_DIRECT open; the refused create=True open must not leave that empty
    file behind (needs root to mount)."""
    mnt = tmp_path / "ram"
    mnt.mkdir()
    rc = subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mnt)], capture_output=True)
    if rc.returncode != 0:
        pytest.skip(f"cannot mount a ramfs here: {rc.stderr.decode().strip()}")
    try:
        target = mnt / "t.img"
        with pytest.raises(errors.NotSupported) as exc:
            chm.Device.open(targets=[target], create=True, **SMALL)
        assert exc.value.filename == str(target)
        assert "no O_DIRECT" in str(exc.value)
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_close_keeps_retrying_a_full_filesystem(tiny_fs: Path) -> None:
    """close() writes the buffer back best effort, retrying failed batches
    for its budget: a filesystem that was full and gets space while close
    waits loses nothing (no space must be retried like an I/O error, not
    end the close at once)."""
    ballast = tiny_fs / "ballast"
    ballast.write_bytes(b"\0" * (6 << 20))
    target = tiny_fs / "t.img"
    opts = {"capacity": "64M", "dram": "128M", "backend": "pread"}
    try:
        dev = chm.Device.open(targets=[target], create=True, **opts)
    except errors.NotSupported:
        pytest.skip("no O_DIRECT on tmpfs on this kernel")
    chunk = 1 << 20
    data = [bytes([i + 1]) * chunk for i in range(4)]
    for i, d in enumerate(data):
        dev.write(i * chunk, d)
    freer = threading.Timer(0.5, ballast.unlink)
    freer.start()
    try:
        dev.close()
    finally:
        freer.join()
    with chm.Device.open(targets=[target], **opts) as dev:
        for i, d in enumerate(data):
            assert dev.read(i * chunk, chunk) == d, f"chunk {i} lost at close"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
def test_an_unwritable_scratch_parent_is_permission_denied() -> None:
    """No targets: the scratch backing file goes under CHM_TMPDIR; one this
    process may not write is PermissionDenied naming it, not a bare
    PermissionError."""
    base = Path(tempfile.mkdtemp(prefix="chm-perm-"))
    try:
        os.chmod(base, 0o700)  # root's: uid 65534 may not create in it
        got = _as_nobody(
            textwrap.dedent(
                f"""
                import os
                os.environ["CHM_TMPDIR"] = {str(base)!r}
                try:
                    chm.Device.open(**SMALL)
                    out("OPENED")
                except BaseException as e:
                    out(f"{{type(e).__name__}}|{{isinstance(e, chm.ChmError)}}|{{e}}")
                """
            )
        )
        name, is_chm, text = got.split("|", 2)
        assert (name, is_chm) == ("PermissionDenied", "True"), got
        assert str(base) in text and "CHM_TMPDIR" in text, got
    finally:
        shutil.rmtree(base)


def test_a_wait_without_deadline_reads_forever_in_the_message(tiny_fs: Path) -> None:
    """chm_flush(timeout_ns=18446744073709551615) read like a number to
    compute; no deadline is shown as "forever"."""
    ballast = tiny_fs / "ballast"
    ballast.write_bytes(b"\0" * (6 << 20))
    try:
        dev = chm.Device.open(targets=[tiny_fs / "t.img"], create=True, **SMALL)
    except errors.NotSupported:
        pytest.skip("no O_DIRECT on tmpfs on this kernel")
    try:
        for i in range(4):
            dev.write(i << 20, b"\1" * (1 << 20))
        with pytest.raises(errors.NoSpace) as exc:
            dev.flush()
        assert "chm_flush(timeout_ns=forever)" in str(exc.value), str(exc.value)
    finally:
        ballast.unlink()
        dev.close()


def _lost_bytes(text: str) -> int:
    """The byte count a lossy close names ("N bytes in W writes to ...")."""
    head = text.split(" bytes in ", 1)[0]
    assert head != text, text
    return int(head.rsplit(" ", 1)[-1])


def _fill_past_free(tiny_fs: Path, mode: str) -> tuple[chm.Device, Path, int, int]:
    """A device on a tmpfs that a ballast has nearly filled, holding more
    written (never flushed) data than the filesystem has room for. Returns
    the device, its target, the bytes written and the free bytes before."""
    (tiny_fs / "ballast").write_bytes(b"\0" * (6 << 20))
    target = tiny_fs / "t.img"
    try:
        dev = chm.Device.open(targets=[target], create=True, mode=mode, **SMALL)
    except errors.NotSupported:
        pytest.skip("no O_DIRECT on tmpfs on this kernel")
    st = os.statvfs(tiny_fs)
    free = st.f_bavail * st.f_frsize
    chunk = 1 << 20
    n = free // chunk + 2
    for i in range(n):
        dev.write(i * chunk, bytes([i + 1]) * chunk)
    return dev, target, n * chunk, free


def _assert_reports_loss(err: BaseException, target: Path, written: int, free: int) -> None:
    assert isinstance(err, errors.NoSpace), repr(err)
    assert err.errno == errno.ENOSPC
    assert err.filename == str(target)
    text = str(err)
    assert str(target) in text and "written but never flushed" in text, text
    lost = _lost_bytes(text)
    # at most what was written, at least what could not fit
    assert written - free <= lost <= written, (lost, written, free, text)


@pytest.mark.parametrize("mode", ["prefetch", "lru"])
def test_a_close_that_loses_writes_raises_no_space_with_the_bytes(tiny_fs: Path, mode: str) -> None:
    """More written than the filesystem holds, no flush: close still closes
    (best effort, as a power cut would) but raises NoSpace afterwards naming
    the file and the bytes dropped, instead of returning as if all were
    durable. The device is fully closed then: its target can be reopened."""
    dev, target, written, free = _fill_past_free(tiny_fs, mode)
    cpu0, t0 = time.process_time(), time.monotonic()
    with pytest.raises(errors.NoSpace) as exc:
        dev.close()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
    assert dev.closed
    # the retries back off: a close waiting out its budget on a full disk
    # does not spin a core (it used 8 s of CPU in 10 s before)
    assert cpu < 0.3 * wall + 0.5, (cpu, wall)
    _assert_reports_loss(exc.value, target, written, free)
    dev.close()  # idempotent: the loss is reported once
    (tiny_fs / "ballast").unlink()
    with chm.Device.open(targets=[target], mode=mode, **SMALL) as again:
        again.write(0, b"\7" * 4096)
        again.flush()


def test_a_with_block_reports_a_lossy_close(tiny_fs: Path) -> None:
    """Leaving a with block closes the device and raises the loss too."""
    dev, target, written, free = _fill_past_free(tiny_fs, "lru")
    with pytest.raises(errors.NoSpace) as exc, dev:
        pass
    assert dev.closed
    _assert_reports_loss(exc.value, target, written, free)


def test_a_lossy_close_under_another_exception_is_logged(
    tiny_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception already leaving the with block stays the one raised;
    the loss is logged at ERROR instead of being dropped."""
    dev, target, written, free = _fill_past_free(tiny_fs, "lru")
    with caplog.at_level("ERROR", logger="chm.device"), pytest.raises(KeyError), dev:
        raise KeyError("first")
    assert dev.closed
    lossy = [r for r in caplog.records if "written but never flushed" in r.getMessage()]
    assert len(lossy) == 1 and lossy[0].levelname == "ERROR", caplog.records
    assert str(target) in lossy[0].getMessage()
    assert written - free <= _lost_bytes(lossy[0].getMessage()) <= written


@pytest.mark.parametrize("mode", ["prefetch", "lru"])
def test_a_close_after_a_flush_reports_nothing(tiny_fs: Path, mode: str) -> None:
    """The control: what fits and was flushed closes without an error."""
    target = tiny_fs / "t.img"
    try:
        dev = chm.Device.open(targets=[target], create=True, mode=mode, **SMALL)
    except errors.NotSupported:
        pytest.skip("no O_DIRECT on tmpfs on this kernel")
    for i in range(2):
        dev.write(i << 20, b"\3" * (1 << 20))
    dev.flush()
    dev.close()
    assert dev.closed


def test_a_daemon_shutdown_that_loses_writes_logs_it_and_closes(
    tiny_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real daemon (in this process, serving on a real socket) whose
    device cannot write its data back at shutdown logs the loss at ERROR,
    naming the file, and still closes everything instead of dying with the
    device half open."""
    from chm.daemon import Daemon, ServeOptions

    (tiny_fs / "ballast").write_bytes(b"\0" * (6 << 20))
    target = tiny_fs / "t.img"
    device = {"targets": [str(target)], "create": True, "mode": "lru", **SMALL}
    d = Daemon(ServeOptions(device=device, socket=str(tiny_fs / "chm.sock"), kv=False))
    try:
        d.start()
    except chm.errors.ChmError as exc:
        pytest.skip(f"no daemon on tmpfs here: {exc}")
    st = os.statvfs(tiny_fs)
    n = (st.f_bavail * st.f_frsize) // (1 << 20) + 2
    for i in range(n):
        d.dev.write(i << 20, bytes([i + 1]) * (1 << 20))
    with caplog.at_level("ERROR", logger="chm.serve"):
        d.close()
    assert d.dev.closed
    lost = [r for r in caplog.records if "written but never flushed" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelname == "ERROR", caplog.records
    assert str(target) in lost[0].getMessage()


def test_a_device_collected_without_close_reports_its_lost_writes(
    tiny_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Device dropped without close() is closed when collected, and the
    writes its final flush could not keep are logged at ERROR naming the
    file (they were dropped without a word before)."""
    dev, target, written, free = _fill_past_free(tiny_fs, "lru")
    with caplog.at_level("ERROR", logger="chm.device"):
        del dev
        gc.collect()
    lossy = [r for r in caplog.records if "never closed" in r.getMessage()]
    assert len(lossy) == 1 and lossy[0].levelname == "ERROR", caplog.records
    assert str(target) in lossy[0].getMessage()
    assert written - free <= _lost_bytes(lossy[0].getMessage()) <= written


def test_a_device_collected_without_close_keeps_its_writes(tmp_path: Path) -> None:
    """Collected without close(): what was written is flushed, as close does."""
    target = tmp_path / "t.img"
    dev = chm.Device.open(targets=[target], create=True, mode="prefetch", **SMALL)
    assert dev.write(0, b"\x07" * (1 << 20))
    del dev
    gc.collect()
    with chm.Device.open(targets=[target], **SMALL) as again:
        assert bytes(again.read(0, 1 << 20)) == b"\x07" * (1 << 20)


def test_a_store_closing_under_another_exception_keeps_it_and_logs_the_failure(
    tiny_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Leaving a KV store's with block on an exception: the close's flush
    finds the filesystem full. The exception already leaving stays the one
    raised (the NoSpace replaced it before), and the failed close is logged
    at ERROR, naming the file; without an exception the close raises it."""
    from chm.kv import Store

    for raising in (True, False):
        dev, target, _, _ = _fill_past_free(tiny_fs, "prefetch")
        # the journal off the full filesystem
        st = Store(
            dev,
            journal=tiny_fs.parent / f"j{raising}.kvjournal",
            block_bytes=1 << 20,
            segment_bytes=4 << 20,
        )
        caplog.clear()
        with caplog.at_level("ERROR", logger="chm.kv.store"):
            if raising:
                with pytest.raises(KeyError, match="first"), st:
                    raise KeyError("first")
            else:
                with pytest.raises(errors.NoSpace), st:
                    pass
        assert st.closed
        logged = [r.getMessage() for r in caplog.records if r.name == "chm.kv.store"]
        if raising:
            assert len(logged) == 1 and "after KeyError" in logged[0], logged
            assert str(target) in logged[0] and "no space left" in logged[0], logged
        else:
            assert logged == []
        (tiny_fs / "ballast").unlink()  # room again: the device closes clean
        dev.close()
        target.unlink()
