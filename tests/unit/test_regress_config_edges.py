"""Config edge cases: paths that are silently changed, TOML keys silently dropped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chm import Config
from chm.errors import InvalidArgument


def test_target_path_with_a_comma_stays_one_target(tmp_path: Path) -> None:
    # A list of paths is joined with "," and split again by the C core, so
    # one legal Linux path becomes two targets (the second one relative).
    path = str(tmp_path / "ssd,0.img")
    try:
        cfg = Config(targets=[path])
    except InvalidArgument:
        return  # refusing the path is acceptable; silently changing it is not
    assert cfg.targets == [path]


@pytest.mark.parametrize("option", ["targets", "pool_path"])
def test_path_with_nul_byte_is_rejected(tmp_path: Path, option: str) -> None:
    # The C string ends at the NUL: "/x/a\0b" silently becomes "/x/a".
    with pytest.raises(InvalidArgument):
        Config({option: str(tmp_path / "a\0b")})


def test_toml_top_level_keys_next_to_device_table_are_not_dropped(tmp_path: Path) -> None:
    p = tmp_path / "chm.toml"
    p.write_text('capacity = "1G"\n\n[device]\nbackend = "ghost"\n')
    try:
        cfg = Config.from_toml(p)
    except InvalidArgument:
        return  # an error naming the stray key is acceptable
    assert cfg.capacity == 1 << 30, "top-level capacity was silently ignored"


def test_toml_nested_array_in_targets_is_rejected(tmp_path: Path) -> None:
    # targets = [["/a"], "/b"] becomes the target "['/a']" (its Python repr).
    p = tmp_path / "chm.toml"
    p.write_text(f'targets = [["{tmp_path}/a"], "{tmp_path}/b"]\n')
    with pytest.raises(InvalidArgument):
        Config.from_toml(p)


def test_non_string_option_name_is_invalid_argument() -> None:
    # AttributeError: 'int' object has no attribute 'replace'
    with pytest.raises(InvalidArgument):
        Config({5: 1})  # type: ignore[dict-item]


def test_numpy_integer_option_values_are_accepted() -> None:
    # Sizes computed with numpy are np.int64/np.uint64, not int.
    assert Config(capacity=np.int64(1 << 30)).capacity == 1 << 30
    assert Config(slots=np.uint32(4)).slot_count == 4
