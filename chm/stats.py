"""Device counters: a frozen snapshot of ``struct chm_stats``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from chm import _lowlevel as _ll

__all__ = ["Stats"]


def _name_of(table: dict[str, int], value: int) -> str:
    """The C core's name of an enum value (chm_enum_name), or the number."""
    name = _ll.name_of(table, value)
    return str(value) if name is None else name


def enum_names(counters: dict[str, Any]) -> dict[str, Any]:
    """A copy of a :meth:`Stats.to_dict` mapping with ``backend``, ``mode`` and
    ``pool_kind`` spelled by name (the C core's names), for people to read."""
    tables = {"backend": _ll.BACKENDS, "mode": _ll.MODES, "pool_kind": _ll.POOL_KINDS}
    out = dict(counters)
    for field, table in tables.items():
        v = out.get(field)
        if isinstance(v, int) and not isinstance(v, bool):
            out[field] = _name_of(table, v)
    return out


@dataclass(frozen=True, slots=True, repr=False)
class Stats:
    """Every field of ``struct chm_stats`` (but its reserved ones) plus derived rates.

    Field meanings are documented in include/chm.h. ``refill_lat_hist[i]``
    counts fills that took [2**i, 2**(i+1)) microseconds.

    Two kinds of DRAM service are counted apart. A prefetch that completes
    is *staged* (``prefetch_completed``, also ``staged``; ``staged_rate`` of
    the prefetches issued): its data is read through the view that
    ``Handle.wait()`` returns. ``read_hits`` / ``read_misses`` count only
    ``read()`` / ``read_into()`` calls (``read_hit_rate``, also ``hit_rate``),
    so a device that has only staged objects has a read hit rate of 0.0.
    ``backend``, ``mode`` and ``pool_kind`` are the C enum values; the repr
    and the ``*_name`` properties give their names.
    """

    # prefetch
    prefetch_issued: int = 0
    prefetch_queued: int = 0
    prefetch_completed: int = 0
    prefetch_failed: int = 0
    prefetch_released: int = 0
    prefetch_cancelled: int = 0
    prefetch_rejected: int = 0
    # reads
    read_hits: int = 0
    read_misses: int = 0
    bytes_read_ssd: int = 0
    bytes_from_dram: int = 0
    bytes_written_ssd: int = 0
    # staging window
    slots_total: int = 0
    slots_free: int = 0
    slots_filling: int = 0
    slots_ready: int = 0
    slots_held: int = 0
    slots_failed: int = 0
    queue_len: int = 0
    queue_cap: int = 0
    slot_bytes: int = 0
    window_bytes: int = 0
    # refill latency
    refill_lat_hist: tuple[int, ...] = ()
    refill_lat_count: int = 0
    refill_lat_sum_ns: int = 0
    # write buffer
    wr_admitted: int = 0
    wr_skipped: int = 0
    wr_admitted_bytes: int = 0
    wr_skipped_bytes: int = 0
    wr_flushed_bytes: int = 0
    flush_batches: int = 0
    read_wait_flush_ns: int = 0
    wbuf_used_bytes: int = 0
    wbuf_bytes: int = 0
    # lru mode
    lru_hits: int = 0
    lru_misses: int = 0
    lru_refills: int = 0
    lru_dirty_evictions: int = 0
    lru_writeback_bytes: int = 0
    lru_lines_total: int = 0
    lru_lines_valid: int = 0
    lru_lines_dirty: int = 0
    # resident region
    resident_hits: int = 0
    resident_misses: int = 0
    resident_retained: int = 0
    resident_evictions: int = 0
    resident_skipped: int = 0
    resident_invalidated: int = 0
    resident_entries_total: int = 0
    resident_entries_used: int = 0
    # timing
    clock_now_ns: int = 0
    pacing_late: int = 0
    pacing_late_ns: int = 0
    # what was obtained
    pool_bytes: int = 0
    pool_kind: int = 0
    pool_numa_node: int = -1
    pool_hugepages: int = 0
    backend: int = 0
    mode: int = 0
    # staging window: slots still catching up with the write buffer (S18)
    slots_catching_up: int = 0
    # device ns prefetches waited in the refill queue for a slot
    refill_queue_wait_ns: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Stats:
        """Builds a snapshot from ``chm._lowlevel.stats()`` output."""
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in d:
                v = d[f.name]
                kw[f.name] = tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else int(v)
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (``refill_lat_hist`` as a list)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    # ---- derived

    @property
    def reads(self) -> int:
        """chm_read calls counted (hits + misses)."""
        return self.read_hits + self.read_misses

    @property
    def read_hit_rate(self) -> float:
        """Fraction of ``read()`` / ``read_into()`` calls served from DRAM
        (0.0 when none). Prefetched data read through its view is not a
        read: see ``staged_rate``."""
        n = self.read_hits + self.read_misses
        return self.read_hits / n if n else 0.0

    @property
    def hit_rate(self) -> float:
        """The same as ``read_hit_rate`` (``read()`` calls only)."""
        return self.read_hit_rate

    @property
    def staged(self) -> int:
        """Prefetches whose fill completed: objects staged into DRAM
        (``prefetch_completed``)."""
        return self.prefetch_completed

    @property
    def staged_rate(self) -> float:
        """Fraction of issued prefetches staged into DRAM so far (0.0 when none)."""
        return self.prefetch_completed / self.prefetch_issued if self.prefetch_issued else 0.0

    @property
    def lru_hit_rate(self) -> float:
        """Fraction of LRU lookups that hit (0.0 when none)."""
        n = self.lru_hits + self.lru_misses
        return self.lru_hits / n if n else 0.0

    @property
    def write_skip_rate(self) -> float:
        """Fraction of offered writes that were skipped (0.0 when none)."""
        n = self.wr_admitted + self.wr_skipped
        return self.wr_skipped / n if n else 0.0

    @property
    def refill_lat_mean_ns(self) -> float:
        """Mean staging fill latency in ns (0.0 when none)."""
        return self.refill_lat_sum_ns / self.refill_lat_count if self.refill_lat_count else 0.0

    def refill_lat_quantile(self, q: float) -> float:
        """Upper bound (ns) of the histogram bucket holding quantile ``q``."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("q must be in [0, 1]")
        total = sum(self.refill_lat_hist)
        if not total:
            return 0.0
        want = q * total
        seen = 0
        for i, c in enumerate(self.refill_lat_hist):
            seen += c
            if seen >= want and c:
                return float(2 ** (i + 1) * 1000)
        return float(2 ** len(self.refill_lat_hist) * 1000)

    @property
    def backend_name(self) -> str:
        return _name_of(_ll.BACKENDS, self.backend)

    @property
    def mode_name(self) -> str:
        return _name_of(_ll.MODES, self.mode)

    @property
    def pool_kind_name(self) -> str:
        return _name_of(_ll.POOL_KINDS, self.pool_kind)

    def __repr__(self) -> str:
        enums = {"backend": self.backend_name, "mode": self.mode_name}
        enums["pool_kind"] = self.pool_kind_name
        parts = [
            f"{f.name}={enums[f.name] if f.name in enums else getattr(self, f.name)!r}"
            for f in fields(self)
        ]
        return f"Stats({', '.join(parts)})"

    def __sub__(self, other: Stats) -> Stats:
        """Counter deltas (``after - before``); gauges keep ``self``'s value."""
        if not isinstance(other, Stats):
            return NotImplemented
        kw: dict[str, Any] = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name in _GAUGES:
                kw[f.name] = a
            elif isinstance(a, tuple):
                kw[f.name] = tuple(x - y for x, y in zip(a, b, strict=False))
            else:
                kw[f.name] = a - b
        return Stats(**kw)


_GAUGES = frozenset(
    {
        "slots_total",
        "slots_free",
        "slots_filling",
        "slots_ready",
        "slots_held",
        "slots_failed",
        "queue_len",
        "queue_cap",
        "slot_bytes",
        "window_bytes",
        "wbuf_used_bytes",
        "wbuf_bytes",
        "lru_lines_total",
        "lru_lines_valid",
        "lru_lines_dirty",
        "resident_entries_total",
        "resident_entries_used",
        "clock_now_ns",
        "pool_bytes",
        "pool_kind",
        "pool_numa_node",
        "pool_hugepages",
        "backend",
        "mode",
        "slots_catching_up",
    }
)
