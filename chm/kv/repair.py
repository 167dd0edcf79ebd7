"""Offline check and repair of a KV store's journal against its device.

:func:`check` reads a store's journal and backing (holding the journal's
lock, so no store may have it open) and reports: the journal's live entries,
its damaged, missing and torn records, the journaled blocks whose header on
the device disagrees with their record (another key, length, checksum or
epoch, or no header) or whose payload fails its checksum, and the intact
blocks a scan of the device finds that the journal does not list.

:func:`repair` rebuilds the journal when it is damaged, empty or missing:
the entries the journal still holds whose payload verifies, plus the intact
blocks the device scan finds (see :mod:`chm.kv.blockhdr`) whose key the
journal lacks or holds at an older epoch. The old journal is kept aside
(``<journal>.damaged-<UTC time>``) and the new one is written atomically.
A block rebuilt from the device has no metadata (``Store.meta`` gives b"");
a block that was removed or evicted but whose bytes are still intact on the
device may come back (with its own bytes: never another key's). A clean
journal is left as it is.

Both are what ``chm-emu kv check PATH`` and ``chm-emu kv repair PATH`` run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from chm.errors import InvalidArgument, NotFound
from chm.kv import blockhdr
from chm.kv import journal as jn

__all__ = ["CheckReport", "RepairReport", "check", "repair", "resolve"]


def resolve(path: str | os.PathLike[str], journal: str | None = None) -> tuple[str, str]:
    """(backing, journal) of a store given as its directory (``kv.img``
    inside, as ``Store.open`` makes) or its backing file."""
    p = Path(path)
    backing = p / "kv.img" if p.is_dir() else p
    if not backing.exists():
        raise NotFound(None, f"{backing}: no such backing file (give a store's directory or file)")
    return str(backing), journal or f"{backing}.kvjournal"


@dataclass
class CheckReport:
    """What :func:`check` found (``damaged``: anything that needs a repair)."""

    backing: str
    journal: str
    journal_state: str  # "ok", "damaged", "missing", "empty"
    journal_version: int
    entries: int  # live entries the journal lists
    damaged_records: int
    missing_records: int
    torn_bytes: int
    header_mismatch: int  # journaled blocks whose device header disagrees (or is damaged)
    headerless: int  # journaled blocks with no header (older blocks; not damage)
    bad_payload: int  # journaled blocks whose payload fails its checksum
    device_blocks: int  # intact blocks on the device (newest of each key)
    torn_blocks: int  # headers on the device whose payload does not match
    unjournaled: int  # intact device blocks the journal does not list (or lists older)
    problems: list[str] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        return bool(self.problems)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["damaged"] = self.damaged
        return d


@dataclass
class RepairReport:
    """What :func:`repair` did."""

    backing: str
    journal: str
    repaired: bool  # False: the journal was clean, nothing was written
    entries: int  # entries in the new journal
    from_journal: int
    from_device: int
    dropped: int  # journal entries whose block failed its checksum
    kept_aside: str  # the old journal's copy ("" if there was none)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _State:
    backing: str
    journal: str
    state: str
    header: jn.Header | None
    replay: jn.Replay | None


def _read_journal(backing: str, journal: str) -> _State:
    p = Path(journal)
    if not p.exists():
        return _State(backing, journal, "missing", None, None)
    data = p.read_bytes()
    if not data:
        return _State(backing, journal, "empty", None, None)
    hdr = jn.read_header(data[: jn.REC_BYTES], journal)
    rep = jn.parse(data[jn.REC_BYTES :], hdr.version)
    return _State(backing, journal, "ok" if rep.clean else "damaged", hdr, rep)


def _verify(fd: int, puts: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], int, int]:
    """Per PUT row: does its payload verify; how many blocks have a header
    that disagrees with their record (or is damaged); how many have none (a
    block written before headers existed, or by a store whose segments
    leave no room for one)."""
    good = np.zeros(puts.size, dtype=bool)
    mismatch = headerless = 0
    for i, r in enumerate(puts):
        addr, n = int(r["addr"]), int(r["length"])
        at = blockhdr.header_offset(addr, n)
        raw = os.pread(fd, 64, at)
        if not blockhdr.has_magic(raw):
            headerless += 1
        else:
            h = blockhdr.parse_header(raw, at)
            want = (int(r["hi"]), int(r["lo"]), n, int(r["checksum"]), int(r["epoch"]))
            if h is None or (h.hi, h.lo, h.length, h.checksum, h.epoch) != want:
                mismatch += 1
        good[i] = blockhdr.payload_ok(fd, _Ent(addr, n, int(r["checksum"])))
    return good, mismatch, headerless


@dataclass(frozen=True)
class _Ent:
    addr: int
    length: int
    checksum: int


def check(path: str | os.PathLike[str], journal: str | None = None) -> CheckReport:
    """Checks a store offline (see the module doc); Busy while a store has it open."""
    backing, jpath = resolve(path, journal)
    lock = jn.lock_file(jpath + ".lock")
    try:
        st = _read_journal(backing, jpath)
        cap = st.header.capacity if st.header else None
        found, torn_blocks = blockhdr.scan(backing, cap)
        rep = st.replay
        puts = rep.puts if rep is not None else np.zeros(0, dtype=jn.REC_DTYPE)
        version = st.header.version if st.header else jn.VERSION
        fd = os.open(backing, os.O_RDONLY | os.O_CLOEXEC)
        try:
            good, mismatch, headerless = _verify(fd, puts)
        finally:
            os.close(fd)
        listed = {
            (h, lo): e
            for h, lo, e in zip(
                puts["hi"].tolist(), puts["lo"].tolist(), puts["epoch"].tolist(), strict=True
            )
        }
        unjournaled = sum(1 for b in found if listed.get((b.hi, b.lo), -1) < b.epoch)
        r = CheckReport(
            backing=backing,
            journal=jpath,
            journal_state=st.state,
            journal_version=version if st.header else 0,
            entries=int(puts.size),
            damaged_records=(rep.damaged + rep.out_of_order) if rep else 0,
            missing_records=rep.missing if rep else 0,
            torn_bytes=rep.torn_bytes if rep else 0,
            header_mismatch=mismatch,
            headerless=headerless,
            bad_payload=int(np.count_nonzero(~good)),
            device_blocks=len(found),
            torn_blocks=torn_blocks,
            unjournaled=unjournaled,
        )
        if st.state in ("missing", "empty") and found:
            r.problems.append(f"the journal is {st.state} but the device holds {len(found)} blocks")
        if r.damaged_records:
            r.problems.append(f"{r.damaged_records} damaged journal records")
        if r.missing_records:
            r.problems.append(f"{r.missing_records} journal records missing (sequence gaps)")
        if r.torn_bytes:
            r.problems.append(f"a torn journal tail of {r.torn_bytes} bytes")
        if r.header_mismatch:
            r.problems.append(f"{r.header_mismatch} blocks whose header disagrees with the journal")
        if r.bad_payload:
            r.problems.append(f"{r.bad_payload} journaled blocks fail their checksum")
        return r
    finally:
        os.close(lock)


def repair(
    path: str | os.PathLike[str],
    journal: str | None = None,
    *,
    capacity: int | None = None,
    segment_bytes: int | None = None,
) -> RepairReport:
    """Rebuilds a damaged, empty or missing journal (see the module doc).

    The geometry comes from the old journal's header when it is readable,
    else from ``capacity`` / ``segment_bytes``, else from the backing's size
    and the segment size the block headers record.
    """
    backing, jpath = resolve(path, journal)
    lock = jn.lock_file(jpath + ".lock")
    try:
        st = _read_journal(backing, jpath)
        if st.state == "ok":
            n = int(st.replay.puts.size) if st.replay else 0
            return RepairReport(backing, jpath, False, n, n, 0, 0, "")
        hdr = st.header
        cap = hdr.capacity if hdr else capacity
        found, _ = blockhdr.scan(backing, cap)
        seg = hdr.segment_bytes if hdr else segment_bytes
        if seg is None:
            segs = [b.segment_bytes for b in found if b.segment_bytes]
            if not segs:
                raise InvalidArgument(
                    None,
                    f"{backing}: no block headers found and no journal header to take the "
                    "geometry from; nothing to rebuild (pass segment_bytes to write an empty one)",
                )
            seg = max(set(segs), key=segs.count)
        if cap is None:
            cap = os.stat(backing).st_size
        rep = st.replay
        puts = rep.puts if rep is not None else np.zeros(0, dtype=jn.REC_DTYPE)
        metas = list(rep.metas or [b""] * puts.size) if rep is not None else []
        fd = os.open(backing, os.O_RDONLY | os.O_CLOEXEC)
        try:
            good, _, _ = _verify(fd, puts)
        finally:
            os.close(fd)
        keep: dict[tuple[int, int], tuple[np.ndarray[Any, Any], bytes]] = {}
        for i in np.flatnonzero(good).tolist():
            r = puts[i : i + 1].copy()
            keep[(int(r["hi"][0]), int(r["lo"][0]))] = (r, metas[i] if i < len(metas) else b"")
        from_journal = len(keep)
        from_device = 0
        n_seg = cap // seg
        for b in found:
            old = keep.get((b.hi, b.lo))
            if old is not None and int(old[0]["epoch"][0]) >= b.epoch:
                continue
            if b.addr // seg >= n_seg or b.addr + b.length > n_seg * seg:
                continue
            ent = np.zeros(1, dtype=jn.REC_DTYPE)  # the fields of an index entry
            ent["segment"] = b.addr // seg
            ent["hi"], ent["lo"] = b.hi, b.lo
            ent["addr"], ent["length"] = b.addr, b.length
            ent["checksum"], ent["epoch"], ent["device"] = b.checksum, b.epoch, b.device
            r = jn.put_records(ent)
            if old is not None:  # a newer put of the key than the journal lists
                from_journal -= 1
            keep[(b.hi, b.lo)] = (r, b"")
            from_device += 1
        rows = sorted(keep.values(), key=lambda x: int(x[0]["epoch"][0]))
        live = np.concatenate([r for r, _ in rows]) if rows else np.zeros(0, dtype=jn.REC_DTYPE)
        kept = ""
        if st.state != "missing" and os.path.getsize(jpath) > 0:
            kept = jn.keep_aside(jpath)
        block_bytes = hdr.block_bytes if hdr else 0
        jn.write_new(jpath, cap, seg, block_bytes, jn.records(live, [m for _, m in rows]))
        return RepairReport(
            backing,
            jpath,
            True,
            int(live.size),
            from_journal,
            from_device,
            int(np.count_nonzero(~good)),
            kept,
        )
    finally:
        os.close(lock)
