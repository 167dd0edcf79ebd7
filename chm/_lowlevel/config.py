"""chm_version() and the configuration calls (chm_config_*)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from chm._ffi import ffi, lib
from chm._lowlevel.check import _arg_error, _check, _errbuf, _errtext
from chm._lowlevel.consts import ERRMSG_MAX, MAX_TARGETS, PATH_MAX, CData
from chm._lowlevel.names import OptionInfo

# ---------------------------------------------------------------- version


def version() -> int:
    """chm_version(): MAJOR*10000 + MINOR*100 + PATCH."""
    return int(lib.chm_version())


# ---------------------------------------------------------------- config


def config_init(cfg: CData) -> None:
    """chm_config_init(): fills *cfg with defaults."""
    _check(lib.chm_config_init(cfg), "chm_config_init")


def config_new() -> CData:
    """Allocates a struct chm_config filled by chm_config_init()."""
    cfg = ffi.new("struct chm_config *")
    config_init(cfg)
    return cfg


def config_copy(cfg: CData) -> CData:
    """A new struct chm_config with the same contents."""
    out = ffi.new("struct chm_config *")
    ffi.memmove(out, cfg, ffi.sizeof("struct chm_config"))
    return out


def config_set(cfg: CData, key: str, value: str) -> None:
    """chm_config_set(): sets one option from its text form.

    Raises NotFound for an unknown key, InvalidArgument for a bad value (the
    device's one-line reason is in the message and in ``.detail``).
    """
    if "\0" in key or "\0" in value:  # C would see the text up to the NUL only
        raise _arg_error("chm_config_set", f"{key!r}, {value!r}", ValueError("contains a NUL byte"))
    err = _errbuf()
    try:
        rc = lib.chm_config_set(cfg, key.encode(), value.encode(), err, ERRMSG_MAX)
    except (UnicodeEncodeError, TypeError) as exc:
        raise _arg_error("chm_config_set", f"{key!r}, {value!r}", exc) from None
    if rc < 0:
        _check(rc, "chm_config_set", f"{key!r}, {value!r}", _errtext(err))


_GETBUF = MAX_TARGETS * PATH_MAX + 64  # room for every target and the commas


def config_get(cfg: CData, key: str) -> str:
    """chm_config_get(): option ``key`` of *cfg in its text form; NotFound
    for an unknown key."""
    if "\0" in key:
        raise _arg_error("chm_config_get", repr(key), ValueError("contains a NUL byte"))
    out = ffi.new("char[]", _GETBUF)
    try:
        rc = lib.chm_config_get(cfg, key.encode(), out, _GETBUF)
    except UnicodeEncodeError as exc:
        raise _arg_error("chm_config_get", repr(key), exc) from None
    _check(rc, "chm_config_get", repr(key))
    return str(ffi.string(out, rc).decode("utf-8", "replace"))


def parse_size(text: str) -> int:
    """chm_parse_size(): the byte count a size string names (the grammar of
    every size option); InvalidArgument with the C core's reason otherwise."""
    if "\0" in text:
        raise _arg_error("chm_parse_size", repr(text), "contains a NUL byte")
    out = ffi.new("uint64_t *")
    try:
        rc = lib.chm_parse_size(text.encode(), out)
    except UnicodeEncodeError:
        raise _arg_error("chm_parse_size", repr(text), "not a size (non-ASCII text)") from None
    _check(rc, "chm_parse_size", repr(text))
    return int(out[0])


def config_validate(cfg: CData) -> None:
    """chm_config_validate(): raises InvalidArgument with the reason."""
    err = _errbuf()
    rc = lib.chm_config_validate(cfg, err, ERRMSG_MAX)
    if rc < 0:
        _check(rc, "chm_config_validate", "", _errtext(err))


def _cstr(p: CData) -> str:
    if p == ffi.NULL:
        return ""
    return str(ffi.string(p).decode("utf-8", "replace"))


def config_option(idx: int) -> OptionInfo:
    """chm_config_option(): option number idx; NotFound past the end."""
    info = ffi.new("struct chm_option_info *")
    _check(lib.chm_config_option(idx, info), "chm_config_option", str(idx))
    return OptionInfo(_cstr(info.name), _cstr(info.type), _cstr(info.defval), _cstr(info.help))


def config_options() -> list[OptionInfo]:
    """Every option the C core declares, in its order."""
    out: list[OptionInfo] = []
    info = ffi.new("struct chm_option_info *")
    idx = 0
    while lib.chm_config_option(idx, info) == 0:
        out.append(
            OptionInfo(_cstr(info.name), _cstr(info.type), _cstr(info.defval), _cstr(info.help))
        )
        idx += 1
    return out


def timing_preset(name: str) -> dict[str, int]:
    """chm_timing_preset(): the preset's struct chm_timing as a dict."""
    out = ffi.new("struct chm_timing *")
    _check(lib.chm_timing_preset(name.encode(), out), "chm_timing_preset", repr(name))
    return _struct_to_dict(out[0])


def _iter_fields(ctype: Any) -> Iterator[tuple[str, Any]]:
    for name, field in ctype.fields:
        yield name, field.type


def _value(v: Any, ctype: Any) -> Any:
    kind = ctype.kind
    if kind == "primitive":
        return v if not isinstance(v, bytes) else v.decode("utf-8", "replace")
    if kind == "array":
        item = ctype.item
        if item.kind == "primitive" and item.cname == "char":
            return str(ffi.string(v).decode("utf-8", "replace"))
        return [_value(x, item) for x in v]
    if kind == "struct":
        return _struct_to_dict(v)
    if kind == "enum":
        return int(v)
    return v


def _struct_to_dict(obj: Any) -> dict[str, Any]:
    ctype = ffi.typeof(obj)
    return {name: _value(getattr(obj, name), ft) for name, ft in _iter_fields(ctype)}


def config_to_dict(cfg: CData) -> dict[str, Any]:
    """The raw struct chm_config as a dict (field names, ints, strings)."""
    d = _struct_to_dict(cfg[0])
    n = int(cfg.n_targets)
    d["targets"] = [str(ffi.string(cfg.targets[i]).decode()) for i in range(min(n, MAX_TARGETS))]
    return d


def struct_fields(cname: str) -> list[str]:
    """Field names of a C struct, e.g. ``struct_fields("struct chm_stats")``."""
    return [name for name, _ in ffi.typeof(cname).fields]
