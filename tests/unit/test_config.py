"""chm.config: options declared in C, set by name, validated with reasons."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import chm
from chm import _lowlevel
from chm.config import Config, option_names, options
from chm.errors import InvalidArgument, NotFound
from chm_emu.cli import main as cli_main

CORE_OPTIONS = {"capacity", "targets", "backend", "mode", "dram", "slot_size", "timing"}


def test_options_listed_from_c() -> None:
    opts = options()
    names = [o.name for o in opts]
    assert set(names) >= CORE_OPTIONS
    assert len(names) == len(set(names)), "option names must be unique"
    for o in opts:
        assert o.name and o.help, o
        assert o.type in {"size", "uint", "int", "str", "enum", "path", "targets", "preset"}, o
    # the list is exactly what chm_config_option() enumerates, ending in NotFound
    for idx, o in enumerate(opts):
        assert _lowlevel.config_option(idx).name == o.name
    with pytest.raises(NotFound):
        _lowlevel.config_option(len(opts))


def test_defaults_match_declared_defaults() -> None:
    cfg = Config()
    by_name = {o.name: o for o in options()}
    assert cfg.capacity == chm.parse_size(by_name["capacity"].default)
    assert cfg.backend == by_name["backend"].default
    assert cfg.mode == by_name["mode"].default


def test_set_by_keyword() -> None:
    cfg = Config(capacity="1G", backend="ghost", mode="lru", dram=64 << 20, create=False)
    assert cfg.capacity == 1 << 30
    assert cfg.backend == "ghost"
    assert cfg.mode == "lru"
    assert cfg.dram_bytes == 64 << 20
    d = cfg.to_dict()
    assert d["create"] == 0
    assert cfg.explicit["backend"] == "ghost"


def test_sizes_accept_python_forms() -> None:
    assert Config(capacity="1.5G").capacity == 3 << 29
    assert Config(capacity="2GiB").capacity == 2 << 30
    assert Config(capacity=4096 * 1000).capacity == 4096 * 1000
    assert Config(capacity=float(1 << 30)).capacity == 1 << 30


def test_targets_list_and_single(tmp_path: Path) -> None:
    a, b = tmp_path / "a.img", tmp_path / "b.img"
    cfg = Config(targets=[a, str(b)])
    assert cfg.targets == [str(a), str(b)]
    assert cfg.to_dict()["n_targets"] == 2
    assert Config(targets=str(a)).targets == [str(a)]


def test_dash_names_are_accepted() -> None:
    cfg = Config(**{"queue-depth": 8})
    assert cfg["queue_depth"] == 8


def test_unknown_key_lists_valid_names() -> None:
    with pytest.raises(InvalidArgument) as info:
        Config(capacty="1G")
    err = info.value
    assert isinstance(err, ValueError)
    assert "capacty" in str(err)
    for name in ("capacity", "backend", "mode"):
        assert name in str(err)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("capacity", "lots", "capacity"),
        ("capacity", "-1G", "capacity"),
        ("backend", "floppy", "floppy"),
        ("mode", "writeback", "writeback"),
        ("queue_depth", "many", "queue_depth"),
        ("timing", "warp-speed", "warp-speed"),
    ],
)
def test_bad_value_gives_reason(key: str, value: str, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        Config(**{key: value})
    msg = str(info.value)
    assert fragment in msg
    assert key in msg
    assert info.value.errno == 22


def test_unsupported_value_type() -> None:
    with pytest.raises(InvalidArgument):
        Config(capacity={"a": 1})


def test_validate_reports_reason() -> None:
    cfg = Config(dram="64M", wbuf="32M", slot_size="64M")
    with pytest.raises(InvalidArgument) as info:
        cfg.validate()
    assert "invalid configuration" in str(info.value)
    assert info.value.detail


def test_validate_accepts_defaults_with_target(tmp_path: Path) -> None:
    Config(targets=[tmp_path / "x.img"]).validate()


def test_timing_preset_sets_fields() -> None:
    base = Config().to_dict()["timing"]
    tuned = Config(timing="gen5-tlc-200g").to_dict()["timing"]
    assert tuned != base
    assert tuned["ssd_read_bw_bps"] > 0
    assert _lowlevel.timing_preset("gen5-tlc-200g") == tuned
    with pytest.raises(NotFound):
        _lowlevel.timing_preset("warp-speed")


def test_from_toml(tmp_path: Path) -> None:
    p = tmp_path / "dev.toml"
    p.write_text(
        '[device]\ncapacity = "2G"\nbackend = "ghost"\nqueue_depth = 16\n'
        f'targets = ["{tmp_path / "t0.img"}", "{tmp_path / "t1.img"}"]\n'
    )
    cfg = Config.from_toml(p, mode="lru")
    assert cfg.capacity == 2 << 30
    assert cfg.backend == "ghost"
    assert cfg.mode == "lru"
    assert cfg["queue_depth"] == 16
    assert len(cfg.targets) == 2

    flat = tmp_path / "flat.toml"
    flat.write_text('capacity = "1G"\ncreate = false\n')
    cfg2 = Config.from_toml(flat)
    assert cfg2.capacity == 1 << 30
    assert cfg2["create"] == 0

    bad = tmp_path / "bad.toml"
    bad.write_text('capacity = "1G"\nturbo = true\n')
    with pytest.raises(InvalidArgument, match="turbo"):
        Config.from_toml(bad)


def test_copy_and_equality() -> None:
    a = Config(capacity="1G")
    b = a.copy()
    assert a == b
    b.set("capacity", "2G")
    assert a != b
    assert a.capacity == 1 << 30


def test_option_names_helper() -> None:
    assert option_names() == [o.name for o in options()]


def test_cli_options_lists_every_option() -> None:
    result = CliRunner().invoke(cli_main, ["options", "--plain"])
    assert result.exit_code == 0, result.output
    listed = [line.split("\t")[0] for line in result.output.splitlines() if line]
    assert listed == option_names()


def test_cli_version() -> None:
    result = CliRunner().invoke(cli_main, ["version"])
    assert result.exit_code == 0
    assert chm.version() in result.output
