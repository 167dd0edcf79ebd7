"""The index journal: an append-only log of fixed 64-byte records.

File layout (version 3): one header record, then records, each 64 bytes
little-endian and closed by the XXH32 of its first 60 bytes::

    header  magic "CHMKVJ1\\0", version u32, 0 u32, capacity u64,
            segment_bytes u64, created_ns u64, block_bytes u32,
            16 zero bytes, xxh32 u32
    record  type u8, meta_len u16, 0 u8, segment u32, key_hi u64, key_lo u64,
            addr u64, checksum u64, epoch u64, length u32, device u16,
            2 zero bytes, seq u32, xxh32 u32
    META    type u8, part u8, total u16, 0 u32, key_hi u64, key_lo u64,
            epoch u64, 24 bytes of metadata, seq u32, xxh32 u32

Types: PUT (a block became durable), DEL (a key was removed), RECLAIM (every
block of ``segment`` with an epoch below ``epoch`` is gone), META (part
``part`` of the ``total`` metadata bytes of the PUT of the same key and
epoch; a block's META records come right before its PUT, in one append).
A PUT's ``meta_len`` is the length of its metadata: a PUT whose META
records do not add up to it lost one to damage and is dropped (counted as
damaged) rather than recovered with other metadata than was put.
``seq`` numbers the records of the file 1, 2, 3, ... (modulo 2**32; a
compaction starts again at 1); ``block_bytes`` is the largest block the
store that wrote the file takes (0: not recorded).

Replay keeps a PUT unless a later DEL of its key or a RECLAIM of its segment
with a larger epoch follows. A record that fails its checksum (or is out of
sequence) is skipped and counted, and replay goes on with the records after
it: a damaged record in the middle costs that record, never the rest. A run
of bad records at the very end is a torn tail (an append that a crash cut
short, never acknowledged) and is counted apart. Recovery deletes nothing
in place: a journal with any damage is first copied aside, intact, to
``<path>.damaged-<UTC time>``, and the store then rewrites the journal (a
compaction) from what it recovered. ``Replay.missing`` counts records that a
gap in the sequence numbers shows were lost.

Compaction writes the live entries to a new file, syncs it and renames it
over the old one, so a crash leaves one or the other; the writing needs no
lock of the store's (``compact_begin`` / ``compact_write`` /
``compact_finish``), and records appended meanwhile are carried into the new
file before the rename. An append that fails
(a full disk) truncates the file back to where it was, so no partial
record is left behind, and raises :class:`chm.errors.NoSpace` naming the
file and the space left on its filesystem.

Versions: 2 added META, 3 the sequence numbers and ``block_bytes``. Older
journals (1, 2) open as they are (their records carry no sequence numbers,
so only checksums find damage) and the store rewrites them as version 3 (a
compaction) before appending; a journal of a version this code does not
read is refused, naming both. ``<path>.lock`` holds an exclusive flock while
a store (or ``chm-emu kv check/repair``) uses it.

The blocks themselves describe themselves on the device too (see
:mod:`chm.kv.blockhdr`), so ``chm-emu kv repair`` can rebuild a lost
journal from the backing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from chm.errors import Busy, ChmError, InvalidArgument, NoSpace

__all__ = [
    "DEL",
    "MAX_META",
    "META",
    "PUT",
    "RECLAIM",
    "REC_DTYPE",
    "VERSION",
    "Header",
    "Journal",
    "Replay",
    "del_records",
    "meta_records",
    "parse",
    "put_records",
    "read_header",
    "reclaim_records",
    "stored_segment_bytes",
    "records",
    "write_new",
]

PUT, DEL, RECLAIM, META = 1, 2, 3, 4
MAGIC = b"CHMKVJ1\0"
VERSION = 3
READS = (1, 2, 3)  # journal versions this code opens
REC_BYTES = 64
META_PART = 24  # metadata bytes per META record (version 3)
MAX_META = 1024  # metadata bytes per key
SEQ_MASK = (1 << 32) - 1

REC_DTYPE = np.dtype(
    [
        ("type", "u1"),
        ("meta_len", "<u2"),
        ("_p0", "V1"),
        ("segment", "<u4"),
        ("hi", "<u8"),
        ("lo", "<u8"),
        ("addr", "<u8"),
        ("checksum", "<u8"),
        ("epoch", "<u8"),
        ("length", "<u4"),
        ("device", "<u2"),
        ("_p1", "V2"),
        ("seq", "<u4"),
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
        ("data", "V24"),
        ("seq", "<u4"),
        ("crc", "<u4"),
    ]
)
assert META_DTYPE.itemsize == REC_BYTES
# versions 1 and 2: no sequence numbers, 28 metadata bytes a META record
V2_REC_DTYPE = np.dtype(
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
assert V2_REC_DTYPE.itemsize == REC_BYTES
V2_META_PART = 28
V2_META_DTYPE = np.dtype(
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
assert V2_META_DTYPE.itemsize == REC_BYTES
HDR_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("_p0", "<u4"),
        ("capacity", "<u8"),
        ("segment_bytes", "<u8"),
        ("created_ns", "<u8"),
        ("block_bytes", "<u4"),
        ("_p1", "V16"),
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


def _crc_ok(body: bytes) -> np.ndarray[Any, Any]:
    """Per whole 64-byte record of ``body``: does its xxh32 match."""
    n = len(body) // REC_BYTES
    mv = memoryview(body)
    digest = xxhash.xxh32_intdigest
    got = [digest(mv[o : o + 60]) for o in range(0, n * REC_BYTES, REC_BYTES)]
    want = np.frombuffer(body, dtype="<u4", count=n * 16).reshape(n, 16)[:, 15]
    ok: np.ndarray[Any, Any] = np.asarray(got, dtype=np.uint32) == want
    return ok


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


_PUT_FIELDS = ("segment", "hi", "lo", "addr", "checksum", "epoch", "length", "device")


def put_records(
    ents: np.ndarray[Any, Any], metas: list[bytes] | None = None
) -> np.ndarray[Any, Any]:
    """The PUT records (each after its META records) of index entries
    (rows with the fields segment, hi, lo, addr, checksum, epoch, length,
    device), ``metas`` their metadata (None: none)."""
    recs = np.zeros(ents.size, dtype=REC_DTYPE)
    recs["type"] = PUT
    for f in _PUT_FIELDS:
        recs[f] = ents[f]
    if metas:
        recs["meta_len"] = [len(m) for m in metas]
    return records(recs, metas)


def del_records(hi: Any, lo: Any, epoch: int) -> np.ndarray[Any, Any]:
    """DEL records of the keys ``(hi, lo)`` (arrays), at ``epoch``."""
    recs = np.zeros(np.size(hi), dtype=REC_DTYPE)
    recs["type"] = DEL
    recs["hi"], recs["lo"] = hi, lo
    recs["epoch"] = epoch
    return recs


def reclaim_records(segments: list[int], epochs: list[int]) -> np.ndarray[Any, Any]:
    """RECLAIM records: every block of ``segments[i]`` below ``epochs[i]`` is gone."""
    recs = np.zeros(len(segments), dtype=REC_DTYPE)
    recs["type"] = RECLAIM
    recs["segment"] = segments
    recs["epoch"] = epochs
    return recs


def _numbered(recs: np.ndarray[Any, Any], first: int) -> np.ndarray[Any, Any]:
    """A copy of ``recs`` with sequence numbers first, first + 1, ..."""
    out: np.ndarray[Any, Any] = recs.copy()
    out["seq"] = (np.arange(out.size, dtype=np.uint64) + first) & SEQ_MASK
    return out


def _header(
    capacity: int, segment_bytes: int, version: int = VERSION, block_bytes: int = 0
) -> bytes:
    h = np.zeros(1, dtype=HDR_DTYPE)
    h["magic"] = MAGIC
    h["version"] = version
    h["capacity"] = capacity
    h["segment_bytes"] = segment_bytes
    h["created_ns"] = time.time_ns()
    if version >= 3:
        h["block_bytes"] = block_bytes
    return _seal(h)


@dataclass(frozen=True)
class Header:
    """A journal's header: its version and the geometry it was written with."""

    version: int
    capacity: int
    segment_bytes: int
    block_bytes: int  # 0: not recorded (versions 1, 2)
    created_ns: int


def read_header(raw: bytes, path: str) -> Header:
    """The header of the journal at ``path`` from its first 64 bytes;
    InvalidArgument for a file that is not a journal of a version this
    code reads."""
    if len(raw) < REC_BYTES or raw[:8] != MAGIC:
        raise InvalidArgument(None, f"{path}: not a chm KV journal (bad magic)")
    if xxhash.xxh32_intdigest(raw[:60]) != int.from_bytes(raw[60:64], "little"):
        raise InvalidArgument(None, f"{path}: journal header is corrupt")
    h = np.frombuffer(raw[:REC_BYTES], dtype=HDR_DTYPE)[0]
    version = int(h["version"])
    if version not in READS:
        raise InvalidArgument(
            None,
            f"{path}: journal version {version}; this chm reads versions "
            f"{', '.join(map(str, READS))} (written by a newer chm? open it with that one)",
        )
    return Header(
        version,
        int(h["capacity"]),
        int(h["segment_bytes"]),
        int(h["block_bytes"]) if version >= 3 else 0,
        int(h["created_ns"]),
    )


@dataclass
class Replay:
    """What a journal held: the surviving PUT records and counts."""

    puts: np.ndarray[Any, Any]  # REC_DTYPE rows, one per live key
    records: int  # valid records read
    torn_bytes: int  # bytes of the torn tail (bad records after the last good one)
    max_epoch: int
    metas: list[bytes] | None = None  # per row of puts: its metadata (b"": none)
    version: int = VERSION  # of the file as it was opened
    damaged: int = 0  # bad records (failed checksum, unknown type) before the last good one
    missing: int = 0  # records lost, as gaps in the sequence numbers show
    out_of_order: int = 0  # records with a good checksum but a sequence number from the past
    next_seq: int = 1  # the sequence number of the next record to append
    damaged_at: list[int] = field(default_factory=list)  # file offsets of damaged records

    @property
    def clean(self) -> bool:
        return not (self.torn_bytes or self.damaged or self.missing or self.out_of_order)


def _upgrade(recs: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Version 1/2 records (V2_REC_DTYPE) in the version 3 layout (seq 0;
    META records keep 28 data bytes in their own view: see _meta_parts)."""
    out = np.zeros(recs.size, dtype=REC_DTYPE)
    for name in REC_DTYPE.names or ():
        if name in (V2_REC_DTYPE.names or ()) and not name.startswith("_"):
            out[name] = recs[name]
    return out


def parse(body: bytes, version: int = VERSION) -> Replay:
    """Replays the records after a journal's header (see the module doc)."""
    n = len(body) // REC_BYTES
    ok = _crc_ok(body)
    old = version < 3
    raw = np.frombuffer(body, dtype=V2_REC_DTYPE if old else REC_DTYPE, count=n)
    kinds = (PUT, DEL, RECLAIM, META) if version >= 2 else (PUT, DEL, RECLAIM)
    ok &= np.isin(raw["type"], kinds)
    good_idx = np.flatnonzero(ok)
    last = int(good_idx[-1]) if good_idx.size else -1
    tail = n - 1 - last  # bad records after the last good one: a torn tail
    torn = tail * REC_BYTES + (len(body) - n * REC_BYTES)
    bad_mid = np.flatnonzero(~ok[: last + 1])
    missing = out_of_order = 0
    next_seq = 1
    if not old and good_idx.size:
        seqs = raw["seq"][good_idx].astype(np.int64)
        keep = np.ones(good_idx.size, dtype=bool)
        want = 1
        for j, sq in enumerate(seqs.tolist()):
            gap = (sq - want) & SEQ_MASK
            if gap == 0:
                want = (sq + 1) & SEQ_MASK
            elif gap < (1 << 31):  # records want..sq-1 are gone
                missing += gap
                want = (sq + 1) & SEQ_MASK
            else:  # from the past: a stale record, not part of this log
                out_of_order += 1
                keep[j] = False
        # bad records account for (some of) the gap: count only the rest as missing
        missing = max(0, missing - int(bad_mid.size))
        good_idx = good_idx[keep]
        next_seq = want
    recs = raw[good_idx]
    if old:
        meta_view = recs.view(V2_META_DTYPE) if recs.size else np.zeros(0, V2_META_DTYPE)
        part_bytes = V2_META_PART
        recs = _upgrade(recs)
    else:
        recs = recs.copy()
        meta_view = recs.view(META_DTYPE)
        part_bytes = META_PART
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
        m = meta_view[i]
        k = (int(m["hi"]), int(m["lo"]), int(m["epoch"]))
        got = parts.setdefault(k, [])
        if int(m["part"]) == len(got):
            got.append(bytes(m["data"])[: max(0, int(m["total"]) - part_bytes * len(got))])
    meta_lens = recs["meta_len"].tolist()
    incomplete = 0
    for i, t in enumerate(types):
        if t == META:
            continue
        if t == PUT:
            n = meta_lens[i]
            if n and sum(map(len, parts.get((his[i], los[i], epochs[i]), ()))) != n:
                incomplete += 1  # a META record of it was lost: not with other metadata
                continue
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
    return Replay(
        puts.copy(),
        int(good_idx.size),
        torn,
        max_epoch,
        metas,
        version,
        damaged=int(bad_mid.size) + incomplete,
        missing=missing,
        out_of_order=out_of_order,
        next_seq=next_seq,
        damaged_at=[REC_BYTES * (1 + int(i)) for i in bad_mid[:64].tolist()],
    )


def stored_segment_bytes(path: str) -> int | None:
    """The segment size in the header of the journal at ``path`` (None: no
    readable journal there)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(REC_BYTES)
        return read_header(raw, path).segment_bytes
    except (OSError, ValueError):
        return None


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


def _free_bytes(path: str) -> int | None:
    try:
        v = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return None
    return v.f_bavail * v.f_frsize


def space_error(path: str, exc: OSError, what: str) -> ChmError:
    """The chm error for a failed journal write: NoSpace (naming the file
    and the space left) for ENOSPC/EDQUOT, else the ChmError of its errno."""
    from chm.errors import error_for

    code = exc.errno or errno.EIO
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = _free_bytes(path)
        left = "unknown" if free is None else f"{free} bytes"
        err: ChmError = NoSpace(
            errno.ENOSPC,
            f"{path}: no space left to {what} ({left} free on its filesystem); "
            "nothing partial was left in the journal",
            call="Journal",
        )
    else:
        err = error_for(code)(code, f"{path}: {what} failed: {os.strerror(code)}", call="Journal")
    err.filename = path
    return err


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sync_dir(path: str) -> None:
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_new(
    path: str, capacity: int, segment_bytes: int, block_bytes: int, live: np.ndarray[Any, Any]
) -> None:
    """Writes a journal of ``live`` records (numbered from 1) at ``path``
    atomically: a synced temporary file renamed over it, then the directory
    synced. On failure the old file (if any) is left as it was."""
    tmp = _write_tmp(path, capacity, segment_bytes, block_bytes, live)
    _install(tmp, path)


def _write_tmp(
    path: str, capacity: int, segment_bytes: int, block_bytes: int, live: np.ndarray[Any, Any]
) -> str:
    """``<path>.tmp``: a journal of ``live`` (numbered from 1), synced."""
    tmp = path + ".tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            data = _header(capacity, segment_bytes, block_bytes=block_bytes)
            _write_all(fd, data + _seal(_numbered(live, 1)))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, ChmError):
            raise
        raise space_error(path, exc, "write the journal") from exc
    return tmp


def _install(tmp: str, path: str, extra: bytes = b"") -> None:
    """Appends ``extra`` to the synced ``tmp`` (synced again), renames it
    over ``path`` and syncs the directory; on failure removes ``tmp``."""
    try:
        if extra:
            fd = os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                _write_all(fd, extra)
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
        _sync_dir(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, ChmError):
            raise
        raise space_error(path, exc, "write the journal") from exc


def keep_aside(path: str) -> str:
    """Copies ``path`` (with its timestamps) to ``<path>.damaged-<UTC
    time>`` and syncs it; returns the copy's path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dst = f"{path}.damaged-{stamp}"
    n = 1
    while os.path.exists(dst):
        n += 1
        dst = f"{path}.damaged-{stamp}.{n}"
    try:
        shutil.copy2(path, dst)
        fd = os.open(dst, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _sync_dir(dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(dst)  # no partial copy left behind
        raise
    return dst


class Journal:
    """An open journal file (one writer: the store that holds its lock).

    ``backing`` names the device file the journal indexes: a missing or
    empty journal beside a backing that holds KV blocks is refused
    (:class:`chm.errors.Damaged`), not opened as an empty store.
    ``block_bytes`` is recorded in a new file's header.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity: int,
        segment_bytes: int,
        *,
        backing: str | None = None,
        block_bytes: int = 0,
    ) -> None:
        self.path = os.fspath(path)
        self.capacity = capacity
        self.segment_bytes = segment_bytes
        self.block_bytes = block_bytes
        self.backing = backing
        self._lock_fd = lock_file(self.path + ".lock")
        self.fd = -1
        self.version = VERSION
        self.header: Header | None = None
        self.kept_aside: str | None = None  # where a damaged journal was copied
        self._delta: list[np.ndarray[Any, Any]] | None = None  # appends during a compaction
        try:
            self.replay = self._open()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.records = self.replay.records
        self._seq = self.replay.next_seq
        self._size = os.fstat(self.fd).st_size
        self.compactions = 0

    def _open(self) -> Replay:
        p = Path(self.path)
        if not p.exists() or p.stat().st_size == 0:
            self._refuse_if_backing_has_blocks(missing=not p.exists())
            self._create_empty()
            return Replay(np.zeros(0, dtype=REC_DTYPE), 0, 0, 0, [])
        data = p.read_bytes()
        self.header = self._check_header(data[:REC_BYTES])
        version = self.header.version
        rep = parse(data[REC_BYTES:], version)
        self.version = version
        if not rep.clean:
            # kept intact for inspection; the store rewrites the journal
            # (a compaction) from what was recovered before appending
            try:
                self.kept_aside = keep_aside(self.path)
            except OSError as exc:
                if isinstance(exc, ChmError):
                    raise
                raise space_error(self.path, exc, "keep the damaged journal aside") from exc
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        return rep

    def _refuse_if_backing_has_blocks(self, *, missing: bool) -> None:
        from chm.errors import Damaged
        from chm.kv import blockhdr

        b = self.backing
        if not b:
            return
        found = blockhdr.first_block(b, self.capacity)
        if found is None:
            return
        what = "missing" if missing else "empty (0 bytes)"
        err = Damaged(
            None,
            f"{self.path}: the KV journal is {what}, but the backing {b} holds KV blocks "
            f"(one at address {found}); refusing to open it as an empty store. Rebuild "
            f"the journal from the blocks on the device with: chm-emu kv repair {b}",
            call="Store.open",
        )
        err.filename = self.path
        raise err

    def _create_empty(self) -> None:
        write_new(self.path, self.capacity, self.segment_bytes, self.block_bytes, _EMPTY)
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)

    def _sync_dir(self) -> None:
        _sync_dir(self.path)

    def _check_header(self, raw: bytes) -> Header:
        """The journal's header, after checking its magic, checksum and geometry."""
        h = read_header(raw, self.path)
        for name, want, flag in (
            ("capacity", self.capacity, "capacity"),
            ("segment_bytes", self.segment_bytes, "segment_bytes"),
        ):
            got = int(getattr(h, name))
            if got != want:
                raise InvalidArgument(
                    None,
                    f"{self.path}: journal was written with {name}={got}, the store now has "
                    f"{name}={want}; open it with the same geometry (pass {flag}={got})",
                )
        return h

    # ---- appending

    def append(self, recs: np.ndarray[Any, Any]) -> None:
        """Appends records (not yet synced: see sync()).

        On failure the file is cut back to its size before the call (no
        partial record stays) and NoSpace (a full disk) or the ChmError of
        the errno is raised; nothing is counted as appended.
        """
        if recs.size == 0:
            return
        data = _seal(_numbered(recs, self._seq))
        try:
            _write_all(self.fd, data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self._size)
            raise space_error(self.path, exc, f"append {recs.size} records") from exc
        self._size += len(data)
        self._seq = (self._seq + int(recs.size)) & SEQ_MASK
        self.records += int(recs.size)
        if self._delta is not None:  # a compaction is under way: carried into its file
            self._delta.append(recs.copy())

    def sync(self) -> None:
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise space_error(self.path, exc, "sync the journal") from exc

    def compact(self, live: np.ndarray[Any, Any]) -> None:
        """Replaces the log by ``live`` (REC_DTYPE rows: PUT records, each
        after its META records; see :func:`records`), as the current version."""
        self.compact_begin()
        try:
            tmp = self.compact_write(live)
        except BaseException:
            self._delta = None
            raise
        self.compact_finish(tmp, int(live.size))

    # A compaction in three steps, so that the slow one (writing and syncing
    # the live records) needs no lock of the caller's: compact_begin() and
    # compact_finish() run where appends cannot (the store's lock), and the
    # records appended in between are carried into the new file.

    def compact_begin(self) -> None:
        """Starts a compaction: appends from now on are kept for compact_finish()."""
        self._delta = []

    def compact_write(self, live: np.ndarray[Any, Any]) -> str:
        """Writes and syncs the new file (``live``) beside the journal; its path."""
        return _write_tmp(self.path, self.capacity, self.segment_bytes, self.block_bytes, live)

    def compact_abort(self, tmp: str | None) -> None:
        self._delta = None
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def compact_finish(self, tmp: str, n_live: int) -> None:
        """Appends the records appended since compact_begin() to ``tmp``,
        then puts it in the journal's place."""
        delta, self._delta = self._delta or [], None
        extra = np.concatenate(delta) if delta else _EMPTY
        _install(tmp, self.path, _seal(_numbered(extra, n_live + 1)) if extra.size else b"")
        old, self.fd = self.fd, os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        os.close(old)
        n = n_live + int(extra.size)
        self.records = n
        self._seq = (n + 1) & SEQ_MASK
        self._size = os.fstat(self.fd).st_size
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


_EMPTY = np.zeros(0, dtype=REC_DTYPE)
