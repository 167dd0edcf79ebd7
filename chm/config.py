"""Device configuration, built option by option through the C core.

Option names, types, defaults and help are declared once, in the C core
(``chm_config_option()``); this module only forwards ``key=value`` pairs to
``chm_config_set()`` and surfaces its one-line reasons. Sizes may be given as
ints or strings such as ``"64G"``; enums by name (``backend="ghost"``);
``targets`` as a path or a list of paths; ``timing`` as a preset name.
"""

from __future__ import annotations

import numbers
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chm import _lowlevel as _ll
from chm.errors import InvalidArgument, NotFound
from chm.sizes import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Config", "OptionInfo", "option_names", "options"]


@dataclass(frozen=True)
class OptionInfo:
    """One configuration option: its name, type, default (text) and help."""

    name: str
    type: str
    default: str
    help: str


_OPTIONS: list[OptionInfo] | None = None


def options() -> list[OptionInfo]:
    """Every option the device understands, in declaration order."""
    global _OPTIONS
    if _OPTIONS is None:
        _OPTIONS = [OptionInfo(*o) for o in _ll.config_options()]
    return list(_OPTIONS)


def option_names() -> list[str]:
    """The valid option names."""
    return [o.name for o in options()]


def _option_types() -> dict[str, str]:
    return {o.name: o.type for o in options()}


_ENUM_FIELDS = {
    "backend": _ll.BACKENDS,
    "mode": _ll.MODES,
    "pool_kind": _ll.POOL_KINDS,
    "clock": _ll.CLOCKS,
}


def _name_of(table: dict[str, int], value: int) -> str | int:
    """The C core's name of an enum value (chm_enum_name), or the number."""
    name = _ll.name_of(table, value)
    return value if name is None else name


def _bad_value(key: str, value: Any, why: str) -> InvalidArgument:
    return InvalidArgument(
        None, f"option {key}={value!r}: {why}", call="chm_config_set", detail=why
    )


def _path_text(key: str, value: Any) -> str:
    """One path as text: no NUL (C would cut the string there)."""
    text = value if isinstance(value, str) else os.fsdecode(value)
    if "\0" in text:
        raise _bad_value(key, value, "contains a NUL byte")
    return text


def _targets_text(key: str, value: Any) -> str:
    """The comma-separated list the C core splits; each path must survive it."""
    if isinstance(value, str):
        return _path_text(key, value)  # already the C list form
    items = [value] if isinstance(value, (bytes, os.PathLike)) else value
    if not isinstance(items, (list, tuple)):
        raise _bad_value(key, value, "expected a path or a list of paths")
    paths: list[str] = []
    for item in items:
        if not isinstance(item, (str, bytes, os.PathLike)):
            raise _bad_value(key, value, f"each target must be a path, got {type(item).__name__}")
        path = _path_text(key, item)
        if not path:
            raise _bad_value(key, value, "empty path in list")
        if "," in path:
            raise _bad_value(
                key,
                value,
                f"path {path!r} contains ',', which separates targets; "
                "use a name (or a symlink) without one",
            )
        paths.append(path)
    return ",".join(paths)


def _to_text(key: str, value: Any, kind: str | None) -> str:
    """The text form chm_config_set() parses."""
    if kind == "targets":
        return _targets_text(key, value)
    if isinstance(value, bool):
        if kind != "uint":
            raise _bad_value(key, value, f"a bool is not a valid {kind or 'value'}")
        return "1" if value else "0"
    if isinstance(value, (str, bytes, os.PathLike)):
        # sizes too: chm_config_set parses them with chm_parse_size, the
        # parser of chm.parse_size, and gives its own reason
        return _path_text(key, value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if kind == "size" and isinstance(value, numbers.Integral):
        try:
            return str(parse_size(value))
        except InvalidArgument as exc:
            raise _bad_value(key, value, str(exc.strerror)) from None
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, float):
        return str(value)  # the device gives its own reason
    raise InvalidArgument(
        None,
        f"option {key}: unsupported value type {type(value).__name__}",
        call="chm_config_set",
    )


class Config:
    """A ``struct chm_config``: device defaults plus the options set on it.

    ``Config(capacity="1T", backend="ghost")`` applies each keyword through
    ``chm_config_set()``; unknown names and bad values raise InvalidArgument
    naming the option and the reason. ``validate()`` checks the whole set.
    """

    __slots__ = ("_cfg", "_set")

    def __init__(self, options: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        self._cfg = _ll.config_new()
        self._set: dict[str, Any] = {}
        if options:
            self.update(options)
        if kwargs:
            self.update(kwargs)

    # ---- building

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], /, **overrides: Any) -> Config:
        """Reads options from a TOML file.

        Keys may sit at the top level, in a ``[device]`` table, or both; an
        option given in both places raises InvalidArgument. A nested table
        ``[t]`` with key ``k`` is passed as option ``t.k``. Keyword arguments
        override the file.
        """
        with open(path, "rb") as f:
            data = tomllib.load(f)
        device = data.pop("device", None) if isinstance(data.get("device"), dict) else None
        items = dict(_flatten(data))
        if device is not None:
            seen = {_canonical(k): k for k in items}
            for key, value in _flatten(device):
                if _canonical(key) in seen:
                    raise InvalidArgument(
                        None,
                        f"{os.fspath(path)}: option {key!r} is set both at the top level "
                        f"({seen[_canonical(key)]!r}) and in [device]",
                        call="Config.from_toml",
                        detail=f"option {key!r} set twice",
                    )
                items[key] = value
        cfg = cls(items)
        if overrides:
            cfg.update(overrides)
        return cfg

    @classmethod
    def _from_cdata(cls, cdata: _ll.CData) -> Config:
        self = cls.__new__(cls)
        self._cfg = cdata
        self._set = {}
        return self

    def update(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Config:
        """Sets several options; returns self."""
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        # object_size first: it sizes slot_size and wbuf from their defaults,
        # so sizes given beside it win whatever their order
        pairs.sort(key=lambda kv: kv[0] != "object_size")
        for key, value in pairs:
            self.set(key, value)
        return self

    def set(self, key: str, value: Any) -> Config:
        """Sets one option by name; returns self."""
        if not isinstance(key, str):
            raise InvalidArgument(
                None,
                f"option names are strings, got {key!r} ({type(key).__name__})",
                call="chm_config_set",
                detail=f"option name {key!r} is not a string",
            )
        if value is None:
            return self
        types = _option_types()
        name = key if key in types else _canonical(key)
        if name not in types:
            raise InvalidArgument(
                None,
                f"unknown option {key!r}; valid options: {', '.join(types)}",
                call="chm_config_set",
                detail=f"unknown option {key!r}",
            )
        if name == "backend" and isinstance(value, str) and value == "auto":
            # unset: chosen when the device opens (chm.backend)
            _ll.config_set(self._cfg, name, "uring")
            self._set.pop(name, None)
            return self
        text = _to_text(name, value, types[name])
        try:
            _ll.config_set(self._cfg, name, text)
        except NotFound as exc:  # the C side disagrees with its own list
            raise InvalidArgument(
                None, f"unknown option {key!r}: {exc.strerror}", call="chm_config_set"
            ) from None
        except InvalidArgument as exc:
            reason = exc.detail or exc.strerror
            raise InvalidArgument(
                None, f"option {name}={text!r}: {reason}", call="chm_config_set", detail=reason
            ) from None
        self._set[name] = value
        return self

    def validate(self) -> Config:
        """Checks the whole configuration (InvalidArgument with the reason)."""
        try:
            _ll.config_validate(self._cfg)
        except InvalidArgument as exc:
            reason = exc.detail or exc.strerror
            raise InvalidArgument(
                None,
                f"invalid configuration: {reason}",
                call="chm_config_validate",
                detail=reason,
            ) from None
        return self

    def copy(self) -> Config:
        new = Config._from_cdata(_ll.config_copy(self._cfg))
        new._set = dict(self._set)
        return new

    # ---- reading

    @property
    def cdata(self) -> _ll.CData:
        """The underlying ``struct chm_config *`` (for chm internals)."""
        return self._cfg

    @property
    def explicit(self) -> dict[str, Any]:
        """The options set on this object, by option name."""
        return dict(self._set)

    def to_dict(self) -> dict[str, Any]:
        """Every field of the struct, enums by name, targets as a list."""
        d = _ll.config_to_dict(self._cfg)
        for field, table in _ENUM_FIELDS.items():
            if field in d:
                d[field] = _name_of(table, int(d[field]))
        return d

    def get(self, key: str, default: Any = None) -> Any:
        """``self[key]``, or ``default`` for an unknown key."""
        try:
            return self[key]
        except KeyError:
            return default

    def __getitem__(self, key: str) -> Any:
        """The value of an option, by the name it is set with (``cfg["dram"]``,
        ``cfg["slot-size"]``), read back through ``chm_config_get()``: sizes
        and integers as ints, enums by name, ``targets`` as a list,
        ``timing`` as the name of the preset its fields equal (or
        ``"custom"``). A field of ``struct chm_config`` (``cfg["dram_bytes"]``,
        see :meth:`to_dict`) works too. An unknown key raises KeyError naming
        the options."""
        if not isinstance(key, str):
            raise KeyError(key)
        types = _option_types()
        name = key if key in types else _canonical(key)
        if name in types:
            text = _ll.config_get(self._cfg, name)
            kind = types[name]
            if kind in ("size", "uint", "int"):
                return int(text)
            if kind == "targets":
                return text.split(",") if text else []
            return text
        d = self.to_dict()
        if key in d:
            return d[key]
        raise KeyError(f"{key!r} is not an option; options: {', '.join(types)}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    @property
    def capacity(self) -> int:
        return int(self._cfg.capacity)

    @property
    def dram_bytes(self) -> int:
        return int(self._cfg.dram_bytes)

    @property
    def wbuf_bytes(self) -> int:
        return int(self._cfg.wbuf_bytes)

    @property
    def slot_bytes(self) -> int:
        return int(self._cfg.slot_bytes)

    @property
    def slot_count(self) -> int:
        return int(self._cfg.slot_count)

    @property
    def backend(self) -> str:
        return str(_name_of(_ll.BACKENDS, int(self._cfg.backend)))

    @property
    def auto_backend(self) -> bool:
        """True when ``backend`` was not set (or set to ``"auto"``): a device
        opened from this config uses uring if this host allows io_uring, else
        pread (see :mod:`chm.backend`)."""
        return "backend" not in self._set

    @property
    def mode(self) -> str:
        return str(_name_of(_ll.MODES, int(self._cfg.mode)))

    @property
    def targets(self) -> list[str]:
        return list(self.to_dict()["targets"])

    def __repr__(self) -> str:
        d = self.to_dict()
        keys = ("capacity", "targets", "backend", "mode", "dram_bytes", "slot_bytes")
        inner = ", ".join(f"{k}={d[k]!r}" for k in keys if k in d)
        return f"Config({inner})"


def _canonical(key: str) -> str:
    return key.replace("-", "_")


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, f"{name}.")
        else:
            yield name, value


def load_toml(path: str | os.PathLike[str]) -> Config:
    """Shorthand for :meth:`Config.from_toml`."""
    return Config.from_toml(Path(path))
