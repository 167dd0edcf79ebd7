"""chm-emu: a bad option value is a clean click error, not a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from chm_emu.cli import main


@pytest.mark.parametrize("size", ["abc", "-4K"])
def test_demo_unparsable_object_size_is_a_usage_error(size: str) -> None:
    # parse_size's InvalidArgument escapes as a traceback (exit 1), unlike
    # "--object-size 1.5K", which is a usage error (exit 2).
    r = CliRunner().invoke(main, ["demo", "--backend", "pread", "--object-size", size])
    assert r.exit_code == 2, (r.exit_code, repr(r.exception), r.output[-500:])
    assert "--object-size" in r.output


def test_demo_oversized_object_size_is_a_clean_error() -> None:
    # ftruncate() of the sparse file fails with EFBIG: an OSError traceback.
    r = CliRunner().invoke(main, ["demo", "--backend", "pread", "--object-size", "2P"])
    assert r.exit_code != 0
    assert isinstance(r.exception, SystemExit), repr(r.exception)
