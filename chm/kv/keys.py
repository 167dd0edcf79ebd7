"""KV block keys: an engine's block hash in a namespace, as a 16-byte digest.

Format (version 1). A key is the 16 bytes

    XXH3-128( b"chm-kv/1\\0" + namespace.tag() + b"\\0" + raw )

stored big-endian (``xxhash.xxh3_128_digest``), where ``raw`` is the
engine's block hash as given:

- ``bytes`` / ``bytearray`` / ``memoryview``: used as they are (1..64 bytes);
- ``str``: hexadecimal digits (an optional ``0x`` prefix, even length), decoded
  to bytes first, so ``"0a1b"`` and ``b"\\x0a\\x1b"`` are the same key;
- ``int``: 0 <= value < 2**128, as 16 bytes big-endian (so Python's signed
  64-bit ``hash()`` values must be made unsigned by the caller).

The namespace tag is ``model@dtype@tp_rank@group`` (LMCache keys its chunks
``model@world_size@worker@chunk_hash@dtype``, vLLM's offloading uses
``block_hash + group_idx``, SGLang per-page hashes with a tp rank), so the
same engine hash under another model, dtype, rank or KV group is another
key. The fields are text without ``@``; ``tp_rank`` and ``group`` are
non-negative integers.

In numpy a batch of keys is an array of dtype ``KEY_DTYPE`` (two native
uint64 words: ``hi`` = the first 8 digest bytes read big-endian, ``lo`` =
the last 8),
which is what :class:`chm.kv.index.Index` takes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import xxhash

from chm.errors import InvalidArgument

__all__ = [
    "KEY_BYTES",
    "KEY_DTYPE",
    "KeyLike",
    "Namespace",
    "digest_array",
    "keys_from_digests",
]

KEY_BYTES = 16
KEY_DTYPE = np.dtype([("hi", "<u8"), ("lo", "<u8")])
_WIRE = np.dtype([("hi", ">u8"), ("lo", ">u8")])
_PREFIX = b"chm-kv/1\0"
_MAX_RAW = 64
_HEX = re.compile(r"(?:0[xX])?([0-9a-fA-F]*)\Z")

KeyLike = Union[bytes, bytearray, memoryview, str, int]  # noqa: UP007 (a runtime alias on 3.10)

_xxh128 = xxhash.xxh3_128_digest


def _field(name: str, value: object) -> str:
    if not isinstance(value, str) or not value or "@" in value or "\0" in value:
        raise InvalidArgument(
            None, f"namespace {name}={value!r}: expected non-empty text without '@' or NUL"
        )
    return value


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(None, f"namespace {name}={value!r}: expected an int >= 0")
    return value


@dataclass(frozen=True)
class Namespace:
    """Where a key lives: model, dtype, tensor-parallel rank, KV group."""

    model: str = "default"
    dtype: str = "bfloat16"
    tp_rank: int = 0
    group: int = 0

    def __post_init__(self) -> None:
        _field("model", self.model)
        _field("dtype", self.dtype)
        _count("tp_rank", self.tp_rank)
        _count("group", self.group)

    def tag(self) -> bytes:
        """``model@dtype@tp_rank@group`` as UTF-8."""
        return f"{self.model}@{self.dtype}@{self.tp_rank}@{self.group}".encode()

    def _seed(self) -> bytes:
        return _PREFIX + self.tag() + b"\0"

    def digest(self, key: KeyLike) -> bytes:
        """The 16-byte digest of one key (see the module doc for the format)."""
        return _xxh128(self._seed() + raw_key(key))

    def digests(self, keys: Iterable[KeyLike]) -> list[bytes]:
        seed = self._seed()
        return [_xxh128(seed + raw_key(k)) for k in keys]

    def keys(self, keys: Iterable[KeyLike] | np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """A batch of keys as a ``KEY_DTYPE`` array.

        A ``KEY_DTYPE`` array passes through unchanged: it already holds
        digests (of this or another namespace; the caller knows which).
        """
        if isinstance(keys, np.ndarray):
            if keys.dtype == KEY_DTYPE:
                return keys.reshape(-1)
            raise InvalidArgument(None, f"a key array must have dtype KEY_DTYPE, not {keys.dtype}")
        if isinstance(keys, (bytes, bytearray, memoryview, str, int)):
            raise InvalidArgument(
                None, f"expected a sequence of keys, got one key {keys!r:.60}; wrap it in a list"
            )
        return keys_from_digests(self.digests(keys))


def raw_key(key: object) -> bytes:
    """The engine hash's bytes (see the module doc), or InvalidArgument."""
    if isinstance(key, bytes):
        raw = key
    elif isinstance(key, (bytearray, memoryview)):
        raw = bytes(key)
    elif isinstance(key, str):
        m = _HEX.match(key)
        if m is None or len(m.group(1)) % 2:
            raise InvalidArgument(
                None, f"key {key!r:.80}: a str key must be hexadecimal digits of even length"
            )
        raw = bytes.fromhex(m.group(1))
    elif isinstance(key, int) and not isinstance(key, bool):
        if not 0 <= key < 1 << 128:
            raise InvalidArgument(None, f"key {key}: an int key must be in [0, 2**128)")
        raw = key.to_bytes(16, "big")
    else:
        raise InvalidArgument(
            None, f"key {key!r:.80}: expected bytes, a hex str or an int, not {type(key).__name__}"
        )
    if not 0 < len(raw) <= _MAX_RAW:
        raise InvalidArgument(
            None, f"key {key!r:.80}: {len(raw)} bytes; a key has 1..{_MAX_RAW} bytes"
        )
    return raw


def keys_from_digests(digests: Sequence[bytes]) -> np.ndarray[Any, Any]:
    """16-byte digests to a ``KEY_DTYPE`` array (no hashing)."""
    joined = b"".join(digests)
    if len(joined) != KEY_BYTES * len(digests):
        raise InvalidArgument(None, "every digest must be exactly 16 bytes")
    return np.frombuffer(joined, dtype=_WIRE).astype(KEY_DTYPE)


def digest_array(keys: np.ndarray[Any, Any]) -> list[bytes]:
    """A ``KEY_DTYPE`` array back to 16-byte digests."""
    b = np.asarray(keys, dtype=KEY_DTYPE).astype(_WIRE).tobytes()
    return [b[i : i + KEY_BYTES] for i in range(0, len(b), KEY_BYTES)]
