"""Build-time only: compiles the C core and its cffi binding (API mode).

The declarations are cut from the CFFI region of include/chm.h, so the binding
cannot drift from the header. Every csrc/*.c is compiled into the extension.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "include"
CSRC = ROOT / "csrc"
HEADER = INCLUDE / "chm.h"

BEGIN = "/* CFFI_BEGIN */"
END = "/* CFFI_END */"

# Compiled with -Werror as the C core is everywhere; the glue that cffi
# generates is kept out of -Wextra's parameter/initializer checks.
# "-D_GNU_SOURCE=" (empty) is identical to a source's own "#define _GNU_SOURCE".
CFLAGS = ["-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE="]
LIBRARIES = ["uring", "numa", "pthread"]

# (header, what it is, Debian package)
REQUIRED_HEADERS = [
    ("liburing.h", "liburing headers", "liburing-dev"),
    ("numaif.h", "libnuma headers", "libnuma-dev"),
    ("numa.h", "libnuma headers", "libnuma-dev"),
]

GLUE_PRELUDE = """\
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include "chm.h"
"""


def _fail(msg: str) -> None:
    raise SystemExit(f"chm: {msg}")


def cdef_text() -> str:
    text = HEADER.read_text()
    try:
        start = text.index(BEGIN) + len(BEGIN)
        stop = text.index(END, start)
    except ValueError:
        _fail(f"{HEADER} lacks the {BEGIN} ... {END} region")
    return text[start:stop]


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = cc.split()
    if shutil.which(argv[0]) is None:
        for alt in ("cc", "gcc"):
            if shutil.which(alt):
                return [alt]
        _fail("C compiler not found: apt-get install gcc")
    return argv


def check_system() -> None:
    """Fails with one line naming the Debian package when something is missing."""
    cc = _compiler()
    for header, what, pkg in REQUIRED_HEADERS:
        proc = subprocess.run(
            [*cc, "-E", "-x", "c", "-", "-o", os.devnull],
            input=f"#include <{header}>\n",
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            _fail(f"{what} not found: apt-get install {pkg}")
    pyinc = sysconfig.get_paths().get("include", "")
    if not (Path(pyinc) / "Python.h").exists():
        _fail("Python headers not found: apt-get install python3-dev")
    with tempfile.TemporaryDirectory(prefix="chm-build-") as tmp:
        src = Path(tmp) / "t.c"
        src.write_text("int main(void) { return 0; }\n")
        for lib, pkg in (("uring", "liburing-dev"), ("numa", "libnuma-dev")):
            proc = subprocess.run(
                [*cc, str(src), "-o", str(Path(tmp) / "t"), f"-l{lib}"],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                _fail(f"lib{lib} not found by the linker: apt-get install {pkg}")


def _sources() -> list[str]:
    found = sorted(CSRC.glob("*.c"))
    if not found:
        _fail(f"no C sources in {CSRC}")
    cwd = Path.cwd().resolve()
    out = []
    for p in found:
        # setuptools prefers paths relative to setup.py's directory
        try:
            out.append(str(p.relative_to(cwd)))
        except ValueError:
            out.append(str(p))
    return out


def make_builder() -> FFI:
    builder = FFI()
    builder.cdef(cdef_text())
    builder.set_source(
        "chm._chm_cffi",
        GLUE_PRELUDE,
        sources=_sources(),
        include_dirs=[str(INCLUDE), str(CSRC)],
        libraries=LIBRARIES,
        extra_compile_args=CFLAGS,
    )
    return builder


if (
    "sdist" not in sys.argv
    and "egg_info" not in sys.argv
    and not os.environ.get("CHM_SKIP_SYSTEM_CHECK")
):
    check_system()

ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(ROOT), verbose=True)
