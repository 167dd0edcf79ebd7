"""CLI errors name the command's flags, not the device's option spellings.

The C core says "create=1 creates it" and "pass a smaller slot_size"; a
user of ``chm-emu serve`` typed ``--create`` and ``--slot-size``. The daemon
is started for real (in process, through click's runner) on a real missing
target and a real too-small dram; it refuses before it listens.
"""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

from chm_emu.cli import main
from chm_emu.flag_names import in_flags
from chm_emu.serve_cmd import serve


def _serve(tmp_path: Path, *args: str) -> str:
    r = CliRunner().invoke(
        main, ["serve", "--socket", str(tmp_path / "sock"), "--backend", "pread", *args]
    )
    assert r.exit_code == 2, r.output
    # the user's line (the JSON log line above it keeps the library's words)
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("chm-emu serve: ")]
    return line


def test_a_missing_target_names_the_create_flag(tmp_path: Path) -> None:
    target = tmp_path / "missing.img"
    out = _serve(tmp_path, "--target", str(target), "--capacity", "64M", "--no-kv")
    assert f"{target} does not exist (--create creates it" in out, out
    assert "create=1" not in out
    assert not target.exists()


def test_a_default_that_conflicts_names_the_flags(tmp_path: Path) -> None:
    target = tmp_path / "t.img"
    out = _serve(
        tmp_path, "--target", str(target), "--capacity", "64M", "--dram", "40M", "--create"
    )
    assert "default slot_size" in out, out
    assert "pass a smaller --slot-size" in out and "a larger --dram" in out, out
    # serve has no --wbuf: the option is named where it is set
    assert "wbuf (in the [device] table of --config)" in out, out
    assert not target.exists()


def test_in_flags_rewrites_only_what_the_command_has() -> None:
    @click.command()
    @click.option("--create", is_flag=True)
    @click.option("--slot-size")
    def cmd(create: bool, slot_size: str) -> None:
        pass

    assert in_flags("create=1 extends it", cmd) == "--create extends it"
    assert in_flags('use slot_size="8M"', cmd) == "use --slot-size 8M"
    assert in_flags("set slot_size=8M; raise slot_size", cmd) == (
        "set --slot-size 8M; raise --slot-size"
    )
    # no flag and no --config: left as the library says it
    assert in_flags("pass a smaller wbuf", cmd) == "pass a smaller wbuf"
    # words that merely contain an option name are not touched
    assert in_flags("recreate=1; slot_sizes", cmd) == "recreate=1; slot_sizes"
    # serve reads the rest from its config file
    assert in_flags("raise wbuf", serve) == "raise wbuf (in the [device] table of --config)"
