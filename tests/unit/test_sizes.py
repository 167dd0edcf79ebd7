"""chm.sizes: parse_size / format_size, and agreement with the C parser."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from chm import Config, _lowlevel
from chm.errors import InvalidArgument
from chm.sizes import UNITS, format_size, parse_size

K, M, G, T, P = (UNITS[u] for u in "KMGTP")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("4096", 4096),
        ("512B", 512),
        ("1K", K),
        ("1k", K),
        ("1KB", K),
        ("1KiB", K),
        ("1kib", K),
        ("64G", 64 * G),
        ("64GiB", 64 * G),
        ("256M", 256 * M),
        ("256MB", 256 * M),
        ("2T", 2 * T),
        ("1P", P),
        ("1.5G", 3 * G // 2),
        ("0.5K", 512),
        ("16777216", 16 * M),
        ("512b", 512),
        ("1.5", None),
        ("15E", None),
    ],
)
def test_parse_examples(text: str, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(InvalidArgument):
            parse_size(text)
    else:
        assert parse_size(text) == expected


@pytest.mark.parametrize("value", [0, 1, 4096, 2**64 - 1])
def test_ints_pass_through(value: int) -> None:
    assert parse_size(value) == value


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ",
        "G",
        "-1",
        "-1G",
        "1X",
        "1GG",
        "1 G B",
        "iB",
        "5iB",
        "1.2.3",
        "0.3K",  # 307.2 bytes
        "1.0000001",
        "abc",
        "16M!",
        "0x10",  # hex is for integer options, not sizes (the C grammar)
        " 16M ",  # no whitespace, as chm_config_set
        "16 M",
        "1e3",  # no exponent
        "+1G",
        "1e400",
        "17000000P",  # > 2**64 - 1
        -1,
        2**64,
        True,
        1.5,
        None,
        [1],
        b"1G",
    ],
)
def test_parse_rejects(bad: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_size(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    assert "size" in str(info.value)


def test_float_whole_number_passes() -> None:
    assert parse_size(4096.0) == 4096  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (1, "1"),
        (4097, "4097"),
        (K, "1K"),
        (1536 * K, "1536K"),
        (64 * G, "64G"),
        (3 * T, "3T"),
        (2 * P, "2P"),
        (1024 * P, "1024P"),
    ],
)
def test_format_exact(n: int, text: str) -> None:
    assert format_size(n) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (K, "1 KiB"),
        (3 * G // 2, "1.5 GiB"),
        (64 * G, "64 GiB"),
        (1000 * M, "1000 MiB"),
    ],
)
def test_format_human(n: int, text: str) -> None:
    assert format_size(n, exact=False) == text


@pytest.mark.parametrize("bad", [-1, 1.5, "1K", True])
def test_format_rejects(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        format_size(bad)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_format_parse_round_trip(n: int) -> None:
    assert parse_size(format_size(n)) == n


@given(
    st.integers(min_value=0, max_value=2**20),
    st.sampled_from(["", "K", "M", "G", "T"]),
    st.sampled_from(["", "B", "iB"]),
    st.sampled_from(["", "0", "25", "5", "75", "125"]),
)
def test_python_and_c_parsers_agree_on_sizes(
    mantissa: int, unit: str, suffix: str, frac: str
) -> None:
    """The Python parser must accept exactly what chm_config_set() accepts."""
    if suffix == "iB" and not unit:
        suffix = ""
    text = f"{mantissa}{'.' + frac if frac else ''}{unit}{suffix}"
    try:
        py: int | None = parse_size(text)
    except InvalidArgument:
        py = None
    cfg = _lowlevel.config_new()
    try:
        _lowlevel.config_set(cfg, "capacity", text)
        c: int | None = int(cfg.capacity)
    except InvalidArgument:
        c = None
    assert py == c, text


_SIZE_ALPHABET = " \t+-.0123456789xXeEkKmMgGtTpPiIbB"


@given(st.one_of(st.text(alphabet=_SIZE_ALPHABET, max_size=16), st.text(max_size=12)))
@example("0x10")
@example(" 16M")
@example("1e3")
@example("1.5G")
@example("18446744073709551616")
def test_parse_size_and_config_agree_on_any_text(text: str) -> None:
    """chm.parse_size and Config(capacity=...) are one grammar: the same
    strings accepted (with the same value) and refused."""
    try:
        py: int | None = parse_size(text)
    except InvalidArgument:
        py = None
    try:
        # a size option of Config, read back by its option name
        c: int | None = Config(link_bw_bps=text)["link_bw_bps"]
    except InvalidArgument:
        c = None
    assert py == c, repr(text)


def test_refusal_says_why() -> None:
    with pytest.raises(InvalidArgument, match="not a whole number of bytes"):
        parse_size("0.3K")
    with pytest.raises(InvalidArgument, match="after the number"):
        parse_size("0x10")
    with pytest.raises(InvalidArgument, match="capacity: '0x10' is not a size"):
        Config(capacity="0x10")
