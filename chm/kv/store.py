"""The KV block store: index + allocator + journal over one device.

    with Store.open("/var/tmp/kv", capacity="8G") as st:
        st.put([h1, h2], [blk1, blk2])   # -> [STORED, STORED]
        st.flush()                       # durable: found after a crash
        st.prefix_len([h1, h2, h3])      # -> 2
        st.get([h1], [out])              # -> [True], out holds blk1's bytes

Keys are engine block hashes in the store's :class:`Namespace` (or
``KEY_DTYPE`` arrays of digests). A put writes the block through the
device's write buffer; the index learns it only once it is readable, marks
it durable once ``flush()`` has made it so, and journals it then. Every load
verifies the block's XXH3-64: a torn or corrupted block is a miss, counted
in ``stats().checksum_errors``, and is dropped from the index. Every method
is thread-safe; the store's lock covers decisions only: a put's checksum and
device write, the data of a load, the device's flush, the journal's
fdatasync and the writing of a compacted journal run without it. A block
being written is in no index and its segment is pinned against reclaim;
the put publishes it when the write returns (see ``_put_blocks``).

On a backend that stores bytes each block is written with a header sector
after its payload (:mod:`chm.kv.blockhdr`), so ``chm-emu kv repair`` can
rebuild a lost journal from the device. Damage is reported, never hidden:
a damaged journal is counted in ``stats()``, warned about
(:class:`JournalDamageWarning`) and kept aside; a lost journal beside
blocks is :class:`chm.errors.Damaged`; a reopening whose slots cannot hold
the stored blocks is refused (InvalidArgument naming what to pass).
"""

from __future__ import annotations

import concurrent.futures
import enum
import logging
import os
import stat
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import xxhash

from chm.errors import Busy, Cancelled, ChmError, InvalidArgument
from chm.kv import blockhdr
from chm.kv import journal as jn
from chm.kv.alloc import ALIGN, SegmentLog
from chm.kv.buffers import as_dst, as_src
from chm.kv.index import DURABLE, FREE, PENDING, Index
from chm.kv.keys import KEY_DTYPE, Namespace
from chm.kv.lookup import LOOKUP_BATCH, Lookup, prefix_hits
from chm.kv.protocol import DeviceLike
from chm.kv.residency import DEFAULT as _DEFAULT_ADMISSION
from chm.kv.residency import Admission, make_admission
from chm.kv.tickets import Ticket
from chm.kv.window import WINDOW_BYTES, KVManager

__all__ = ["DROP_DTYPE", "MAX_META", "JournalDamageWarning", "PutStatus", "Store", "StoreStats"]

# Store.take_drops(): a block the store dropped on its own (its key and the
# epoch of the put that stored it)
DROP_DTYPE = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("epoch", "<u8")])

_T = TypeVar("_T")
_log = logging.getLogger(__name__)
MAX_META = jn.MAX_META  # metadata bytes per key
_ENTRY_FIELDS = ("addr", "length", "checksum", "epoch", "segment", "device", "pins", "state")
_hash = xxhash.xxh3_64_intdigest
_ZEROS = bytes(512)


class JournalDamageWarning(UserWarning):
    """Opening a store found damaged journal records (skipped, counted in
    :class:`StoreStats`, the journal kept aside): run ``chm-emu kv check``."""


class PutStatus(enum.IntEnum):
    """Outcome of one key of a put."""

    STORED = 0  # written (readable now, durable after flush())
    EXISTS = 1  # the key was there (earlier in the batch, or a concurrent put published it first)
    SKIPPED = 2  # not written: the write buffer was full, or no segment could be reclaimed
    ERROR = 3  # the device failed the write


_COUNTERS = (
    "puts_stored",
    "puts_exists",
    "puts_skipped",
    "puts_error",
    "gets_hit",
    "gets_miss",
    "checksum_errors",
    "io_errors",
    "timeouts",
    "window_blocked",
    "evicted_blocks",
    "autoflushes",
    "autoflush_errors",
)


@dataclass(frozen=True)
class StoreStats:
    """A snapshot of the store's counters and capacity accounting."""

    entries: int
    durable_entries: int
    pending_entries: int
    index_bytes: int
    capacity_bytes: int
    segment_bytes: int
    segments: int
    segments_free: int
    segments_pinned: int
    allocated_bytes: int
    live_bytes: int
    reclaimed_segments: int
    journal_path: str
    journal_bytes: int
    journal_records: int
    compactions: int
    recovered_entries: int
    recovery_dropped: int
    torn_journal_bytes: int
    journal_damaged_records: int  # bad records skipped in the middle of the journal at open
    journal_missing_records: int  # records a gap in the sequence numbers showed were lost
    journal_kept_aside: str  # where the damaged journal was copied at open ("" if it was clean)
    puts_stored: int
    puts_exists: int
    puts_skipped: int
    puts_error: int
    gets_hit: int
    gets_miss: int
    checksum_errors: int
    io_errors: int
    timeouts: int
    window_blocked: int  # prefetches a load could not issue (the refill queue was full)
    evicted_blocks: int
    autoflushes: int  # flushes the periodic flusher ran (flush_interval)
    autoflush_errors: int  # of those, how many failed (their blocks are misses)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_meta(meta: Sequence[bytes | None] | None, n: int) -> list[bytes]:
    """put()'s per-key metadata, checked: bytes-like of at most MAX_META bytes."""
    if meta is None:
        return [b""] * n
    if isinstance(meta, (bytes, bytearray, memoryview, str)) or len(meta) != n:
        raise InvalidArgument(None, f"put: meta must be a sequence of {n} bytes (or None) values")
    out = []
    for j, m in enumerate(meta):
        if m is None:
            out.append(b"")
            continue
        if not isinstance(m, (bytes, bytearray, memoryview)):
            raise InvalidArgument(None, f"put: meta {j} is {type(m).__name__}, not bytes")
        b = bytes(m)
        if len(b) > MAX_META:
            raise InvalidArgument(None, f"put: meta {j} has {len(b)} bytes; at most {MAX_META}")
        out.append(b)
    return out


def _admission(choice: str | Admission | None, entries: int) -> Admission | None:
    """``"auto"``: the default admission when the device has a resident
    region, else none; a name of :data:`chm.kv.residency.POLICIES`; an
    Admission; None (never retain)."""
    if choice is None or (choice == "auto" and entries == 0):
        return None
    if isinstance(choice, str):
        return make_admission(_DEFAULT_ADMISSION if choice == "auto" else choice, entries)
    return choice


def _local_backing(dev: DeviceLike) -> str | None:
    """The device's target when it is a local device on one regular file
    (where device addresses are file offsets and a lost journal's blocks can
    be looked for), else None."""
    from chm.device import Device

    if not isinstance(dev, Device):
        return None
    targets = dev.config.targets
    if not targets or len(targets) != 1:
        return None
    try:
        return str(targets[0]) if stat.S_ISREG(os.stat(targets[0]).st_mode) else None
    except OSError:
        return None


def _thread_safe_io(dev: DeviceLike) -> bool:
    """Whether the device's data calls may run from several threads at
    once: an embedded chm.Device, whose C core reserves a write's space
    under its lock and copies with it dropped. A daemon client
    (chm.remote.RemoteDevice) moves the bytes of a write or a direct read
    through one shared area per connection, which it holds for each such
    call: they run one at a time whatever the store does, so the store
    queues them itself rather than have puts wait inside the client."""
    from chm.device import Device

    return isinstance(dev, Device)


def _default_journal(dev: DeviceLike) -> str:
    targets = dev.config.targets
    if targets:
        t = targets[0]
        try:
            regular = stat.S_ISREG(os.stat(t).st_mode)
        except OSError:
            regular = False
        if regular:
            return t + ".kvjournal"
    raise InvalidArgument(
        None,
        f"Store: no journal path given and the device's first target "
        f"({targets[0] if targets else 'none'}) is not a regular file to put one beside; "
        "pass journal=PATH",
    )


class _Blocks:
    """The store as a :class:`chm.kv.lookup.BlockSource`: what its lookups use."""

    __slots__ = ("_st",)

    def __init__(self, st: Store) -> None:
        self._st = st

    @property
    def device(self) -> DeviceLike:
        return self._st.device

    @property
    def manager(self) -> KVManager:
        return self._st.manager

    @property
    def read_path(self) -> str:
        return self._st.read_path

    @property
    def has_bytes(self) -> bool:
        return self._st.has_bytes

    @property
    def window_bytes(self) -> int:
        return self._st.window_bytes

    def pin(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return self._st._pin_rows(rows)

    def unpin(self, rows: np.ndarray[Any, Any], ents: np.ndarray[Any, Any], bad: list[int]) -> None:
        self._st._unpin_rows(rows, ents, bad)

    def retain(self, addrs: list[int]) -> list[bool] | None:
        return self._st._retain_mask(addrs)

    def count(self, name: str, n: int = 1) -> None:
        self._st._count(name, n)

    def read_into(self, addr: int, dst: Any) -> int:
        io = self._st._io_lock
        if io is None:
            return self._st.device.read_into(addr, dst)
        with io:
            return self._st.device.read_into(addr, dst)


class Store:
    """KV blocks on one device (see the module doc).

    ``segment_bytes`` (default: 8 slots) is the unit of eviction;
    ``eviction`` is ``"lru"`` or ``"fifo"``; ``manager`` shares the staging
    window among concurrent loads (default: one per store, sized to the
    device's slots); ``device_id`` is the number written into index entries
    (an AddressSpace numbers its devices). ``own_device`` closes it with
    the store. ``flush_interval`` (seconds) starts a thread that flushes
    whatever is pending that often, so a block put is durable within about
    that long without anyone calling flush(). The device is in prefetch
    mode (loads go through the staging window) or lru mode (loads read through the device's cache:
    ``read_path``); on the ghost backend blocks have no bytes, so loads run
    the device's calls without copying or verifying (for virtual-time runs).
    ``residency`` picks the blocks a device with a resident region keeps in
    its DRAM (:mod:`chm.kv.residency`; ``"auto"``: the default admission
    when the device has a region). ``capacity`` (default: the device's)
    bounds the addresses the store places blocks at to ``[0, capacity)``;
    ``block_bytes`` (default: a slot, at most a slot) is the largest block it
    takes, so a segment of that size holds one block (eviction is then exact
    block LRU).
    """

    def __init__(
        self,
        device: DeviceLike,
        *,
        journal: str | os.PathLike[str] | None = None,
        namespace: Namespace | None = None,
        segment_bytes: int | None = None,
        eviction: str = "lru",
        device_id: int = 0,
        window_bytes: int = WINDOW_BYTES,
        manager: KVManager | None = None,
        compact_ratio: float = 2.0,
        own_device: bool = False,
        flush_interval: float | None = None,
        residency: str | Admission | None = "auto",
        capacity: int | None = None,
        block_bytes: int | None = None,
    ) -> None:
        cfg = device.config
        dev_cap = int(device.capacity)
        if capacity is None:
            capacity = dev_cap
        if (
            isinstance(capacity, bool)
            or not isinstance(capacity, int)
            or not (0 < capacity <= dev_cap)
        ):
            raise InvalidArgument(
                None, f"Store: capacity={capacity!r}: expected bytes in 1..{dev_cap} (the device)"
            )
        if cfg.mode not in ("prefetch", "lru"):
            raise InvalidArgument(
                None, f"Store: needs a device in prefetch or lru mode, not mode={cfg.mode!r}"
            )
        # how loads move blocks: "window" (prefetch mode: issue-wait-release
        # through the staging window), "direct" (lru mode: reads through the
        # device's cache; its prefetches pin nothing), "timing" (ghost
        # backend: the window's calls run, no bytes exist to copy or verify)
        self.read_path = (
            "direct" if cfg.mode == "lru" else "timing" if cfg.backend == "ghost" else "window"
        )
        self.device = device
        # the ghost backend holds no bytes: loads neither copy nor verify them
        self.has_bytes = cfg.backend != "ghost"
        self.namespace = namespace or Namespace()
        self.slot_bytes = int(device.slot_bytes)
        if block_bytes is None:
            block_bytes = self.slot_bytes
        if (
            isinstance(block_bytes, bool)
            or not isinstance(block_bytes, int)
            or not 0 < block_bytes <= self.slot_bytes
        ):
            raise InvalidArgument(
                None,
                f"Store: block_bytes={block_bytes!r}: expected bytes in 1..{self.slot_bytes} "
                "(a slot)",
            )
        path = os.fspath(journal) if journal is not None else _default_journal(device)
        if segment_bytes is not None:
            seg = segment_bytes
        elif (stored := jn.stored_segment_bytes(path)) is not None:
            seg = stored  # an existing store keeps its geometry
        elif self.has_bytes:  # 8 blocks (fewer on a small device), each with its header
            fp = -(-blockhdr.footprint(block_bytes) // ALIGN) * ALIGN
            seg = max(1, min(8, capacity // (2 * fp))) * fp
        else:
            seg = 8 * self.slot_bytes
        if seg < block_bytes:
            what = "a slot" if block_bytes == self.slot_bytes else "block_bytes"
            raise InvalidArgument(
                None,
                f"Store: segment_bytes={seg} is smaller than {what} ({block_bytes}): "
                "a block must fit a segment",
            )
        # blocks carry their header on the device unless a segment is too
        # small for the largest block and its header (a segment of exactly
        # one block: exact block LRU for a replay's tier); such a store's
        # blocks cannot be rebuilt from the device (chm-emu kv repair)
        self.block_headers = self.has_bytes and seg >= blockhdr.footprint(block_bytes)
        self.max_block = block_bytes
        self.window_bytes = window_bytes
        self.device_id = device_id
        self._own = own_device
        self._alloc = SegmentLog(capacity, seg, eviction)
        st = device.stats()
        self.manager = manager or KVManager(max(1, int(st.slots_total)))
        self.admission = _admission(residency, int(st.resident_entries_total))
        self._lock = threading.RLock()
        self._blocks = _Blocks(self)  # what lookups use of the store
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._changes = 0  # index inserts and deletes so far (a put skips a lookup when none)
        self._pending: dict[int, int] = {}  # row -> epoch, written but not yet durable
        # row -> epoch: PUT records appended by a flush that is syncing them
        self._syncing: dict[int, int] = {}
        self._sync_lock = threading.Lock()  # a journal sync, a compaction, the close
        self._compact_lock = threading.Lock()  # one compaction at a time
        self._compact_ratio = compact_ratio
        self._closed = False
        self._closing = False  # close() began: new puts are refused
        self._putting = 0  # put calls under way (close waits for them)
        self._idle = threading.Condition(self._lock)  # _putting fell to 0
        # (hi, lo, epoch) of the blocks dropped on their own, while watch_drops() is on
        self._drops: list[tuple[int, int, int]] | None = None
        self._drops_limit = 0
        self.drops_unreported = 0  # records watch_drops()'s limit discarded
        # The device writes of a put run with the store unlocked, unless they
        # can neither copy nor sleep (the ghost backend on the virtual clock:
        # a replay), where the whole put keeps the lock and its index and
        # journal updates are applied once per call.
        self._write_unlocked = self.has_bytes or cfg.get("clock") != "virtual"
        # An embedded chm.Device takes concurrent writes (each reserves its
        # space under the device's lock and copies unlocked); another device
        # (the daemon client, whose data goes through one shared area per
        # connection) gets the store's data calls one at a time.
        self._io_lock = None if _thread_safe_io(device) else threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        if flush_interval is not None and (
            isinstance(flush_interval, bool)
            or not isinstance(flush_interval, (int, float))
            or not 0 < flush_interval < 1e6
        ):
            raise InvalidArgument(
                None, f"Store: flush_interval={flush_interval!r}: expected seconds > 0, or None"
            )
        self._journal = jn.Journal(
            path,
            capacity,
            seg,
            backing=_local_backing(device) if self.has_bytes else None,
            block_bytes=block_bytes,
        )
        try:
            self._recover()
        except BaseException:
            self._journal.close()
            raise
        self.flush_interval = flush_interval
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if flush_interval is not None:
            self._flusher = threading.Thread(
                target=self._autoflush,
                args=(float(flush_interval),),
                name="chm-kv-flush",
                daemon=True,
            )
            self._flusher.start()

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        capacity: int | str = "1G",
        backend: str = "uring",
        dram: int | str | None = None,
        slot_size: int | str | None = None,
        mode: str = "prefetch",
        device_options: dict[str, Any] | None = None,
        **store_options: Any,
    ) -> Store:
        """Opens (creating) a store in ``directory``: ``kv.img`` and ``kv.img.kvjournal``.

        The device is opened here and closed with the store.
        """
        import chm

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        opts: dict[str, Any] = dict(device_options or {})
        if slot_size is not None:
            opts["slot_size"] = slot_size
            # the block size: sizes the write buffer for whole blocks too
            opts.setdefault("object_size", slot_size)
        dev = chm.Device.open(
            targets=[d / "kv.img"],
            capacity=capacity,
            dram=dram,
            backend=backend,
            mode=mode,
            create=True,
            **opts,
        )
        try:
            return cls(dev, own_device=True, **store_options)
        except BaseException:
            dev.close()
            raise

    def _retain_mask(self, addrs: list[int]) -> list[bool] | None:
        """Which blocks of a load the device should keep resident (None: none)."""
        if self.admission is None or not addrs:
            return None
        with self._lock:
            return self.admission.decide(addrs)

    # ---- recovery

    def _recover(self) -> None:
        rep = self._journal.replay
        puts = rep.puts
        seg_bytes = self._alloc.segment_bytes
        self._refuse_smaller_blocks(puts)
        ok = (
            (puts["addr"] % ALIGN == 0)
            & (puts["length"] > 0)
            & (puts["length"] <= self.max_block)
            & (puts["addr"] + puts["length"] <= self._alloc.n * seg_bytes)
            & (puts["addr"] // seg_bytes == puts["segment"])
        )
        self.recovery_dropped = int(np.count_nonzero(~ok))
        puts = puts[ok]
        self.torn_journal_bytes = rep.torn_bytes
        keys = np.zeros(puts.size, dtype=KEY_DTYPE)
        keys["hi"], keys["lo"] = puts["hi"], puts["lo"]
        self._index = Index(max(1024, 2 * int(puts.size)))
        rows = self._index.put(
            keys,
            addr=puts["addr"],
            length=puts["length"],
            checksum=puts["checksum"],
            epoch=puts["epoch"],
            segment=puts["segment"],
            device=self.device_id,
            state=DURABLE,
        )
        # segment -> index rows put into it since it was last reused (lazy:
        # a row dropped meanwhile is still listed; _segment_rows checks them)
        self._seg_rows: dict[int, list[int]] = {}
        # segments whose current blocks may have PUT records in the journal:
        # only their reclaim needs a RECLAIM record (a superset is safe)
        self._journaled: set[int] = set(puts["segment"].tolist())
        for r, sg in zip(rows.tolist(), puts["segment"].tolist(), strict=True):
            if r >= 0:
                self._seg_rows.setdefault(int(sg), []).append(r)
        metas = [m for m, keep in zip(rep.metas or [], ok.tolist(), strict=False) if keep]
        # row -> the block's metadata, for blocks that have any
        self._meta: dict[int, bytes] = {
            int(r): m for r, m in zip(rows.tolist(), metas, strict=False) if m and r >= 0
        }
        ends = puts["addr"].astype(np.int64) + self._footprints(puts["length"])
        self._alloc.restore(puts["segment"], ends, puts["length"], puts["epoch"])
        self._epoch = rep.max_epoch + 1
        self.recovered_entries = int(puts.size)
        self.journal_upgraded_from = 0
        self.journal_damaged_records = rep.damaged + rep.out_of_order
        self.journal_missing_records = rep.missing
        self.journal_kept_aside = self._journal.kept_aside or ""
        if not rep.clean:
            if rep.damaged or rep.missing or rep.out_of_order:
                warnings.warn(
                    f"{self._journal.path}: {self.journal_damaged_records} damaged journal "
                    f"records skipped (at offsets {rep.damaged_at[:8]}), "
                    f"{rep.missing} missing; {self.recovered_entries} entries recovered from "
                    f"the rest; the damaged journal is kept at {self.journal_kept_aside}. "
                    "Blocks it lost can be found on the device: chm-emu kv check / kv repair",
                    JournalDamageWarning,
                    stacklevel=4,
                )
            self._compact()  # the kept-aside copy holds the file as it was
        elif rep.version < jn.VERSION:  # rewritten in the current format before any append
            self.journal_upgraded_from = rep.version
            self._compact()

    def _footprints(self, lengths: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Device bytes of blocks of ``lengths`` (with their headers, on a
        backend that stores bytes)."""
        n = lengths.astype(np.int64)
        if not self.block_headers:
            return n
        out: np.ndarray[Any, Any] = -(-n // blockhdr.SECTOR) * blockhdr.SECTOR + blockhdr.SECTOR
        return out

    def _refuse_smaller_blocks(self, puts: np.ndarray[Any, Any]) -> None:
        """InvalidArgument (nothing changed) when the journal holds blocks
        longer than this store takes: opening would drop them for good."""
        if puts.size == 0:
            return
        longest = int(puts["length"].max())
        if longest <= self.max_block:
            return
        n = int(np.count_nonzero(puts["length"] > self.max_block))
        hdr = self._journal.header
        stored = hdr.block_bytes if hdr is not None and hdr.block_bytes else longest
        raise InvalidArgument(
            None,
            f"{self._journal.path}: the store holds {n} block{'s' if n != 1 else ''} longer "
            f"than {self.max_block} bytes (up to {longest}) "
            f"(written with block_bytes={stored}, segment_bytes={self._alloc.segment_bytes}), "
            f"but this open takes blocks of at most {self.max_block} bytes "
            f"(slot_size={self.slot_bytes}); opening would drop them. Reopen with "
            f"slot_size={stored} (Store.open(slot_size=...), chm-emu serve --slot-size) "
            f"and block_bytes={stored}; nothing was changed",
        )

    # ---- helpers

    def _keys(self, keys: Any) -> np.ndarray[Any, Any]:
        return self.namespace.keys(keys)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise Cancelled(None, f"Store.{what}: the store is closed", call=f"Store.{what}")

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _pin_rows(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Pins rows (under the lock) and returns a copy of their entries."""
        with self._lock:
            e = self._index.e
            np.add.at(e["pins"], rows, 1)
            self._alloc.pin(e["segment"][rows])
            self._alloc.touch(e["segment"][rows])
            ents: np.ndarray[Any, Any] = e[rows].copy()
            return ents

    def _unpin_rows(
        self, rows: np.ndarray[Any, Any], ents: np.ndarray[Any, Any], bad: Sequence[int]
    ) -> None:
        """Unpins; entries in ``bad`` (failed their checksum) are dropped."""
        with self._lock:
            e = self._index.e
            np.add.at(e["pins"], rows, -1)
            self._alloc.pin(ents["segment"], -1)
            if bad:
                b = np.asarray(bad, dtype=np.int64)
                r = rows[b]
                same = (e["epoch"][r] == ents["epoch"][b]) & (e["pins"][r] == 0)
                self._drop_rows(r[same], journal=True)

    def _drop_rows(self, rows: np.ndarray[Any, Any], *, journal: bool, report: bool = True) -> None:
        """Removes rows from the index (lock held); DEL records for durable
        ones. ``report``: recorded for take_drops() (a remove() is not)."""
        if rows.size == 0:
            return
        e = self._index.e
        if report and self._drops is not None:
            self._note_drops(rows)
        if journal:
            journaled = e["state"][rows] == DURABLE
            if self._syncing:  # their PUT records are in the journal too
                journaled |= np.fromiter(
                    (r in self._syncing for r in rows.tolist()), dtype=bool, count=rows.size
                )
            durable = rows[journaled]
            if durable.size:
                self._journal.append(
                    jn.del_records(e["hi"][durable], e["lo"][durable], self._epoch)
                )
        for r in rows.tolist():
            self._pending.pop(r, None)
            self._syncing.pop(r, None)
            self._meta.pop(r, None)
        self._alloc.dropped(e["segment"][rows], e["length"][rows])
        self._index.delete_rows(rows)
        self._changes += 1

    def _note_drops(self, rows: Any) -> None:
        """Records dropped rows for take_drops() (lock held), the oldest
        discarded (counted) past watch_drops()'s limit."""
        e = self._index.e
        r = np.asarray(rows, dtype=np.int64)
        assert self._drops is not None
        self._drops.extend(
            zip(e["hi"][r].tolist(), e["lo"][r].tolist(), e["epoch"][r].tolist(), strict=True)
        )
        over = len(self._drops) - self._drops_limit
        if over > 0:
            del self._drops[:over]
            self.drops_unreported += over

    def watch_drops(self, limit: int = 1 << 16) -> None:
        """Records, from now on, the blocks the store drops on its own: the
        victims of a put's eviction, the blocks a failed flush() drops and
        those a load found corrupt (not a remove(): its caller has the
        answer). :meth:`take_drops` hands them out; past ``limit``
        unclaimed records the oldest are discarded (``drops_unreported``)."""
        with self._lock:
            if self._drops is None:
                self._drops = []
            self._drops_limit = max(1, int(limit))

    def take_drops(self) -> np.ndarray[Any, Any]:
        """The blocks dropped since the last call (``DROP_DTYPE``: key hi,
        lo and the epoch of the put that stored the block), oldest first;
        empty unless :meth:`watch_drops` is on. Takes the store lock only to
        swap the list out, so a caller may use it between puts, and must not
        hold the store lock itself."""
        with self._lock:
            got = self._drops
            if got:
                self._drops = []
        out = np.zeros(len(got) if got else 0, dtype=DROP_DTYPE)
        if got:
            out["hi"], out["lo"], out["epoch"] = zip(*got, strict=True)
        return out

    def _segment_row_list(self, segment: int) -> list[int]:
        """:meth:`_segment_rows` as a list (one block a segment: no array work)."""
        cand = self._seg_rows.get(segment)
        if cand is not None and len(cand) == 1:
            del self._seg_rows[segment]
            r0 = cand[0]
            e = self._index.e
            live = e["state"][r0] != FREE and e["segment"][r0] == segment
            return [r0] if live else []
        rows: list[int] = self._segment_rows(segment).tolist()
        return rows

    def _segment_rows(self, segment: int) -> np.ndarray[Any, Any]:
        """The index rows of the blocks in ``segment`` (forgets the list)."""
        cand = self._seg_rows.pop(segment, None)
        if not cand:
            return np.zeros(0, dtype=np.int64)
        e = self._index.e
        r = np.unique(np.asarray(cand, dtype=np.int64))
        out: np.ndarray[Any, Any] = r[(e["state"][r] != FREE) & (e["segment"][r] == segment)]
        return out

    # ---- queries

    def contains(self, keys: Any) -> list[bool]:
        """Per key: is it in the store (readable)."""
        self._check_open("contains")
        ks = self._keys(keys)
        with self._lock:
            return [bool(x) for x in self._index.contains(ks)]

    def prefix_len(self, keys: Any) -> int:
        """How many leading keys are in the store (stops at the first miss)."""
        self._check_open("prefix_len")
        ks = self._keys(keys)
        with self._lock:
            return self._prefix_rows(ks).size

    def _prefix_rows(self, ks: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Rows of the leading hits: one batched index call over every key,
        cut at the first miss."""
        rows = self._index.find(ks)
        out: np.ndarray[Any, Any] = rows[: prefix_hits(rows >= 0)]
        return out

    def lookup(self, keys: Any, request: object = None) -> Lookup:
        """Prefix lookup of at most 32 keys; the hits' prefetches are issued now.

        The returned :class:`Lookup` holds the hits pinned: ``load()`` it or
        ``close()`` it.
        """
        self._check_open("lookup")
        ks = self._keys(keys)
        if ks.size > LOOKUP_BATCH:
            raise InvalidArgument(None, f"lookup: {ks.size} keys; at most {LOOKUP_BATCH} per call")
        with self._lock:
            rows = self._prefix_rows(ks)
            return Lookup(self._blocks, rows, request)

    def load_prefix(
        self, keys: Any, dsts: Sequence[Any], timeout: float | None = None, request: object = None
    ) -> int:
        """Loads the leading hits of ``keys`` into ``dsts`` in order; returns how many.

        Stops at the first miss, the first block that fails its checksum or
        read, or at ``timeout`` seconds, whichever comes first.
        """
        self._check_open("load_prefix")
        ks = self._keys(keys)
        with self._lock:
            rows = self._prefix_rows(ks)
            lk = Lookup(self._blocks, rows, request)
        ok = lk.load(dsts, timeout, prefix=True)
        n = prefix_hits(np.asarray(ok, dtype=bool)) if ok else 0
        self._count("gets_miss", ks.size - n)
        return n

    def lookup_load(
        self,
        keys: Any,
        dsts: Sequence[Any],
        timeout: float | None = None,
        request: object = None,
        *,
        skip: int = 0,
    ) -> tuple[int, int]:
        """A prefix lookup and the load of its hits in one pass over the
        index: ``(prefix length, blocks loaded)``.

        The first ``skip`` leading hits are not loaded (the caller holds
        them: a host buffer of a shared prompt); the rest load into
        ``dsts`` (one buffer per hit after the skipped ones) in order, and
        stop as :meth:`load_prefix` does.
        """
        self._check_open("lookup_load")
        if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
            raise InvalidArgument(None, f"lookup_load: skip={skip!r}: expected an int >= 0")
        ks = self._keys(keys)
        with self._lock:
            rows = self._prefix_rows(ks)
            lk = Lookup(self._blocks, rows[skip:], request)
        ok = lk.load(dsts, timeout, prefix=True)
        n = prefix_hits(np.asarray(ok, dtype=bool)) if ok else 0
        self._count("gets_miss", int(rows[skip:].size) - n)
        return int(rows.size), n

    def get(self, keys: Any, dsts: Sequence[Any], timeout: float | None = None) -> list[bool]:
        """Copies each key's block into its destination; per key whether it was loaded.

        ``dsts`` are writable buffers (bytearray, numpy arrays, CPU torch
        tensors, ...) at least as long as their block. A key that is absent,
        fails its checksum or its read, or is not staged before ``timeout``
        seconds (for the whole call) is False.
        """
        self._check_open("get")
        ks = self._keys(keys)
        if len(dsts) != ks.size:
            raise InvalidArgument(None, f"get: {ks.size} keys but {len(dsts)} destinations")
        for j, d in enumerate(dsts):
            as_dst(d, f"destination {j}")
        with self._lock:
            rows = self._index.find(ks)
            hit = np.flatnonzero(rows >= 0)
            lk = Lookup(self._blocks, rows[hit], None)
        ok = [False] * ks.size
        got = lk.load([dsts[i] for i in hit.tolist()], timeout, prefix=False)
        for i, g in zip(hit.tolist(), got, strict=True):
            ok[i] = g
        self._count("gets_miss", ks.size - sum(got))
        return ok

    def info(self, key: Any) -> dict[str, Any] | None:
        """The index entry of one key (see :meth:`entries`) or None: an engine
        key, or a ``KEY_DTYPE`` array of one digest."""
        if isinstance(key, np.ndarray):
            if key.size != 1:
                raise InvalidArgument(None, f"info: one key, not an array of {key.size}")
            return self.entries(key)[0]
        return self.entries([key])[0]

    def entries(self, keys: Any) -> list[dict[str, Any] | None]:
        """Per key (engine keys, or a ``KEY_DTYPE`` array of digests): its
        index entry or None. An entry has ``addr``, ``length``,
        ``checksum``, ``epoch``, ``segment``, ``device``, ``pins``,
        ``state`` (ints) and ``meta`` (bytes, b"" when none was put)."""
        self._check_open("entries")
        ks = self._keys(keys)
        with self._lock:
            rows = self._index.find(ks)
            hit = rows >= 0
            ent = self._index.e[rows[hit]]
            metas = [self._meta.get(r, b"") for r in rows[hit].tolist()]
        out: list[dict[str, Any] | None] = [None] * ks.size
        for i, e, m in zip(np.flatnonzero(hit).tolist(), ent, metas, strict=True):
            d: dict[str, Any] = {n: int(e[n]) for n in _ENTRY_FIELDS}
            d["meta"] = m
            out[i] = d
        return out

    def meta(self, keys: Any) -> list[bytes | None]:
        """Per key: the metadata put with its block (b"" when none), None
        where the key is not in the store."""
        self._check_open("meta")
        ks = self._keys(keys)
        with self._lock:
            rows = self._index.find(ks)
            return [None if r < 0 else self._meta.get(r, b"") for r in rows.tolist()]

    # ---- updates

    def put(
        self,
        keys: Any,
        srcs: Sequence[Any],
        meta: Sequence[bytes | None] | None = None,
        *,
        touch: bool = False,
    ) -> list[PutStatus]:
        """Writes each key's block; a status per key (see :class:`PutStatus`).

        Never blocks on the device: a full write buffer, or a full device
        whose every segment is pinned, gives SKIPPED. Blocks are readable at
        once and durable after :meth:`flush`. ``meta`` gives each key a small
        metadata field (bytes, at most ``MAX_META``; None for none), kept in
        the index and journaled with the block: :meth:`meta` and
        :meth:`entries` return it, also after a restart. Raises
        InvalidArgument (and writes nothing) for a bad source or metadata,
        or a block longer than a slot.

        ``touch``: a key already in the store counts as a use of its block
        for eviction, in key order, as a new key's put does; so a request
        that saves all its blocks leaves them in the LRU order it used them
        (with one block a segment, exact block LRU). Without it an EXISTS
        key's recency is left alone.
        """
        self._check_open("put")
        ks = self._keys(keys)
        if len(srcs) != ks.size:
            raise InvalidArgument(None, f"put: {ks.size} keys but {len(srcs)} sources")
        metas = check_meta(meta, ks.size)
        bufs = []
        for j, s in enumerate(srcs):
            b = as_src(s, f"source {j}")
            if b.size == 0 or b.size > self.max_block:
                raise InvalidArgument(
                    None, f"source {j}: {b.size} bytes; a block has 1..{self.max_block} bytes"
                )
            bufs.append(b)
        return self._put_blocks(ks, [int(b.size) for b in bufs], touch, bufs, metas)

    def _encode(
        self, hi: int, lo: int, b: np.ndarray[Any, Any], addr: int, epoch: int
    ) -> tuple[int, Any]:
        """A block's checksum and the bytes of its one device write: the
        payload, zeros to its sector's end, then (with headers) its header
        sector (the device writes whole 512-byte sectors)."""
        n = int(b.size)
        check = _hash(b.data)
        pad = _ZEROS[: -n % 512]
        if self.block_headers:
            hdr = blockhdr.header_sector(
                hi=hi,
                lo=lo,
                length=n,
                checksum=check,
                epoch=epoch,
                addr=addr,
                segment_bytes=self._alloc.segment_bytes,
                device=self.device_id,
            )
            return check, np.concatenate([b, np.frombuffer(pad + hdr, np.uint8)])
        if pad:
            return check, np.concatenate([b, np.frombuffer(pad, np.uint8)])
        return check, b

    def put_lengths(self, keys: Any, lengths: Any, *, touch: bool = False) -> list[PutStatus]:
        """Puts blocks that have no bytes (the ghost backend: virtual time).

        Each absent key's block of ``lengths`` bytes (one per key, or one
        for all) is offered with the device's ``write_length``: the model's
        time and write buffer, no payload and no host memory. Statuses and
        ``touch`` as :meth:`put`; the blocks are indexed with checksum 0
        (there are no bytes to verify; ghost loads verify none). The index
        and the journal are updated once per call, not once per block, so a
        replay's per-block cost is the device's call and a few list
        operations. InvalidArgument on a backend that moves data, or for a
        length outside 1..slot bytes.
        """
        self._check_open("put_lengths")
        if self.has_bytes:
            raise InvalidArgument(
                None,
                f"put_lengths: the {self.device.config.backend!r} backend moves data; "
                "payload-less puts are for the ghost backend (use put())",
            )
        ks = self._keys(keys)
        lens = np.asarray(lengths, dtype=np.int64).reshape(-1)
        if lens.size == 1 and ks.size != 1:
            lens = np.full(ks.size, int(lens[0]), dtype=np.int64)
        if lens.size != ks.size:
            raise InvalidArgument(None, f"put_lengths: {ks.size} keys but {lens.size} lengths")
        if ks.size and (int(lens.min()) <= 0 or int(lens.max()) > self.max_block):
            raise InvalidArgument(
                None, f"put_lengths: a block has 1..{self.max_block} bytes, got {lens.tolist()}"
            )
        return self._put_blocks(ks, lens.tolist(), touch)

    def _put_blocks(
        self,
        ks: np.ndarray[Any, Any],
        lens: list[int],
        touch: bool,
        bufs: list[np.ndarray[Any, Any]] | None = None,
        metas: list[bytes] | None = None,
    ) -> list[PutStatus]:
        """The one put path, for put() (``bufs``: the blocks' bytes) and
        put_lengths() (no bytes: the device's ``write_length``); takes the
        store lock (the caller must not hold it).

        In key order, under the lock: a key in the store is EXISTS; an
        absent key's block is placed (reclaiming victim segments until it
        fits) and becomes WRITING: its address taken, its segment pinned so
        no eviction reuses it, and not in the index, so no lookup finds it.
        Its device write runs with the lock dropped (``_write_unlocked``) or
        held (the ghost backend on the virtual clock, where a write neither
        copies nor sleeps). Back under the lock the segment is unpinned and
        the block published (PENDING in the index, readable; the next
        flush() journals it) or rolled back, its space given back: SKIPPED
        (the device did not admit it), ERROR (the device failed it), or
        EXISTS when another put of the same key published first. Evictions,
        index inserts and RECLAIM records are applied before the lock is
        dropped (so a reclaimed segment's rows and its RECLAIM record precede
        any byte written into it), or once at the end when it never is. A
        key whose block an earlier put of the call evicted is absent again
        (stored anew)."""
        lock = self._lock
        unlocked = self._write_unlocked
        with lock:
            if self._closing or self._closed:
                raise Cancelled(None, "Store.put: the store is closed", call="Store.put")
            self._putting += 1
            try:
                return self._put_run(ks, lens, touch, bufs, metas, unlocked)
            finally:
                self._putting -= 1
                if self._putting == 0:  # a close() may be waiting
                    self._idle.notify_all()

    def _put_run(
        self,
        ks: np.ndarray[Any, Any],
        lens: list[int],
        touch: bool,
        bufs: list[np.ndarray[Any, Any]] | None,
        metas: list[bytes] | None,
        unlocked: bool,
    ) -> list[PutStatus]:
        """_put_blocks' loop (lock held on entry and on return)."""
        lock, alloc, idx = self._lock, self._alloc, self._index
        pins = alloc.pins
        rows0 = idx.find(ks)
        rows_l = rows0.tolist()
        segs_l = idx.e["segment"][np.maximum(rows0, 0)].tolist()
        stale = False  # the lock was dropped since rows_l was found
        his, los = ks["hi"].tolist(), ks["lo"].tolist()
        write_length = self.device.write_length
        write = self.device.write
        headers = self.block_headers
        touch_one = alloc.touch_one
        stored, exists, skipped, error = (
            PutStatus.STORED,
            PutStatus.EXISTS,
            PutStatus.SKIPPED,
            PutStatus.ERROR,
        )
        evicted: set[int] = set()  # index rows reclaimed during the call
        drop: list[int] = []
        reclaims: list[tuple[int, int]] = []  # (segment, epoch): RECLAIM records
        new_at: dict[tuple[int, int], int] = {}  # key -> its position in the new blocks
        new: list[tuple[int, int, int, int, int]] = []  # (j, addr, segment, length, epoch)
        checks: list[int] = []  # the new blocks' checksums (with bytes)
        in_seg: dict[int, list[int]] = {}  # segment -> positions of new blocks in it
        gone: set[int] = set()  # positions of new blocks reclaimed in the same call
        out: list[PutStatus] = []
        try:
            for j, n in enumerate(lens):
                if stale:  # the index may have changed meanwhile: ask it again
                    r = int(idx.find(ks[j : j + 1])[0])
                    if r >= 0:
                        if touch:
                            touch_one(int(idx.e["segment"][r]))
                        out.append(exists)
                        continue
                else:
                    r = rows_l[j]
                    if r >= 0 and (not evicted or r not in evicted):
                        if touch:
                            touch_one(segs_l[j])
                        out.append(exists)
                        continue
                k = (his[j], los[j])
                p = new_at.get(k)
                if p is not None and p not in gone:
                    if touch:
                        touch_one(new[p][2])
                    out.append(exists)
                    continue
                fp = blockhdr.footprint(n) if headers else n
                got = alloc.alloc(n, fp)
                while got is None:
                    v = alloc.victim()
                    if v is None:
                        break
                    rs = self._segment_row_list(v)
                    evicted.update(rs)
                    drop.extend(rs)
                    mine = in_seg.pop(v, [])
                    gone.update(mine)
                    reclaims.append((v, self._epoch))
                    alloc.reuse(v)
                    self._counts["evicted_blocks"] += len(rs) + len(mine)
                    got = alloc.alloc(n, fp)
                if got is None:
                    out.append(skipped)
                    continue
                seg, addr = got
                if not unlocked:
                    try:
                        if bufs is None:
                            admitted = write_length(addr, -(-n // 512) * 512)
                        else:
                            check, data = self._encode(k[0], k[1], bufs[j], addr, self._epoch)
                            admitted = write(addr, data)
                    except ChmError:
                        alloc.unalloc(seg, addr, n, fp)
                        out.append(error)
                        continue
                    if not admitted:
                        alloc.unalloc(seg, addr, n, fp)
                        out.append(skipped)
                        continue
                    new_at[k] = len(new)
                    in_seg.setdefault(seg, []).append(len(new))
                    new.append((j, addr, seg, n, self._epoch))
                    if bufs is not None:
                        checks.append(check)
                    self._epoch += 1
                    out.append(stored)
                    continue
                # the block is WRITING: first the call's decisions so far go
                # into the index and the journal, so what is left unlocked
                # is consistent (a reclaimed segment's rows gone, its RECLAIM
                # record appended before the new bytes land in it)
                if drop or reclaims or new:
                    try:
                        keep = [i for i in range(len(new)) if i not in gone] if gone else None
                        batch = (drop, reclaims, new, checks)
                        drop, reclaims, new, checks = [], [], [], []
                        evicted.clear()
                        new_at.clear()
                        in_seg.clear()
                        gone.clear()
                        self._apply_puts(ks, *batch, metas, keep)
                    except BaseException:
                        alloc.unalloc(seg, addr, n, fp)
                        raise
                epoch = self._epoch
                self._epoch += 1
                pins[seg] += 1  # no reclaim of the segment (alloc.victim skips it)
                stale = True
                seen = self._changes
                lock.release()
                try:
                    res, check = self._write_block(k, bufs, j, n, addr, epoch)
                except BaseException:
                    lock.acquire()
                    pins[seg] -= 1
                    alloc.unalloc(seg, addr, n, fp)
                    raise
                lock.acquire()
                pins[seg] -= 1
                if not res:
                    alloc.unalloc(seg, addr, n, fp)
                    out.append(error if res is None else skipped)
                    continue
                # absent when the block was placed; only an insert meanwhile can have put it there
                r = -1 if self._changes == seen else int(idx.find(ks[j : j + 1])[0])
                if r >= 0:  # another put of the key published first: it is there
                    alloc.unalloc(seg, addr, n, fp)
                    if touch:
                        touch_one(int(idx.e["segment"][r]))
                    out.append(exists)
                    continue
                new_at[k] = len(new)
                in_seg.setdefault(seg, []).append(len(new))
                new.append((j, addr, seg, n, epoch))
                if bufs is not None:
                    checks.append(check)
                out.append(stored)
        finally:
            keep = [i for i in range(len(new)) if i not in gone] if gone else None
            self._apply_puts(ks, drop, reclaims, new, checks, metas, keep)
            c = self._counts
            c["puts_stored"] += out.count(stored)
            c["puts_exists"] += out.count(exists)
            c["puts_skipped"] += out.count(skipped)
            c["puts_error"] += out.count(error)
        return out

    def _write_block(
        self,
        k: tuple[int, int],
        bufs: list[np.ndarray[Any, Any]] | None,
        j: int,
        n: int,
        addr: int,
        epoch: int,
    ) -> tuple[bool | None, int]:
        """One block's device write, with the store unlocked: (True if
        admitted, False if skipped, None if the device failed it; the
        block's checksum). The encoding (checksum, header) runs here too."""
        io = self._io_lock
        try:
            if bufs is None:
                if io is None:
                    return self.device.write_length(addr, -(-n // 512) * 512), 0
                with io:
                    return self.device.write_length(addr, -(-n // 512) * 512), 0
            check, data = self._encode(k[0], k[1], bufs[j], addr, epoch)
            if io is None:
                return self.device.write(addr, data), check
            with io:
                return self.device.write(addr, data), check
        except ChmError:
            return None, 0

    def _apply_puts(
        self,
        ks: np.ndarray[Any, Any],
        drop: list[int],
        reclaims: list[tuple[int, int]],
        new: list[tuple[int, int, int, int, int]],
        checks: list[int],
        metas: list[bytes] | None,
        keep: list[int] | None,
    ) -> None:
        """The index and journal updates of one _put_blocks (lock held):
        the reclaimed segments' rows dropped (the segments were reused
        already: their live bytes are 0), the new blocks indexed (those of
        ``keep``, all when None), then the RECLAIM records appended."""
        # a segment none of whose blocks was journaled needs no RECLAIM
        # record: replay has no PUT of it to drop
        reclaims = [(sg, ep) for sg, ep in reclaims if sg in self._journaled]
        if drop:
            if self._drops is not None:  # evicted: reported to take_drops()
                self._note_drops(drop)
            for r in drop:
                self._pending.pop(r, None)
                self._syncing.pop(r, None)
                self._meta.pop(r, None)
            self._index.delete_rows(np.asarray(drop, dtype=np.int64))
            self._changes += 1
        try:
            if new:
                self._index_new(ks, new, checks, metas, keep)
        finally:
            # after the index is right: a failed append (a full disk) leaves
            # the store consistent, and the segments listed for a later RECLAIM
            if reclaims:
                self._journal.append(
                    jn.reclaim_records([sg for sg, _ in reclaims], [ep for _, ep in reclaims])
                )
                self._journaled.difference_update(sg for sg, _ in reclaims)

    def _index_new(
        self,
        ks: np.ndarray[Any, Any],
        new: list[tuple[int, int, int, int, int]],
        checks: list[int],
        metas: list[bytes] | None,
        keep: list[int] | None,
    ) -> None:
        cols = np.asarray(new, dtype=np.int64)
        check: Any = np.asarray(checks, dtype=np.uint64) if checks else 0
        if keep is not None:
            cols = cols[keep]
            if checks:
                check = check[keep]
            if cols.size == 0:
                return
        self._changes += 1
        put = self._index.put(
            ks[cols[:, 0]],
            addr=cols[:, 1],
            length=cols[:, 3],
            checksum=check,
            epoch=cols[:, 4],
            segment=cols[:, 2],
            device=self.device_id,
            state=PENDING,
            known_absent=True,  # _put_blocks found them absent, or dropped them first
        )
        for r, sg, ep in zip(put.tolist(), cols[:, 2].tolist(), cols[:, 4].tolist(), strict=True):
            self._pending[r] = ep
            self._seg_rows.setdefault(sg, []).append(r)
        if metas:
            for r, j in zip(put.tolist(), cols[:, 0].tolist(), strict=True):
                if metas[j]:
                    self._meta[r] = metas[j]

    def pin(self, keys: Any) -> list[bool]:
        """Keeps the blocks from eviction until unpin(); per key whether it was there."""
        self._check_open("pin")
        ks = self._keys(keys)
        with self._lock:
            rows = self._index.find(ks)
            hit = rows[rows >= 0]
            np.add.at(self._index.e["pins"], hit, 1)
            self._alloc.pin(self._index.e["segment"][hit])
            return [bool(r >= 0) for r in rows]

    def unpin(self, keys: Any) -> None:
        """Undoes pin(); InvalidArgument (nothing changed) for a key that is not pinned."""
        self._check_open("unpin")
        ks = self._keys(keys)
        with self._lock:
            rows = self._index.find(ks)
            e = self._index.e
            if (rows < 0).any():
                raise InvalidArgument(
                    None, f"unpin: key #{int(np.flatnonzero(rows < 0)[0])} is not in the store"
                )
            counts = np.zeros(e.shape[0], dtype=np.int64)
            np.add.at(counts, rows, 1)
            if (counts[rows] > e["pins"][rows]).any():
                j = int(np.flatnonzero(counts[rows] > e["pins"][rows])[0])
                raise InvalidArgument(None, f"unpin: key #{j} is not pinned")
            np.add.at(e["pins"], rows, -1)
            self._alloc.pin(e["segment"][rows], -1)

    def remove(self, keys: Any) -> list[bool]:
        """Drops the keys; per key whether it was there. Busy for a pinned key."""
        return [s is not None for s in self.remove_seqs(keys)]

    def remove_seqs(self, keys: Any) -> list[int | None]:
        """:meth:`remove`, answering per key the put sequence (``epoch``,
        as in :meth:`take_drops`) of the block it dropped, None for a key
        that was not there: a storage node unpublishes exactly those
        blocks (``chm.daemon.node``)."""
        self._check_open("remove")
        ks = self._keys(keys)
        with self._lock:
            rows = self._index.find(ks)
            e = self._index.e
            hit = np.unique(rows[rows >= 0])
            if (e["pins"][hit] > 0).any():
                j = int(np.flatnonzero((rows >= 0) & (e["pins"][np.maximum(rows, 0)] > 0))[0])
                raise Busy(
                    None,
                    f"remove: key #{j} is pinned (being loaded, or pin()ed)",
                    call="Store.remove",
                )
            seqs = [int(e["epoch"][r]) if r >= 0 else None for r in rows.tolist()]
            self._drop_rows(hit, journal=True, report=False)
            return seqs

    def flush(self, timeout: float | None = None) -> None:
        """Makes every block stored before the call durable, journaled and synced.

        After it returns, those blocks survive a crash (``kill -9``, power
        loss) of this process. If the device fails the flush, the blocks
        that were waiting for it are dropped (they are misses, never wrong
        data) and the DeviceIOError is raised.
        """
        self._check_open("flush")
        with self._lock:
            snap = dict(self._pending)
        try:
            self.device.flush(timeout)
        except ChmError as exc:
            if exc.errno != 0 and not isinstance(exc, TimeoutError):
                with self._lock:
                    rows = np.asarray(
                        [r for r, ep in snap.items() if self._pending.get(r) == ep], dtype=np.int64
                    )
                    self._drop_rows(rows, journal=False)
            raise
        with self._lock:
            e = self._index.e
            mine = {r: ep for r, ep in snap.items() if self._pending.get(r) == ep}
            rows = np.fromiter(mine, dtype=np.int64, count=len(mine))
            if rows.size:
                self._journal.append(jn.put_records(e[rows], self._metas_of(rows)))
                self._journaled.update(e["segment"][rows].tolist())
                # appended, not yet synced: a compaction meanwhile keeps
                # them, a remove meanwhile journals their DEL
                self._syncing.update(mine)
        # the fdatasync runs with the store unlocked (puts and loads go on);
        # the blocks are durable (and no longer pending) only once it returned:
        # a failed append or sync leaves them pending for the next flush
        try:
            with self._sync_lock:
                self._journal.sync()
        finally:
            with self._lock:
                for r, ep in mine.items():
                    if self._syncing.get(r) == ep:
                        del self._syncing[r]
        with self._lock:
            e = self._index.e
            for r, ep in mine.items():
                if self._pending.get(r) == ep:
                    e["state"][r] = DURABLE
                    del self._pending[r]
            live_recs = len(self._index) + self._meta_records()
            due = self._journal.records > self._compact_ratio * live_recs + 4096
        if due:
            self._compact()

    def _autoflush(self, interval: float) -> None:
        """The periodic flusher: every ``interval`` seconds, flush() if
        anything is pending. A failed flush is counted (flush() has dropped
        its blocks) and the next one tries again."""
        while not self._stop.wait(interval):
            with self._lock:
                if not self._pending or self._closed:
                    continue
            try:
                self.flush(timeout=max(30.0, 10 * interval))
            except ChmError:
                self._count("autoflush_errors")
            self._count("autoflushes")

    def _compact(self) -> None:
        """Rewrites the journal: the durable entries and those whose records
        a flush appended and is syncing now. The store is locked to take
        them and to put the new file in place, not while it is written."""
        with self._compact_lock:
            with self._lock:
                live = self._live_records()
                self._journal.compact_begin()
            tmp = None
            try:
                tmp = self._journal.compact_write(live)
                with self._lock, self._sync_lock:
                    if self._journal.fd < 0:
                        raise Cancelled(None, "Store.compact: the store was closed meanwhile")
                    self._journal.compact_finish(tmp, int(live.size))
            except BaseException:
                with self._lock:
                    self._journal.compact_abort(tmp)
                raise

    def _live_records(self) -> np.ndarray[Any, Any]:
        """The PUT (and META) records of the journal's live entries (lock held)."""
        e = self._index.e
        rows = self._index.live_rows()
        keep = e["state"][rows] == DURABLE
        if self._syncing:
            keep |= np.fromiter(
                (
                    self._syncing.get(r) == ep
                    for r, ep in zip(rows.tolist(), e["epoch"][rows].tolist(), strict=True)
                ),
                dtype=bool,
                count=rows.size,
            )
        rows = rows[keep]
        return jn.put_records(e[rows], self._metas_of(rows))

    def _metas_of(self, rows: np.ndarray[Any, Any]) -> list[bytes] | None:
        if not self._meta:
            return None
        return [self._meta.get(r, b"") for r in rows.tolist()]

    def _meta_records(self) -> int:
        return sum(-(-len(m) // jn.META_PART) for m in self._meta.values())

    def compact(self) -> None:
        """Rewrites the journal as the durable entries only (flush() does it when due)."""
        self._check_open("compact")
        self._compact()

    # ---- asynchronous forms

    def _submit(self, what: str, fn: Callable[[], _T]) -> Ticket:
        self._check_open(what)
        t = Ticket(f"Store.{what}")
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chm-kv")
            pool = self._pool

        def run() -> None:
            try:
                r = fn()
            except BaseException as exc:
                t._finish(exc=exc)
            else:
                t._finish(r)

        pool.submit(run)
        return t

    def put_async(
        self, keys: Any, srcs: Sequence[Any], meta: Sequence[bytes | None] | None = None
    ) -> Ticket:
        """put() on the store's worker thread; the ticket's result is the statuses."""
        ks = self._keys(keys)
        return self._submit("put_async", lambda: self.put(ks, srcs, meta))

    def get_async(self, keys: Any, dsts: Sequence[Any], timeout: float | None = None) -> Ticket:
        """get() on the store's worker thread; the ticket's result is the per-key list."""
        ks = self._keys(keys)
        return self._submit("get_async", lambda: self.get(ks, dsts, timeout))

    def flush_async(self, timeout: float | None = None) -> Ticket:
        """flush() on the store's worker thread, after the puts submitted
        before it; returns at once. The ticket's result is None once every
        block stored before the call is durable (or raises flush()'s error)."""
        return self._submit("flush_async", lambda: self.flush(timeout))

    # ---- stats and lifecycle

    def stats(self) -> StoreStats:
        with self._lock:
            a = self._alloc.stats()
            n = len(self._index)
            return StoreStats(
                entries=n,
                durable_entries=n - len(self._pending),
                pending_entries=len(self._pending),
                index_bytes=self._index.nbytes,
                capacity_bytes=a.segments * a.segment_bytes,
                segment_bytes=a.segment_bytes,
                segments=a.segments,
                segments_free=a.free,
                segments_pinned=a.pinned,
                allocated_bytes=a.allocated_bytes,
                live_bytes=a.live_bytes,
                reclaimed_segments=a.reclaimed_segments,
                journal_path=self._journal.path,
                journal_bytes=self._journal.nbytes,
                journal_records=self._journal.records,
                compactions=self._journal.compactions,
                recovered_entries=self.recovered_entries,
                recovery_dropped=self.recovery_dropped,
                torn_journal_bytes=self.torn_journal_bytes,
                journal_damaged_records=self.journal_damaged_records,
                journal_missing_records=self.journal_missing_records,
                journal_kept_aside=self.journal_kept_aside,
                **self._counts,
            )

    def __len__(self) -> int:
        return len(self._index)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, *, flush: bool = True) -> None:
        """Flushes, compacts the journal and closes it (and the device if owned). Idempotent.

        ``flush=False`` closes without either (nor any device call but an
        owned device's close): blocks not yet durable are not journaled, as
        after a crash. For a store whose contents need not outlive it (a
        replay's tier).
        """
        if self._closed:
            return
        try:
            self._stop.set()
            if self._flusher is not None:
                self._flusher.join()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            with self._lock:  # new puts are refused; those under way finish (and
                self._closing = True  # are flushed below) before the journal and device close
                while self._putting:
                    self._idle.wait()
            if flush:
                self.flush()
                self._compact()
        finally:
            self._closed = True
            with self._sync_lock:
                self._journal.close()
            if self._own:
                self.device.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            self.close()
            return
        # the exception already leaving the block is the one to see; a close
        # that fails meanwhile (a flush on a full disk, writes the device
        # lost) must not replace it, nor pass unreported
        try:
            self.close()
        except ChmError as failed:
            _log.error("closing %r after %s: %s", self, type(exc).__name__, failed)

    def __repr__(self) -> str:
        return (
            f"<chm.kv.Store {'closed' if self._closed else 'open'} entries={len(self._index)} "
            f"journal={self._journal.path}>"
        )
