"""Self-describing blocks: the header each stored block carries on the device.

A block of ``length`` bytes put at ``addr`` occupies, in its segment::

    addr                      payload (length bytes), zero-padded to 512
    addr + pad512(length)     header sector (512 bytes)

and the allocator reserves ``pad512(length) + 512`` bytes for it (rounded up
to the 4 KiB block alignment). The header sector is written in the same
device write as the payload; its first 64 bytes, little-endian, are::

    magic "CHMKVB1\\0", version u16 (1), device u16, length u32,
    key_hi u64, key_lo u64, checksum u64 (XXH3-64 of the payload),
    epoch u64, addr u64 (of the payload), segment_bytes / 1024 u32,
    xxh32 u32 (of the first 60 bytes)

and the other 448 bytes are zero. Loads never read it (they read the
payload and verify it against the index's checksum); it is there so that
``chm-emu kv check`` can compare every journaled block with what the device
holds and ``chm-emu kv repair`` can rebuild the index from the device when
the journal is lost: a scan finds the headers (magic and checksum), reads
each payload and keeps the blocks whose payload matches its header's
checksum, the newest epoch of each key.

Blocks of the ghost backend (payload-less puts for virtual-time replays)
have no bytes and no header; their allocation is the payload's alone.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

__all__ = [
    "HDR_DTYPE",
    "SECTOR",
    "BlockHeader",
    "first_block",
    "has_magic",
    "footprint",
    "header_sector",
    "header_offset",
    "parse_header",
    "scan",
]

MAGIC = b"CHMKVB1\0"
VERSION = 1
SECTOR = 512
_MAGIC_U64 = int.from_bytes(MAGIC, "little")
_CHUNK = 8 << 20  # bytes a scan reads at a time

HDR_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u2"),
        ("device", "<u2"),
        ("length", "<u4"),
        ("hi", "<u8"),
        ("lo", "<u8"),
        ("checksum", "<u8"),
        ("epoch", "<u8"),
        ("addr", "<u8"),
        ("segment_kib", "<u4"),
        ("crc", "<u4"),
    ]
)
assert HDR_DTYPE.itemsize == 64


def _pad(n: int) -> int:
    return -(-n // SECTOR) * SECTOR


def header_offset(addr: int, length: int) -> int:
    """The device address of the header sector of a block at ``addr``."""
    return addr + _pad(length)


def footprint(length: int) -> int:
    """Bytes a block of ``length`` occupies with its header (before the
    allocator's 4 KiB rounding)."""
    return _pad(length) + SECTOR


def header_sector(
    *,
    hi: int,
    lo: int,
    length: int,
    checksum: int,
    epoch: int,
    addr: int,
    segment_bytes: int,
    device: int = 0,
) -> bytes:
    """The 512-byte header sector of one block."""
    h = np.zeros(1, dtype=HDR_DTYPE)
    h["magic"] = MAGIC
    h["version"] = VERSION
    h["device"] = device
    h["length"] = length
    h["hi"], h["lo"] = hi, lo
    h["checksum"] = checksum
    h["epoch"] = epoch
    h["addr"] = addr
    h["segment_kib"] = segment_bytes // 1024
    raw = bytearray(h.tobytes())
    raw[60:64] = xxhash.xxh32_intdigest(bytes(raw[:60])).to_bytes(4, "little")
    return bytes(raw) + bytes(SECTOR - 64)


@dataclass(frozen=True)
class BlockHeader:
    """One block as its header on the device describes it."""

    hi: int
    lo: int
    length: int
    checksum: int
    epoch: int
    addr: int
    segment_bytes: int
    device: int


def has_magic(raw: bytes | memoryview) -> bool:
    """Does ``raw`` start with the header magic (a header, intact or not)."""
    return bytes(raw[:8]) == MAGIC


def parse_header(raw: bytes | memoryview, at: int) -> BlockHeader | None:
    """The header in ``raw`` (its first 64 bytes), read at device address
    ``at``; None unless it is a well-formed header that places itself
    there (magic, version, checksum, position)."""
    if len(raw) < 64 or bytes(raw[:8]) != MAGIC:
        return None
    if xxhash.xxh32_intdigest(bytes(raw[:60])) != int.from_bytes(bytes(raw[60:64]), "little"):
        return None
    h = np.frombuffer(bytes(raw[:64]), dtype=HDR_DTYPE)[0]
    if int(h["version"]) != VERSION:
        return None
    b = BlockHeader(
        int(h["hi"]),
        int(h["lo"]),
        int(h["length"]),
        int(h["checksum"]),
        int(h["epoch"]),
        int(h["addr"]),
        int(h["segment_kib"]) * 1024,
        int(h["device"]),
    )
    if b.length == 0 or header_offset(b.addr, b.length) != at:
        return None
    return b


def _extents(fd: int, limit: int) -> Iterator[tuple[int, int]]:
    """(start, end) of the data extents of a file below ``limit`` (the whole
    range where the file system cannot tell holes)."""
    pos = 0
    while pos < limit:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here on
                return
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                yield pos, limit
                return
            raise
        if start >= limit:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), limit)
        yield start, end
        pos = end


def _candidates(fd: int, limit: int) -> Iterator[int]:
    """Device addresses of the sectors that start with the header magic."""
    for start, end in _extents(fd, limit):
        start -= start % SECTOR
        pos = start
        while pos < end:
            n = min(_CHUNK, end - pos)
            buf = os.pread(fd, n, pos)
            if not buf:
                break
            whole = len(buf) - len(buf) % SECTOR
            if whole:
                first = np.frombuffer(buf, dtype="<u8", count=whole // 8)[:: SECTOR // 8]
                for i in np.flatnonzero(first == _MAGIC_U64).tolist():
                    yield pos + i * SECTOR
            pos += max(whole, SECTOR)


def _open_limit(backing: str, capacity: int | None) -> tuple[int, int] | None:
    """(fd, bytes to scan) of a backing that is a regular file or a block
    device; None for anything else (nothing to scan)."""
    try:
        st = os.stat(backing)
    except OSError:
        return None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        return None
    fd = os.open(backing, os.O_RDONLY | os.O_CLOEXEC)
    size = os.lseek(fd, 0, os.SEEK_END)
    limit = size if capacity is None else min(size, capacity)
    return fd, limit


def first_block(backing: str, capacity: int | None = None) -> int | None:
    """The address of the first well-formed block header in ``backing``
    (within ``[0, capacity)``), or None: does the file hold KV blocks."""
    got = _open_limit(backing, capacity)
    if got is None:
        return None
    fd, limit = got
    try:
        for at in _candidates(fd, limit):
            if parse_header(os.pread(fd, 64, at), at) is not None:
                return at
        return None
    finally:
        os.close(fd)


def read_header_at(fd: int, addr: int, length: int) -> BlockHeader | None:
    """The header of the block at ``addr`` of ``length`` bytes (None: none there)."""
    at = header_offset(addr, length)
    return parse_header(os.pread(fd, 64, at), at)


def payload_ok(fd: int, h: BlockHeader | Any) -> bool:
    """Does the payload the header describes match its checksum."""
    data = os.pread(fd, int(h.length), int(h.addr))
    return len(data) == int(h.length) and xxhash.xxh3_64_intdigest(data) == int(h.checksum)


def scan(backing: str, capacity: int | None = None) -> tuple[list[BlockHeader], int]:
    """Every block on the device whose header and payload are intact: the
    newest epoch of each key; and how many headers were found whose payload
    does not match (torn or overwritten blocks)."""
    got = _open_limit(backing, capacity)
    if got is None:
        return [], 0
    fd, limit = got
    best: dict[tuple[int, int], BlockHeader] = {}
    bad = 0
    try:
        for at in _candidates(fd, limit):
            h = parse_header(os.pread(fd, 64, at), at)
            if h is None:
                continue
            if not payload_ok(fd, h):
                bad += 1
                continue
            k = (h.hi, h.lo)
            old = best.get(k)
            if old is None or h.epoch > old.epoch:
                best[k] = h
    finally:
        os.close(fd)
    return sorted(best.values(), key=lambda h: h.epoch), bad
