"""The default backend is chosen at open time: uring where io_uring works,
else pread; an explicit backend="uring" on a host without io_uring is a
NotSupported naming backend="pread".

Two ways to take io_uring away:
- a real one: a subprocess that installs a seccomp filter refusing
  io_uring_setup with EPERM (what a container runtime's profile or the
  kernel.io_uring_disabled sysctl do) before it imports chm;
- a forced failure in this process: chm._lowlevel.dev_open monkeypatched to
  refuse uring configurations with the C core's own errno and reason.
"""

from __future__ import annotations

import errno
import json
import platform
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import chm
import chm.backend
from chm import _lowlevel as _ll
from chm.errors import NotSupported
from chm_emu.cli import main as cli_main

SMALL: dict[str, Any] = {"capacity": "64M", "dram": "16M", "wbuf": "4M", "slot_size": "1M"}
TROUBLESHOOTING = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"


def _readme_troubleshooting() -> str:
    """The Troubleshooting page (docs/troubleshooting.md), whitespace collapsed."""
    return " ".join(TROUBLESHOOTING.read_text().split())


# ---------------------------------------------------------------- forced failure


@pytest.fixture
def forced_no_uring(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """FORCED FAILURE: every uring open is refused as the C core refuses it
    when io_uring_setup fails; other backends open for real. Returns the
    backends of the opens attempted."""
    real = _ll.dev_open
    tried: list[str] = []

    def refuse_uring(cfg: Any) -> Any:
        name = "uring" if int(cfg.backend) == _ll.BACKENDS["uring"] else "other"
        tried.append(name)
        if name == "uring":
            raise NotSupported(
                errno.EOPNOTSUPP,
                "chm_dev_open(): not supported in this mode or on this host: "
                "backend uring: not supported in this mode or on this host",
                call="chm_dev_open",
                detail="backend uring: not supported in this mode or on this host",
            )
        return real(cfg)

    monkeypatch.setattr(_ll, "dev_open", refuse_uring)
    monkeypatch.setattr(chm.backend, "_refused", None)
    return tried


def test_default_is_uring_where_it_works() -> None:
    if chm.backend.uring_unavailable():
        pytest.skip(f"io_uring is unavailable here: {chm.backend.uring_unavailable()}")
    with chm.Device.open(**SMALL) as dev:
        assert dev.backend == "uring"
        assert dev.stats().backend_name == "uring"


def test_default_falls_back_to_pread(forced_no_uring: list[str]) -> None:
    with chm.Device.open(**SMALL) as dev:
        assert dev.backend == "pread"
        assert dev.config.backend == "pread"
        dev.write(0, b"x" * 512)
        assert dev.read(0, 512) == b"x" * 512
    assert forced_no_uring == ["uring", "other"]
    reason = chm.backend.uring_unavailable()
    assert reason is not None and reason.startswith("backend uring:")
    # remembered: the next default open goes straight to pread
    with chm.Device(chm.Config(SMALL)) as dev:
        assert dev.backend == "pread"
    assert forced_no_uring == ["uring", "other", "other"]


def test_auto_is_the_same_as_unset(forced_no_uring: list[str]) -> None:
    cfg = chm.Config(SMALL, backend="pread")
    assert not cfg.auto_backend
    auto = cfg.set("backend", "auto")
    assert auto.auto_backend and auto.backend == "uring"
    with chm.Device(cfg) as dev:
        assert dev.backend == "pread"
    with chm.Device.open(backend="auto", **SMALL) as dev:
        assert dev.backend == "pread"


def test_explicit_uring_is_not_replaced(forced_no_uring: list[str]) -> None:
    with pytest.raises(NotSupported) as ei:
        chm.Device.open(backend="uring", **SMALL)
    err = ei.value
    assert err.errno == errno.EOPNOTSUPP
    assert 'use backend="pread"' in str(err.strerror)
    assert err.detail is not None and err.detail.startswith("backend uring:")
    assert forced_no_uring == ["uring"]


def test_explicit_pread_and_ghost_never_try_uring(forced_no_uring: list[str]) -> None:
    with chm.Device.open(backend="pread", **SMALL) as dev:
        assert dev.backend == "pread"
    with chm.Device.open(backend="ghost", **SMALL) as dev:
        assert dev.backend == "ghost"
    assert "uring" not in forced_no_uring


def test_other_errors_are_not_taken_for_a_missing_io_uring(tmp_path: Path) -> None:
    # a missing target is NotFound whatever the backend choice
    with pytest.raises(FileNotFoundError):
        chm.Device.open(targets=[tmp_path / "absent.img"], **SMALL)


def test_toml_backend_auto(tmp_path: Path, forced_no_uring: list[str]) -> None:
    p = tmp_path / "device.toml"
    p.write_text(
        'backend = "auto"\ncapacity = "64M"\ndram = "16M"\nwbuf = "4M"\nslot_size = "1M"\n'
    )
    cfg = chm.Config.from_toml(p)
    assert cfg.auto_backend
    with chm.Device(cfg) as dev:
        assert dev.backend == "pread"


def test_demo_names_the_fallback(forced_no_uring: list[str]) -> None:
    args = ["stage-demo", "--objects", "2", "--slots", "1", "--object-size", "1M"]
    result = CliRunner().invoke(cli_main, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "io_uring is unavailable here (backend uring:" in text
    assert "using the pread backend" in text
    assert "backend=pread" in text
    assert "pread / prefetch" in text


def test_demo_explicit_uring_fails_cleanly(forced_no_uring: list[str]) -> None:
    args = [
        "stage-demo",
        "--backend",
        "uring",
        "--objects",
        "2",
        "--slots",
        "1",
        "--object-size",
        "1M",
    ]
    result = CliRunner().invoke(cli_main, args)
    assert result.exit_code == 1
    # the library's backend="pread", in the command's words
    assert "use --backend pread" in " ".join(result.output.split())


# ---------------------------------------------------------------- real seccomp

# Installs a seccomp filter that fails io_uring_setup (x86-64 syscall 425)
# with EPERM, then runs the code that follows it in the same interpreter.
_SECCOMP = textwrap.dedent(
    """
    import ctypes, errno, struct
    libc = ctypes.CDLL(None, use_errno=True)
    def ins(code, jt, jf, k):
        return struct.pack("HBBI", code, jt, jf, k)
    prog = b"".join([
        ins(0x20, 0, 0, 4),                  # A = arch
        ins(0x15, 1, 0, 0xC000003E),         # x86-64? skip the next
        ins(0x06, 0, 0, 0x7FFF0000),         # other arch: allow
        ins(0x20, 0, 0, 0),                  # A = syscall number
        ins(0x15, 0, 1, 425),                # io_uring_setup?
        ins(0x06, 0, 0, 0x00050000 | errno.EPERM),
        ins(0x06, 0, 0, 0x7FFF0000),         # allow the rest
    ])
    buf = ctypes.create_string_buffer(prog)
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fp = Fprog(len(prog) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(fp), 0, 0):
        raise SystemExit("seccomp: " + errno.errorcode[ctypes.get_errno()])
    """
)


def _run_without_io_uring(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip("the seccomp filter here is written for Linux x86-64")
    script = tmp_path / "no_uring.py"
    script.write_text(_SECCOMP + textwrap.dedent(code))
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    if proc.returncode and "seccomp:" in proc.stderr:
        pytest.skip(f"cannot install a seccomp filter here: {proc.stderr.strip()}")
    return proc


def test_real_seccomp_default_and_explicit(tmp_path: Path) -> None:
    proc = _run_without_io_uring(
        f"""
        import json
        import chm
        out = {{}}
        with chm.Device.open(**{SMALL!r}) as dev:
            out["default"] = dev.backend
        try:
            chm.Device.open(backend="uring", **{SMALL!r})
        except chm.errors.NotSupported as exc:
            out["explicit"] = str(exc)
        print(json.dumps(out))
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["default"] == "pread"
    assert 'use backend="pread"' in out["explicit"]
    assert "backend uring:" in out["explicit"]
    # docs/troubleshooting.md shows this very text
    assert f"chm.errors.NotSupported: {out['explicit']}" in _readme_troubleshooting()


def test_real_seccomp_demo(tmp_path: Path) -> None:
    proc = _run_without_io_uring(
        """
        import sys
        from chm_emu.cli import main
        sys.argv = ["chm-emu", "stage-demo", "--objects", "2", "--slots", "1",
                    "--object-size", "1M"]
        main()
        """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = " ".join(proc.stdout.split())
    assert "using the pread backend" in text
    assert "backend=pread" in text
    said = text[text.index("io_uring is unavailable") : text.index("pread backend.") + 14]
    assert said in _readme_troubleshooting()
