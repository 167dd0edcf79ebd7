"""Block keys: 16-byte blake2b digests chained along a prompt's prefix.

A block's key hashes the previous block's key together with a description of
the block's own tokens, so it names the whole prefix up to and including that
block: equal prefixes give equal keys, and a difference anywhere before a
block changes its key and every later one (the vLLM / LMCache prefix-hash
scheme). The chain starts at :func:`root_key` of a namespace, so workloads (or
models) in different namespaces never share keys.
"""

from __future__ import annotations

import hashlib
import struct

__all__ = ["KEY_BYTES", "chain_key", "root_key"]

KEY_BYTES = 16
_U64 = struct.Struct("<Q")


def root_key(namespace: str) -> bytes:
    """The key before a prompt's first block, for ``namespace``."""
    return hashlib.blake2b(
        b"chm-root\0" + namespace.encode(), digest_size=KEY_BYTES, person=b"chm-prefix"
    ).digest()


def chain_key(prev: bytes, start_token: int, content: tuple[int, ...]) -> bytes:
    """The key of the block that starts at ``start_token`` and follows ``prev``.

    ``content`` is a tuple of non-negative integers that identifies the
    block's tokens (ids of the trace blocks it overlaps, or a synthetic
    source and offset); it is hashed with the block's start position.
    """
    if len(prev) != KEY_BYTES:
        raise ValueError(f"prev key must be {KEY_BYTES} bytes, got {len(prev)}")
    h = hashlib.blake2b(prev, digest_size=KEY_BYTES, person=b"chm-prefix")
    h.update(_U64.pack(start_token))
    h.update(_U64.pack(len(content)))
    for c in content:
        h.update(_U64.pack(c))
    return h.digest()
