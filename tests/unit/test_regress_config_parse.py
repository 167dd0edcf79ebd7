"""The C option parser (csrc/config.c) against a reference parser written here.

strtoull() skips leading whitespace and accepts a sign, so ``" -1"`` became
2**64-1 and ``" -18446744073709551615"`` became 1; a leading ``0`` switched to
octal. The grammar the parser must follow, and nothing more:

- unsigned: ``0``, a decimal without leading zeros, or ``0x`` + hex digits,
  within the field's width;
- signed: the same, optionally after one ``-``, within int32;
- size: digits with an optional fraction, then an optional K/M/G/T/P unit
  (optionally followed by ``B``/``iB``) or a plain ``B``; a whole number of
  bytes below 2**64.

Nothing else: no whitespace anywhere, no ``+``, no exponent, no hex float.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from chm import Config
from chm import _lowlevel as _ll
from chm.errors import InvalidArgument

# (option, field path in the struct, bits, signed)
UINT_OPTIONS = [
    ("queue_depth", ("queue_depth",), 32),
    ("refill_queue", ("refill_queue",), 32),
    ("ssd_read_lat_ns", ("timing", "ssd_read_lat_ns"), 64),
    ("link_lat_ns", ("timing", "link_lat_ns"), 64),
]
SIZE_OPTIONS = [
    ("capacity", ("capacity",)),
    ("link_bw_bps", ("timing", "link_bw_bps")),
]

_UINT = re.compile(r"(0|[1-9][0-9]*)|0[xX]([0-9a-fA-F]+)")
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]*)?)(?:([kKmMgGtTpP])(?:[iI]?[bB])?|[bB])?")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def ref_uint(text: str, bits: int) -> int | None:
    """The value the device must store, or None when it must refuse."""
    m = _UINT.fullmatch(text)
    if m is None:
        return None
    v = int(m.group(1)) if m.group(1) is not None else int(m.group(2), 16)
    return v if v < 1 << bits else None


def ref_int32(text: str) -> int | None:
    neg = text.startswith("-")
    v = ref_uint(text[1:] if neg else text, 64)
    if v is None:
        return None
    v = -v if neg else v
    return v if -(2**31) <= v < 2**31 else None


def ref_size(text: str) -> int | None:
    m = _SIZE.fullmatch(text)
    if m is None:
        return None
    unit = (m.group(2) or "").lower()
    v = Fraction(m.group(1)) * _UNITS[unit]
    if v.denominator != 1 or v >= 2**64:
        return None
    return int(v)


def _field(cfg: Any, path: tuple[str, ...]) -> int:
    d: Any = _ll.config_to_dict(cfg)
    for key in path:
        d = d[key]
    return int(d)


def _device_parse(option: str, path: tuple[str, ...], text: str) -> int | None:
    cfg = _ll.config_new()
    try:
        _ll.config_set(cfg, option, text)
    except InvalidArgument:
        return None
    return _field(cfg, path)


# ---- the reported inputs (all accepted by the old parser)


@pytest.mark.parametrize(
    ("option", "text"),
    [
        ("ssd_read_lat_ns", " -1"),  # was 2**64-1
        ("queue_depth", " -18446744073709551615"),  # was 1
        ("queue_depth", "-0"),
        ("queue_depth", "\t8"),
        ("queue_depth", "\n8"),
        ("queue_depth", "+8"),
        ("queue_depth", " +8"),
        ("queue_depth", "010"),  # was octal 8
        ("refill_queue", "0x-1"),
        ("numa_node", " -1"),
        ("numa_node", "+0"),
        ("numa_node", "010"),
        ("capacity", " 1G"),
        ("capacity", "+1G"),
        ("capacity", "1e9"),
        ("capacity", "0x1p30"),
    ],
)
def test_whitespace_signs_and_radix_tricks_are_refused(option: str, text: str) -> None:
    cfg = _ll.config_new()
    with pytest.raises(InvalidArgument) as info:
        _ll.config_set(cfg, option, text)
    # the reason names the option and quotes the value
    assert option in str(info.value.detail)
    assert f"'{text}'" in str(info.value.detail)


def test_config_error_names_option_and_value() -> None:
    with pytest.raises(InvalidArgument) as info:
        Config(ssd_read_lat_ns=" -1")
    msg = str(info.value)
    assert "ssd_read_lat_ns" in msg and "' -1'" in msg


def test_nul_inside_a_value_is_refused_not_truncated() -> None:
    # "8\0junk" would reach C as "8"
    cfg = _ll.config_new()
    with pytest.raises(InvalidArgument):
        _ll.config_set(cfg, "queue_depth", "8\0junk")


def test_accepted_forms_still_parse() -> None:
    cfg = _ll.config_new()
    for text, want in [("0", 0), ("4096", 4096), ("0x10", 16), ("0XfF", 255)]:
        _ll.config_set(cfg, "refill_queue", text)
        assert int(cfg.refill_queue) == want
    _ll.config_set(cfg, "numa_node", "-1")
    assert int(cfg.numa_node) == -1
    _ll.config_set(cfg, "ssd_read_lat_ns", "18446744073709551615")
    assert int(cfg.timing.ssd_read_lat_ns) == 2**64 - 1
    with pytest.raises(InvalidArgument):
        _ll.config_set(cfg, "ssd_read_lat_ns", "18446744073709551616")


# ---- fuzz: the device parser equals the reference on any text

_NUMERIC = st.text(alphabet=" \t\n\v\f\r+-.0123456789xXabcdefABCDEFkKmMgGtTpPiIbBeE", max_size=24)
_TEXT = st.one_of(_NUMERIC, st.text(max_size=24).filter(lambda s: "\0" not in s))


@pytest.mark.parametrize(("option", "path", "bits"), UINT_OPTIONS)
@given(text=_TEXT)
@example(text=" -1")
@example(text="4294967296")
@example(text="0x100000000")
@example(text="00")
def test_fuzz_uint(option: str, path: tuple[str, ...], bits: int, text: str) -> None:
    assert _device_parse(option, path, text) == ref_uint(text, bits), repr(text)


@given(text=_TEXT)
@example(text="-2147483648")
@example(text="-2147483649")
@example(text="2147483648")
@example(text="-0x1")
@example(text="--1")
def test_fuzz_int(text: str) -> None:
    assert _device_parse("numa_node", ("numa_node",), text) == ref_int32(text), repr(text)


@pytest.mark.parametrize(("option", "path"), SIZE_OPTIONS)
@given(text=_TEXT)
@example(text=" 1")
@example(text="1.5G")
@example(text="4KiB")
@example(text="16MB")
@example(text="1.")
@example(text="16384P")
@example(text="0.5")
def test_fuzz_size(option: str, path: tuple[str, ...], text: str) -> None:
    assert _device_parse(option, path, text) == ref_size(text), repr(text)
