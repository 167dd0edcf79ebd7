"""Byte sizes as people write them: ``"64G"``, ``"256MiB"``, ``"1.5T"``.

All multiples are binary (K = 1024), as for memory and block devices. The
forms ``K``, ``KB``, ``KiB`` (any case) are equivalent; so are M, G, T, P.
"""

from __future__ import annotations

import operator
import re
from typing import SupportsIndex

from chm.errors import InvalidArgument

__all__ = ["UNITS", "format_size", "parse_size"]

UNITS: dict[str, int] = {
    "": 1,
    "K": 1 << 10,
    "M": 1 << 20,
    "G": 1 << 30,
    "T": 1 << 40,
    "P": 1 << 50,
}

_SIZE_RE = re.compile(
    r"""^\s*
    (?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)
    \s*
    (?P<unit>[kKmMgGtTpP]?)(?P<suffix>(?:[iI]?[bB])?)
    \s*$""",
    re.VERBOSE,
)

_UINT64_MAX = 2**64 - 1


def _bad(value: object, why: str) -> InvalidArgument:
    return InvalidArgument(None, f"invalid size {value!r}: {why}", call="parse_size")


def parse_size(value: SupportsIndex | str) -> int:
    """Returns the number of bytes that ``value`` names.

    Integers of any type (numpy's too) and whole floats pass through
    (negative ones are rejected; bools are not sizes). Strings are a number
    (decimals allowed when the result is a whole number of bytes) followed
    by an optional unit: K, M, G, T, P, each optionally followed by ``B`` or
    ``iB``. A plain ``B`` suffix means bytes. Raises InvalidArgument for
    anything else, for negative values and for values beyond 2**64-1.
    """
    v: object = value
    if isinstance(v, bool):
        raise _bad(v, "a bool is not a size")
    if isinstance(v, float):
        if not v.is_integer():
            raise _bad(v, "not a whole number of bytes")
        v = int(v)
    if not isinstance(v, str):
        try:
            n = operator.index(v)  # type: ignore[arg-type]
        except TypeError:
            raise _bad(v, f"expected int or str, got {type(v).__name__}") from None
        if n < 0:
            raise _bad(v, "negative")
        if n > _UINT64_MAX:
            raise _bad(v, "larger than 2**64-1")
        return n
    m = _SIZE_RE.match(v)
    if m is None:
        raise _bad(value, "expected a number with an optional K/M/G/T/P unit")
    unit = m.group("unit").upper()
    suffix = m.group("suffix").lower()
    if suffix == "ib" and not unit:
        raise _bad(value, "'iB' needs a unit (KiB, MiB, ...)")
    num = m.group("num")
    mult = UNITS[unit]
    if re.fullmatch(r"\d+", num):
        n = int(num) * mult
    else:
        # Exact decimal arithmetic: "1.5G" must be exactly 1.5 * 2**30.
        from fractions import Fraction

        frac = Fraction(num) * mult
        if frac.denominator != 1:
            raise _bad(value, "not a whole number of bytes")
        n = int(frac)
    if n > _UINT64_MAX:
        raise _bad(value, "larger than 2**64-1")
    return n


def format_size(n: int, *, exact: bool = True) -> str:
    """Formats a byte count.

    With ``exact`` (the default) the result parses back to ``n``: the largest
    unit that divides ``n`` (``"64G"``, ``"1536K"``, ``"4097"``). Otherwise a
    short human form with up to three significant digits (``"1.5 GiB"``).
    """
    v: object = n
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(v, "expected an int")
    n = int(v)
    if n < 0:
        raise _bad(n, "negative")
    if exact:
        for unit in ("P", "T", "G", "M", "K"):
            mult = UNITS[unit]
            if n and n % mult == 0:
                return f"{n // mult}{unit}"
        return str(n)
    for unit in ("P", "T", "G", "M", "K"):
        mult = UNITS[unit]
        if n >= mult:
            v = n / mult
            text = f"{v:.3g}" if v < 1000 else f"{v:.0f}"
            return f"{text} {unit}iB"
    return f"{n} B"
