"""The index journal: an append-only log of fixed 64-byte records.

File layout: one header record, then records, each 64 bytes little-endian
and closed by the XXH32 of its first 60 bytes::

    header  magic "CHMKVJ1\\0", version u32, 0 u32, capacity u64,
            segment_bytes u64, created_ns u64, 20 zero bytes, xxh32 u32
    record  type u8, 3 zero bytes, segment u32, key_hi u64, key_lo u64,
            addr u64, checksum u64, epoch u64, length u32, device u16,
            6 zero bytes, xxh32 u32
    META    type u8, part u8, total u16, 0 u32, key_hi u64, key_lo u64,
            epoch u64, 28 bytes of metadata, xxh32 u32

Types: PUT (a block became durable), DEL (a key was removed), RECLAIM (every
block of ``segment`` with an epoch below ``epoch`` is gone), META (part
``part`` of the ``total`` metadata bytes of the PUT of the same key and
epoch; a block's META records come right before its PUT, in one append).
Replay keeps a PUT unless a later DEL of its key or a RECLAIM of its segment
with a larger epoch follows; a torn or corrupt record ends the log (what
follows it was never acknowledged) and is cut off.

Compaction writes the live entries to a new file, syncs it and renames it
over the old one, so a crash leaves one or the other.

Versions: 2 added META. A version 1 journal (no metadata) opens as it is,
and the store rewrites it as version 2 (a compaction) before appending to
it; a journal of a version this code does not read is refused, naming both.
``<path>.lock`` holds an exclusive flock while a store uses it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from chm.errors import Busy, InvalidArgument

__all__ = [
    "DEL",
    "MAX_META",
    "META",
    "PUT",
    "RECLAIM",
    "REC_DTYPE",
    "VERSION",
    "Journal",
    "Replay",
    "meta_records",
    "records",
]

PUT, DEL, RECLAIM, META = 1, 2, 3, 4
MAGIC = b"CHMKVJ1\0"
VERSION = 2
READS = (1, 2)  # journal versions this code opens
REC_BYTES = 64
META_PART = 28  # metadata bytes per META record
MAX_META = 1024  # metadata bytes per key

REC_DTYPE = np.dtype(
    [
        ("type", "u1"),
        ("_p0", "V3"),
        ("segment", "<u4"),
        ("hi", "<u8"),
        ("lo", "<u8"),
        ("addr", "<u8"),
        ("checksum", "<u8"),
        ("epoch", "<u8"),
        ("length", "<u4"),
        ("device", "<u2"),
        ("_p1", "V6"),
        ("crc", "<u4"),
    ]
)
assert REC_DTYPE.itemsize == REC_BYTES
META_DTYPE = np.dtype(
    [
        ("type", "u1"),
        ("part", "u1"),
        ("total", "<u2"),
        ("_p0", "<u4"),
        ("hi", "<u8"),
        ("lo", "<u8"),
        ("epoch", "<u8"),
        ("data", "V28"),
        ("crc", "<u4"),
    ]
)
assert META_DTYPE.itemsize == REC_BYTES
HDR_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("_p0", "<u4"),
        ("capacity", "<u8"),
        ("segment_bytes", "<u8"),
        ("created_ns", "<u8"),
        ("_p1", "V20"),
        ("crc", "<u4"),
    ]
)
assert HDR_DTYPE.itemsize == REC_BYTES


def _seal(recs: np.ndarray[Any, Any]) -> bytes:
    """Fills in each record's xxh32 and returns the bytes."""
    raw = bytearray(recs.tobytes())
    for off in range(0, len(raw), REC_BYTES):
        crc = xxhash.xxh32_intdigest(bytes(raw[off : off + 60]))
        raw[off + 60 : off + 64] = crc.to_bytes(4, "little")
    return bytes(raw)


def meta_records(hi: int, lo: int, epoch: int, meta: bytes) -> np.ndarray[Any, Any]:
    """The META records of one block's metadata (none for empty metadata),
    as REC_DTYPE rows to append before its PUT."""
    if len(meta) > MAX_META:
        raise InvalidArgument(None, f"metadata of {len(meta)} bytes; at most {MAX_META}")
    parts = -(-len(meta) // META_PART)
    m = np.zeros(parts, dtype=META_DTYPE)
    m["type"] = META
    m["part"] = np.arange(parts)
    m["total"] = len(meta)
    m["hi"], m["lo"], m["epoch"] = hi, lo, epoch
    padded = meta + bytes(parts * META_PART - len(meta))
    m["data"] = [padded[i * META_PART : (i + 1) * META_PART] for i in range(parts)]
    return m.view(REC_DTYPE)


def records(puts: np.ndarray[Any, Any], metas: list[bytes] | None = None) -> np.ndarray[Any, Any]:
    """PUT records, each preceded by the META records of its metadata."""
    if not metas or not any(metas):
        return puts
    out = []
    for i, m in enumerate(metas):
        if m:
            r = puts[i]
            out.append(meta_records(int(r["hi"]), int(r["lo"]), int(r["epoch"]), m))
        out.append(puts[i : i + 1])
    return np.concatenate(out)


def _header(capacity: int, segment_bytes: int, version: int = VERSION) -> bytes:
    h = np.zeros(1, dtype=HDR_DTYPE)
    h["magic"] = MAGIC
    h["version"] = version
    h["capacity"] = capacity
    h["segment_bytes"] = segment_bytes
    h["created_ns"] = time.time_ns()
    return _seal(h)


@dataclass
class Replay:
    """What a journal held: the surviving PUT records and counts."""

    puts: np.ndarray[Any, Any]  # REC_DTYPE rows, one per live key
    records: int  # valid records read
    torn_bytes: int  # bytes cut off the end (a torn or corrupt tail)
    max_epoch: int
    metas: list[bytes] | None = None  # per row of puts: its metadata (b"": none)
    version: int = VERSION  # of the file as it was opened


def _lock_holder(path: str) -> str:
    """'pid N' of the process holding a flock on path, from /proc/locks."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK":
                    dev_ino = parts[5].split(":")
                    if len(dev_ino) == 3 and int(dev_ino[2]) == st.st_ino:
                        return f"pid {parts[4]}"
    except (OSError, ValueError):
        pass
    return "another process or an open store in this one"


def lock_file(path: str) -> int:
    """Opens (creating) path and takes an exclusive non-blocking flock; returns the fd.

    Raises :class:`chm.errors.Busy` naming the path and the holder when it
    is held.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        err = Busy(
            errno.EBUSY,
            f"{path}: in use by {_lock_holder(path)} (a KV store is open on it)",
            call="Store.open",
        )
        err.filename = path
        raise err from None
    except BaseException:
        os.close(fd)
        raise
    return fd


class Journal:
    """An open journal file (one writer: the store that holds its lock)."""

    def __init__(self, path: str | os.PathLike[str], capacity: int, segment_bytes: int) -> None:
        self.path = os.fspath(path)
        self.capacity = capacity
        self.segment_bytes = segment_bytes
        self._lock_fd = lock_file(self.path + ".lock")
        self.fd = -1
        self.version = VERSION
        try:
            self.replay = self._open()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.records = self.replay.records
        self.compactions = 0

    def _open(self) -> Replay:
        p = Path(self.path)
        if not p.exists() or p.stat().st_size == 0:
            self._create_empty()
            return Replay(np.zeros(0, dtype=REC_DTYPE), 0, 0, 0, [])
        data = p.read_bytes()
        version = self._check_header(data[:REC_BYTES])
        rep = self._parse(data[REC_BYTES:], version)
        self.version = version
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        if rep.torn_bytes:
            os.ftruncate(self.fd, REC_BYTES * (1 + rep.records))
            os.fsync(self.fd)
        return rep

    def _create_empty(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(_header(self.capacity, self.segment_bytes))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._sync_dir()
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)

    def _sync_dir(self) -> None:
        dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _check_header(self, raw: bytes) -> int:
        """The journal's version, after checking its magic, checksum and geometry."""
        if len(raw) < REC_BYTES or raw[:8] != MAGIC:
            raise InvalidArgument(None, f"{self.path}: not a chm KV journal (bad magic)")
        if xxhash.xxh32_intdigest(raw[:60]) != int.from_bytes(raw[60:64], "little"):
            raise InvalidArgument(None, f"{self.path}: journal header is corrupt")
        h = np.frombuffer(raw, dtype=HDR_DTYPE)[0]
        version = int(h["version"])
        if version not in READS:
            raise InvalidArgument(
                None,
                f"{self.path}: journal version {version}; this chm reads versions "
                f"{', '.join(map(str, READS))} (written by a newer chm? open it with that one)",
            )
        for name, want in (("capacity", self.capacity), ("segment_bytes", self.segment_bytes)):
            got = int(h[name])
            if got != want:
                raise InvalidArgument(
                    None,
                    f"{self.path}: journal was written with {name}={got}, the store now has "
                    f"{name}={want}; open it with the same geometry",
                )
        return version

    def _parse(self, body: bytes, version: int = VERSION) -> Replay:
        n = len(body) // REC_BYTES
        good = 0
        for i in range(n):
            off = i * REC_BYTES
            if xxhash.xxh32_intdigest(body[off : off + 60]) != int.from_bytes(
                body[off + 60 : off + 64], "little"
            ):
                break
            good += 1
        recs = np.frombuffer(body[: good * REC_BYTES], dtype=REC_DTYPE)
        torn = len(body) - good * REC_BYTES
        kinds = (PUT, DEL, RECLAIM, META) if version >= 2 else (PUT, DEL, RECLAIM)
        bad_type = ~np.isin(recs["type"], kinds)
        if bad_type.any():  # a valid checksum over an unknown type: stop there
            good = int(np.flatnonzero(bad_type)[0])
            torn = len(body) - good * REC_BYTES
            recs = recs[:good]
        is_meta = recs["type"] == META
        plain = recs[~is_meta]
        max_epoch = int(plain["epoch"].max()) if plain.size else 0
        # Last reclaim epoch of each segment; PUT/DEL in order per key.
        reclaim: dict[int, int] = {}
        live: dict[tuple[int, int], int] = {}
        types = recs["type"].tolist()
        his = recs["hi"].tolist()
        los = recs["lo"].tolist()
        segs = recs["segment"].tolist()
        epochs = recs["epoch"].tolist()
        parts: dict[tuple[int, int, int], list[bytes]] = {}
        for i in np.flatnonzero(is_meta).tolist():
            m = recs[i : i + 1].view(META_DTYPE)[0]
            k = (int(m["hi"]), int(m["lo"]), int(m["epoch"]))
            got = parts.setdefault(k, [])
            if int(m["part"]) == len(got):
                got.append(bytes(m["data"])[: max(0, int(m["total"]) - META_PART * len(got))])
        for i, t in enumerate(types):
            if t == META:
                continue
            if t == PUT:
                live[(his[i], los[i])] = i
            elif t == DEL:
                live.pop((his[i], los[i]), None)
            else:
                s = segs[i]
                reclaim[s] = max(reclaim.get(s, 0), epochs[i])
        idx = np.fromiter(live.values(), dtype=np.int64, count=len(live))
        puts = recs[idx]
        if reclaim and puts.size:
            floor = np.zeros(int(puts["segment"].max()) + 1, dtype=np.uint64)
            for s, e in reclaim.items():
                if s < floor.size:
                    floor[s] = e
            puts = puts[puts["epoch"] >= floor[puts["segment"]]]
        metas = [
            b"".join(parts.get((h, lo, e), ()))
            for h, lo, e in zip(
                puts["hi"].tolist(), puts["lo"].tolist(), puts["epoch"].tolist(), strict=True
            )
        ]
        return Replay(puts.copy(), good, torn, max_epoch, metas, version)

    # ---- appending

    def append(self, recs: np.ndarray[Any, Any]) -> None:
        """Appends records (not yet synced: see sync())."""
        if recs.size == 0:
            return
        data = _seal(recs)
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.records += int(recs.size)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def compact(self, live: np.ndarray[Any, Any]) -> None:
        """Replaces the log by ``live`` (REC_DTYPE rows: PUT records, each
        after its META records; see :func:`records`), as the current version."""
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            data = _header(self.capacity, self.segment_bytes) + _seal(live)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._sync_dir()
        old, self.fd = self.fd, os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        os.close(old)
        self.records = int(live.size)
        self.compactions += 1
        self.version = VERSION

    @property
    def nbytes(self) -> int:
        return REC_BYTES * (1 + self.records)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
