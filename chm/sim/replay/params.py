"""Printing and overriding the parameters of a model (a frozen dataclass).

Every parameter class of :mod:`chm.sim.replay` declares its fields with
:func:`param`, giving a unit and a meaning (presets say where their numbers come from
in a ``note`` field), so a replay
can print exactly what it assumed and a user can change any of it by name
(``"bandwidth_Bps=12.5e9"``, ``"capacity_bytes=64G"``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from chm.errors import InvalidArgument
from chm.sizes import format_size, parse_size

__all__ = [
    "ParamRow",
    "apply_overrides",
    "param",
    "param_rows",
    "parse_overrides",
    "split_scoped",
]

T = TypeVar("T")

ParamRow = tuple[str, str, str, str]  # name, value, unit, meaning


def param(default: Any, unit: str, meaning: str = "") -> Any:
    """A dataclass field with a unit ("bytes", "B/s", "s", "FLOP/s", "", ...) and a meaning."""
    return dataclasses.field(default=default, metadata={"unit": unit, "meaning": meaning})


def _format(value: object, unit: str) -> str:
    if unit == "bytes" and isinstance(value, int):
        return f"{value} ({format_size(value, exact=False)})"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def param_rows(obj: object) -> list[ParamRow]:
    """(name, value, unit, meaning) of every field of the dataclass ``obj``."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"expected a dataclass instance, got {type(obj).__name__}")
    rows: list[ParamRow] = []
    for f in dataclasses.fields(obj):
        unit = str(f.metadata.get("unit", ""))
        rows.append(
            (f.name, _format(getattr(obj, f.name), unit), unit, str(f.metadata.get("meaning", "")))
        )
    return rows


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b=2G"]`` -> ``{"a": "1", "b": "2G"}``; a malformed item is a ValueError."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"override {item!r}: expected NAME=VALUE")
        out[name.strip()] = value.strip()
    return out


def split_scoped(items: Iterable[str], scopes: Iterable[str]) -> dict[str, dict[str, str]]:
    """``["gpu.mfu=0.4", "fs-ssd.tier.latency_s=1e-4"]`` -> overrides per scope.

    A scope is the longest of ``scopes`` that the name starts with (followed
    by a dot); ``{"gpu": {"mfu": "0.4"}, "fs-ssd.tier": {"latency_s": "1e-4"}}``.
    An item naming no known scope is a ValueError that lists them.
    """
    known = sorted(scopes, key=len, reverse=True)
    out: dict[str, dict[str, str]] = {}
    for item in items:
        name, value = next(iter(parse_overrides([item]).items()))
        scope = next((s for s in known if name.startswith(s + ".")), None)
        if scope is None or len(name) == len(scope) + 1:
            raise ValueError(
                f"override {item!r}: expected SCOPE.NAME=VALUE with SCOPE one of "
                f"{', '.join(sorted(known))}"
            )
        out.setdefault(scope, {})[name[len(scope) + 1 :]] = value
    return out


def _convert(owner: str, name: str, current: object, unit: str, text: str) -> object:
    where = f"{owner}.{name}={text!r}"
    if isinstance(current, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{where}: expected true or false")
    if isinstance(current, int):
        if unit == "bytes":
            try:
                return parse_size(text)
            except InvalidArgument as exc:
                raise ValueError(f"{where}: {exc.strerror}") from None
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{where}: expected an integer") from None
    if isinstance(current, float):
        try:
            v = float(text)
        except ValueError:
            raise ValueError(f"{where}: expected a number") from None
        if not math.isfinite(v):
            raise ValueError(f"{where}: expected a finite number")
        return v
    if isinstance(current, str):
        return text
    raise ValueError(f"{where}: parameter of type {type(current).__name__} cannot be set")


def apply_overrides(obj: T, overrides: Mapping[str, str]) -> T:
    """A copy of the dataclass ``obj`` with the named fields parsed from text.

    Sizes accept units (``64G``); an unknown name or a value that does not
    parse is a ValueError naming the class, the field and the value. The
    class's own validation (``__post_init__``) runs on the result.
    """
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"expected a dataclass instance, got {type(obj).__name__}")
    owner = type(obj).__name__
    fields = {f.name: f for f in dataclasses.fields(obj)}
    changes: dict[str, object] = {}
    for name, text in overrides.items():
        f = fields.get(name)
        if f is None:
            raise ValueError(
                f"{owner} has no parameter {name!r} (it has: {', '.join(sorted(fields))})"
            )
        changes[name] = _convert(
            owner, name, getattr(obj, name), str(f.metadata.get("unit", "")), text
        )
    return dataclasses.replace(obj, **changes)
