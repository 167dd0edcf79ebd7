"""Byte sizes as people write them: ``"64G"``, ``"256MiB"``, ``"1.5G"``.

All multiples are binary (K = 1024), as for memory and block devices. The
forms ``K``, ``KB``, ``KiB`` (any case) are equivalent; so are M, G, T, P.
Strings are parsed by the C core (``chm_parse_size``), the same parser
every size option of :class:`chm.Config` uses, so the two accept and refuse
exactly the same text.
"""

from __future__ import annotations

import operator
from typing import SupportsIndex

from chm import _lowlevel as _ll
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

_UINT64_MAX = 2**64 - 1


def _bad(value: object, why: str) -> InvalidArgument:
    return InvalidArgument(None, f"invalid size {value!r}: {why}", call="parse_size", detail=why)


def parse_size(value: SupportsIndex | str) -> int:
    """Returns the number of bytes that ``value`` names.

    Integers of any type (numpy's too) and whole floats pass through
    (negative ones are rejected; bools are not sizes). Strings follow the
    one size grammar of the C core (``chm_parse_size``, also every size
    option of :class:`chm.Config`): digits with an optional fraction (the
    result a whole number of bytes), then an optional unit K, M, G, T or P
    (any case), optionally followed by ``B`` or ``iB``, or a plain ``B``.
    Nothing else: no whitespace, sign, exponent or ``0x``. Raises
    InvalidArgument, with the reason, for anything else, for negative
    values and for values beyond 2**64-1.
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
    try:
        return _ll.parse_size(v)
    except InvalidArgument as exc:
        raise _bad(value, exc.detail or "not a size") from None


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
