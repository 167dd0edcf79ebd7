"""Power-cut testing of the KV store, in the spirit of dm-log-writes / CrashMonkey.

SIGKILL leaves the page cache and the drive's volatile cache intact; a power
cut does not. This harness records every write and every barrier that reach
the store's two files, then rebuilds the files as a power cut at many
moments could have left them and checks each rebuilt store.

**Where it records.** In Python, at the two objects through which the store
does all its file I/O (the choice this module makes: the C backend's own
pwrites are asynchronous and not visible from here, but every byte they
write is one the store handed to ``device.write``):

* the device: each ``write(addr, data)`` that was admitted is a write of
  those bytes at ``addr`` (the payload, its zero padding and its header
  sector, :mod:`chm.kv.blockhdr`); each ``flush()`` that returned is a
  barrier of the backing (every write before it is on stable storage);
* the journal: each ``append`` is a write of the appended bytes at the end
  of the file; each ``sync`` (``fdatasync``) is a barrier of the journal;
  each compaction (a synced temporary file renamed over the journal and
  the directory synced: ``Journal.compact_finish``) is an atomic
  replacement of the whole file, a barrier too.

**Crash states.** For every barrier in the log: the files exactly as the
prefix of the log up to it leaves them; and ``subsets`` random states more,
where each write since the last barrier *of its file* up to the next
barrier (of either file) reached the medium or not, independently, per
512-byte sector (a torn write; a journal sector that did not make it reads
as zeros). A write before a file's last barrier is always there.

**The check.** Each state is written to a fresh directory (a sparse
``kv.img`` and its ``kv.img.kvjournal``) and opened with ``Store.open`` on
the real ``pread`` backend (O_DIRECT). It must open; every block whose
``flush()`` had returned before the crash and that was neither removed nor
evicted by then must load, byte-exact; any block that loads at all must hold
exactly the bytes (and the metadata) that were put under its key (each key
is put once, its bytes and metadata a function of the key), never another's. Keys that a crash may
legitimately keep or lose (put but not yet flushed, removed but the removal
not yet synced) are only held to the second rule.

The workload (:func:`record`) is seeded: puts of 1-4 blocks of random
lengths, removes, flushes and compactions, on a device small enough that
segments are reclaimed (eviction) during the run.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from chm.kv.store import PutStatus, Store

__all__ = [
    "GEOMETRY",
    "Log",
    "PowerCutReport",
    "block_for",
    "meta_for",
    "record",
    "replay",
    "run",
]

SECTOR = 512
GEOMETRY: dict[str, Any] = {
    "capacity": "2M",
    "dram": "1M",
    "slot_size": "64K",
    "backend": "pread",
    "device_options": {"wbuf": "512K"},
}


def block_for(key: int) -> np.ndarray[Any, Any]:
    """The bytes put under ``key``: their length and contents follow from it."""
    rng = np.random.default_rng(key)
    n = int(rng.integers(1, 64 * 1024 + 1))
    return rng.integers(0, 256, n, dtype=np.uint8)


def meta_for(key: int) -> bytes:
    """The metadata put with ``key``: none, or up to three META records."""
    return f"meta of {key};".encode() * (key % 4)


@dataclass
class Log:
    """The recorded run: ops in order, each a tuple whose first item is its kind.

    ``("dw", addr, bytes)`` a device write, ``("db",)`` a device barrier,
    ``("jw", offset, bytes)`` a journal append, ``("jb",)`` a journal
    barrier, ``("jr", bytes)`` the journal replaced (a barrier), ``("ack",
    keys)`` a flush returned and ``keys`` were durable then, ``("gone",
    keys)`` keys left the store (removed or evicted).
    """

    ops: list[tuple[Any, ...]] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)  # every key put
    capacity: int = 0
    evicted: int = 0  # blocks the run's store evicted (reclaimed segments)
    compactions: int = 0

    @property
    def barriers(self) -> list[int]:
        return [i for i, op in enumerate(self.ops) if op[0] in ("db", "jb", "jr")]


class _RecordingDevice:
    """A real device whose admitted writes and returned flushes are logged."""

    def __init__(self, dev: Any, log: Log) -> None:
        self._dev = dev
        self._log = log

    def write(self, addr: int, data: Any) -> bool:
        ok = bool(self._dev.write(addr, data))
        if ok:
            self._log.ops.append(("dw", int(addr), bytes(memoryview(data).cast("B"))))
        return ok

    def flush(self, timeout: float | None = None) -> None:
        self._dev.flush(timeout)
        self._log.ops.append(("db",))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dev, name)


def _record_journal(st: Store, log: Log) -> None:
    """Logs the store's journal I/O (see the module doc)."""
    j = st._journal
    append, sync, finish = j.append, j.sync, j.compact_finish

    def rec_append(recs: Any) -> None:
        before = j._size
        append(recs)
        with open(j.path, "rb") as f:
            f.seek(before)
            log.ops.append(("jw", before, f.read(j._size - before)))

    def rec_sync() -> None:
        sync()
        log.ops.append(("jb",))

    def rec_finish(tmp: str, n_live: int) -> None:
        finish(tmp, n_live)  # every compaction ends here (the rename)
        log.ops.append(("jr", Path(j.path).read_bytes()))

    j.append = rec_append  # type: ignore[method-assign]
    j.sync = rec_sync  # type: ignore[method-assign]
    j.compact_finish = rec_finish  # type: ignore[method-assign]
    log.ops.append(("jr", Path(j.path).read_bytes()))


def record(directory: str | os.PathLike[str], seed: int, ops: int) -> Log:
    """Runs a seeded workload of ``ops`` operations on a new store in
    ``directory`` and returns its log."""
    import chm

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    log = Log()
    g = dict(GEOMETRY)
    dev = chm.Device.open(
        targets=[d / "kv.img"],
        capacity=g["capacity"],
        dram=g["dram"],
        slot_size=g["slot_size"],
        object_size=g["slot_size"],
        backend=g["backend"],
        mode="prefetch",
        create=True,
        **g["device_options"],
    )
    log.capacity = int(dev.capacity)
    rdev = _RecordingDevice(dev, log)
    st = Store(rdev, journal=d / "kv.img.kvjournal")
    try:
        _record_journal(st, log)
        next_key = seed * 1_000_000 + 1
        durable: set[int] = set()
        pending: set[int] = set()
        for _ in range(ops):
            r = rng.random()
            if r < 0.55:
                keys = list(range(next_key, next_key + rng.randint(1, 4)))
                next_key += len(keys)
                res = st.put(keys, [block_for(k) for k in keys], [meta_for(k) for k in keys])
                for k, s in zip(keys, res, strict=True):
                    if s == PutStatus.STORED:
                        pending.add(k)
                        log.keys.append(k)
            elif r < 0.68 and durable:
                keys = rng.sample(sorted(durable), min(len(durable), rng.randint(1, 2)))
                st.remove(keys)
            elif r < 0.93:
                st.flush()
                now = st.contains(sorted(durable | pending)) if durable | pending else []
                durable = {k for k, c in zip(sorted(durable | pending), now, strict=True) if c}
                pending = set()
                log.ops.append(("ack", frozenset(durable)))
            else:
                st.compact()
            # keys that left the store (removed or evicted) since the last look
            if durable:
                ks = sorted(durable)
                left = {k for k, c in zip(ks, st.contains(ks), strict=True) if not c}
                if left:
                    durable -= left
                    log.ops.append(("gone", frozenset(left)))
            pending = {
                k for k, c in zip(sorted(pending), st.contains(sorted(pending)), strict=True) if c
            }
        log.evicted = st.stats().evicted_blocks
        log.compactions = st.stats().compactions
    finally:
        st.close(flush=False)
        dev.close()
    return log


@dataclass
class PowerCutReport:
    """What :func:`replay` checked and found."""

    states: int = 0  # crash states opened and checked
    barriers: int = 0
    writes: int = 0  # device writes + journal appends in the log
    acked_checked: int = 0  # (state, acknowledged block) pairs that had to load
    lost: list[str] = field(default_factory=list)  # acknowledged blocks missing
    wrong: list[str] = field(default_factory=list)  # blocks that loaded other bytes
    failed_open: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.wrong or self.failed_open)


def _sectors(addr: int, data: bytes) -> list[tuple[int, bytes]]:
    return [(addr + o, data[o : o + SECTOR]) for o in range(0, len(data), SECTOR)]


def _state(
    log: Log, cut: int, nxt: int, rng: random.Random | None, drop_durable: bool = False
) -> tuple[dict[int, bytes], bytes]:
    """The device sectors and the journal bytes of one crash state: every op
    before a file's last barrier at or before ``cut``; with ``rng``, a random
    subset (per sector) of that file's writes after it up to ``nxt``.
    ``drop_durable`` (a negative control) loses every device write, as a
    drive that acknowledges flushes and keeps nothing would."""
    ops = log.ops
    last_db = max((i for i in range(cut + 1) if ops[i][0] == "db"), default=-1)
    last_jb = max((i for i in range(cut + 1) if ops[i][0] in ("jb", "jr")), default=-1)
    dev: dict[int, bytes] = {}
    journal = bytearray()
    for i in range(nxt + 1 if rng is not None else cut + 1):
        op = ops[i]
        kind = op[0]
        if kind == "dw":
            durable = i < last_db
            if drop_durable:
                continue
            for a, s in _sectors(op[1], op[2]):
                if durable or (rng is not None and rng.random() < 0.5):
                    dev[a] = s
        elif kind == "jr":
            if i <= last_jb:
                journal = bytearray(op[1])
        elif kind == "jw":
            off, data = op[1], op[2]
            if i < last_jb:
                journal[off : off + len(data)] = data
                continue
            if rng is None:
                continue
            for o in range(0, len(data), SECTOR):
                if rng.random() < 0.5:
                    chunk = data[o : o + SECTOR]
                    end = off + o + len(chunk)
                    if len(journal) < end:
                        journal.extend(bytes(end - len(journal)))
                    journal[off + o : end] = chunk
    return dev, bytes(journal)


def _must(log: Log, cut: int, nxt: int) -> set[int]:
    """Blocks acknowledged by a flush before ``cut`` and still in the store
    up to ``nxt``."""
    acked: frozenset[int] = frozenset()
    for i in range(cut + 1):
        if log.ops[i][0] == "ack":
            acked = log.ops[i][1]
    must = set(acked)
    for i in range(nxt + 1):
        if log.ops[i][0] == "gone":
            must -= log.ops[i][1]
    return must


def _runs(dev: dict[int, bytes]) -> list[tuple[int, bytes]]:
    """The sectors as runs of contiguous ones: (address, bytes)."""
    out: list[tuple[int, bytes]] = []
    parts: list[bytes] = []
    start = end = -1
    for a in sorted(dev):
        if a != end:
            if parts:
                out.append((start, b"".join(parts)))
            start, parts = a, []
        parts.append(dev[a])
        end = a + SECTOR
    if parts:
        out.append((start, b"".join(parts)))
    return out


_bufs: list[np.ndarray[Any, Any]] = []


def _buffers(n: int) -> list[np.ndarray[Any, Any]]:
    """n load buffers of a slot, reused from state to state."""
    while len(_bufs) < n:
        _bufs.append(np.zeros(64 * 1024, np.uint8))
    for b in _bufs[:n]:
        b.fill(0)  # nothing of an earlier state can pass for a load
    return _bufs[:n]


def _check(
    log: Log, dev: dict[int, bytes], journal: bytes, must: set[int], where: str, rep: PowerCutReport
) -> None:
    d = Path(tempfile.mkdtemp(prefix="powercut-", dir=_scratch))
    try:
        with open(d / "kv.img", "wb") as f:
            f.truncate(log.capacity)
            for a, run in _runs(dev):
                f.seek(a)
                f.write(run)
        (d / "kv.img.kvjournal").write_bytes(journal)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # damage found at open is reported in stats
                st = Store.open(d, **GEOMETRY)
        except Exception as exc:
            rep.failed_open.append(f"{where}: {type(exc).__name__}: {exc}")
            return
        try:
            rep.states += 1
            keys = log.keys
            outs = _buffers(len(keys))
            got = st.get(keys, outs) if keys else []
            metas = st.meta(keys) if keys else []
            for k, o, g, m in zip(keys, outs, got, metas, strict=True):
                want = block_for(k)
                if g and not np.array_equal(o[: want.size], want):
                    rep.wrong.append(f"{where}: key {k}")
                if g and m != meta_for(k):
                    rep.wrong.append(f"{where}: key {k}: metadata {m!r}")
                if k in must:
                    rep.acked_checked += 1
                    if not g:
                        rep.lost.append(f"{where}: key {k}")
        finally:
            st.close(flush=False)
    finally:
        shutil.rmtree(d, ignore_errors=True)


_scratch: str | None = None


def replay(
    log: Log,
    scratch: str | os.PathLike[str],
    *,
    subsets: int = 2,
    seed: int = 0,
    drop_durable: bool = False,
) -> PowerCutReport:
    """Checks the crash states of ``log`` (see the module doc), each
    rebuilt under ``scratch``."""
    global _scratch
    _scratch = os.fspath(scratch)
    rng = random.Random(seed)
    rep = PowerCutReport()
    bars = log.barriers
    rep.barriers = len(bars)
    rep.writes = sum(1 for op in log.ops if op[0] in ("dw", "jw"))
    for n, cut in enumerate(bars):
        nxt = bars[n + 1] if n + 1 < len(bars) else len(log.ops) - 1
        must = _must(log, cut, cut)
        dev, j = _state(log, cut, cut, None, drop_durable)
        _check(log, dev, j, must, f"barrier {n} (op {cut})", rep)
        must_n = _must(log, cut, nxt)
        for s in range(subsets):
            dev, j = _state(log, cut, nxt, rng, drop_durable)
            _check(log, dev, j, must_n, f"barrier {n} (op {cut}) + in-flight subset {s}", rep)
    return rep


def run(
    directory: str | os.PathLike[str], *, seed: int = 0, ops: int = 40, subsets: int = 2
) -> PowerCutReport:
    """:func:`record` then :func:`replay`, in ``directory``."""
    d = Path(directory)
    log = record(d / "run", seed, ops)
    scratch = d / "states"
    scratch.mkdir(exist_ok=True)
    return replay(log, scratch, subsets=subsets, seed=seed)
