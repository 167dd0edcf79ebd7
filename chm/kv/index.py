"""The index (the paper's Master): key -> <device, addr, len, checksum, epoch>.

Entries live in one numpy structured array (``ENTRY_DTYPE``, 56 bytes a row)
and an open-addressing hash table of 32-bit buckets (linear probing, kept at
most half full, so at most 8 bytes a row; 16 when live entries fill the row
array exactly, see ``_homes_after``): at most 64 bytes per entry, which
is the paper's eq. 1 (10 TB of 16 MB blocks ~ 6.5e5 entries ~ 40 MB).

A bucket holds a row number (25 bits, so at most ``MAX_ROWS`` = 2**25
entries: 512 TiB of 16 MiB blocks) and a 6-bit tag from the key's high
word, so a probe compares tags inside the table and touches only the one row
it verifies. Every batched operation is
vectorised: a lookup of a batch is a fixed number of numpy calls, not a
Python step per key; keys are already digests (:mod:`chm.kv.keys`), so their
low word picks the home bucket. Not thread-safe: the store serialises calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chm.errors import InvalidArgument, NoSpace
from chm.kv.keys import KEY_DTYPE

__all__ = ["ENTRY_DTYPE", "MAX_ROWS", "Index", "bytes_at"]

# state: 0 free row, 1 pending (readable, not yet durable), 2 durable
FREE, PENDING, DURABLE = 0, 1, 2

ENTRY_DTYPE = np.dtype(
    [
        ("hi", "<u8"),  # key digest, first 8 bytes
        ("lo", "<u8"),  # key digest, last 8 bytes
        ("addr", "<u8"),  # device address
        ("checksum", "<u8"),  # XXH3-64 of the block's bytes
        ("epoch", "<u8"),  # put sequence number: newer is larger, never reused
        ("length", "<u4"),  # block bytes
        ("segment", "<u4"),  # allocator segment holding the block
        ("pins", "<u4"),  # readers that keep the block from reclaim
        ("device", "<u2"),  # device number within an address space
        ("state", "u1"),  # FREE / PENDING / DURABLE
        ("_pad", "u1"),
    ]
)
assert ENTRY_DTYPE.itemsize == 56

# Empty and deleted buckets have tags 127 and 126, which no key has (0..63),
# and row bits 0, so a probe may index the rows with any bucket it gathers.
_ROW_BITS = 25
_EMPTY = np.uint32(127 << _ROW_BITS)
_TOMB = np.uint32(126 << _ROW_BITS)
_ROW_MASK = np.uint32((1 << _ROW_BITS) - 1)
_TAG_SHIFT = np.uint64(58)  # a key's tag: the top 6 bits of its high word
MAX_ROWS = 1 << _ROW_BITS
_NONE = np.int64(-1)
_MIN_BUCKETS = 64
_WINDOW = 16  # buckets a lookup gathers per key at once
_TAIL = 256  # buckets past the last home, so that probes never wrap
_SCALAR_TAIL = 8  # keys still unplaced after a probe round that _place finishes one by one
_STEPS = np.arange(_WINDOW, dtype=np.uint64)
_AR = np.arange(1 << 16)
_ARW = _AR[:4096] * _WINDOW


def bytes_at(n_entries: int) -> int:
    """Bytes the index needs for n_entries (rows plus a table at most half full)."""
    return n_entries * ENTRY_DTYPE.itemsize + (_homes_for(n_entries) + _TAIL) * 4


def _homes_for(n_rows: int) -> int:
    """Home buckets for n_rows: with the tail, twice as many buckets as rows."""
    return max(_MIN_BUCKETS, 2 * n_rows - _TAIL)


def _words(keys: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    if not isinstance(keys, np.ndarray) or keys.dtype != KEY_DTYPE:
        raise InvalidArgument(None, "index keys must be a KEY_DTYPE array (Namespace.keys())")
    k = keys.reshape(-1)
    return k["hi"], k["lo"]


class Index:
    """Batched contains/get/put/delete over 16-byte keys."""

    def __init__(self, rows: int = 1024) -> None:
        rows = max(16, int(rows))
        self.e = np.zeros(rows, dtype=ENTRY_DTYPE)
        self._top = 0  # rows [0, _top) have been used
        self._free: list[int] = []
        self._n = 0
        self._tomb = 0
        self._set_table(_homes_for(rows))
        self._max_probe = 0

    # ---- size

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes held now: the row array plus the hash table."""
        return int(self.e.nbytes + self._b.nbytes)

    @property
    def max_probe(self) -> int:
        return self._max_probe

    # ---- lookup

    def _find(
        self, hi: np.ndarray[Any, Any], lo: np.ndarray[Any, Any], slots_too: bool = True
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(rows, bucket positions) of the keys; -1 where absent.

        Gathers the run of _WINDOW buckets from each key's home at once (one
        fancy index into a sliding-window view of the table), takes the first
        bucket with the key's tag and verifies that one row. A key is absent
        when its run reaches an empty bucket before a tag match; the rare rest (a
        full run, or a tag shared with another key before the key itself)
        is looked up key by key. Probes never wrap: the table has a tail of
        _TAIL buckets past the last home.
        """
        b_arr, e_hi, e_lo = self._b, self.e["hi"], self.e["lo"]
        home = lo % self._homes
        b = self._runs[home]
        m = (b >> _ROW_BITS) == (hi >> _TAG_SHIFT)[:, None]
        col = m.argmax(axis=1)
        n = lo.shape[0]
        at = _AR[:n] if n <= _AR.shape[0] else np.arange(n)
        flat = at * _WINDOW + col if n > _ARW.shape[0] else _ARW[:n] + col  # m, b are fresh
        tagged = m.reshape(-1)[flat]
        r = b.reshape(-1)[flat] & _ROW_MASK  # a row in range even where untagged
        ok = e_hi[r] == hi
        ok &= tagged
        ok &= e_lo[r] == lo
        rows = np.where(ok, r, _NONE)
        if ok.all():
            return rows, (home.astype(np.intp) + col if slots_too else rows)
        slots = np.where(ok, home.astype(np.intp) + col, -1) if slots_too else rows
        # Absent: the run ends (an empty bucket) before any bucket with the
        # key's tag. The rest, key by key: a run full of other keys, or a tag
        # that matched another key first.
        emp = b == _EMPTY
        first_empty = emp.argmax(axis=1)
        absent = first_empty < np.where(tagged, col, _WINDOW)
        absent &= emp[at, first_empty]
        absent |= ok
        if absent.all():
            return rows, slots
        more = np.flatnonzero(~absent)
        end = b_arr.shape[0]
        empty, free, mask = int(_EMPTY), int(_TOMB), int(_ROW_MASK)
        for i in more.tolist():
            p = int(home[i])
            h, lw = int(hi[i]), int(lo[i])
            while p < end:
                v = int(b_arr[p])
                if v == empty:
                    break
                row = v & mask
                if v < free and int(e_lo[row]) == lw and int(e_hi[row]) == h:
                    rows[i] = row
                    if slots_too:
                        slots[i] = p
                    break
                p += 1
        return rows, slots

    def find(self, keys: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Row numbers of the keys (-1 where absent)."""
        hi, lo = _words(keys)
        return self._find(hi, lo, False)[0]

    def contains(self, keys: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return self.find(keys) >= 0

    def get(self, keys: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(found mask, entries): a copy of each found key's row (zeros where absent)."""
        rows = self.find(keys)
        found = rows >= 0
        out = np.zeros(rows.shape[0], dtype=ENTRY_DTYPE)
        out[found] = self.e[rows[found]]
        return found, out

    # ---- update

    def _take_rows(self, n: int) -> np.ndarray[Any, Any]:
        if self._n + n > MAX_ROWS:
            raise NoSpace(None, f"index: {self._n + n} entries; at most {MAX_ROWS}")
        take = min(n, len(self._free))
        rows = [self._free.pop() for _ in range(take)]
        need = n - take
        if self._top + need > self.e.shape[0]:
            size = self.e.shape[0]
            while self._top + need > size:
                size *= 2
            grown = np.zeros(size, dtype=ENTRY_DTYPE)
            grown[: self._top] = self.e[: self._top]
            self.e = grown
        rows.extend(range(self._top, self._top + need))
        self._top += need
        return np.asarray(rows, dtype=np.int64)

    def _place(self, rows: np.ndarray[Any, Any]) -> None:
        """Puts rows into the table (their keys are known to be absent)."""
        b_arr = self._b
        nb = b_arr.shape[0]
        tags = (self.e["hi"][rows] >> _TAG_SHIFT).astype(np.uint32) << np.uint32(_ROW_BITS)
        pending = tags | rows.astype(np.uint32)
        pos = (self.e["lo"][rows] % self._homes).astype(np.intp)
        probes = 0
        while pending.size:
            if int(pos.max()) >= nb:  # ran into the end of the tail: a bigger table
                self._rebuild(int(self._homes) * 2)
                return
            free = np.nonzero(b_arr[pos] >= _TOMB)[0]  # empty or deleted
            if free.size:
                upos, first = np.unique(pos[free], return_index=True)
                win = free[first]
                self._tomb -= int(np.count_nonzero(b_arr[upos] == _TOMB))
                b_arr[upos] = pending[win]
                keep = np.ones(pending.size, dtype=bool)
                keep[win] = False
                pending, pos = pending[keep], pos[keep]
            if 0 < pending.size <= _SCALAR_TAIL:  # the few left: one by one, no array calls
                base, tomb = probes, int(_TOMB)
                for v, p0 in zip(pending.tolist(), pos.tolist(), strict=True):
                    p = p0
                    while p < nb and int(b_arr[p]) < tomb:
                        p += 1
                    if p >= nb:
                        self._rebuild(int(self._homes) * 2)
                        return
                    if int(b_arr[p]) == tomb:
                        self._tomb -= 1
                    b_arr[p] = v
                    probes = max(probes, base + p - p0)
                break
            if pending.size:
                probes += 1
                pos += 1
        self._max_probe = max(self._max_probe, probes)

    def _homes_after(self, live: int) -> int:
        """Home buckets for a rebuild that must hold ``live`` rows.

        The rows' size, as a rule; twice that when ``live`` rows alone
        would fill the table to within 1/9 of half. An index whose live
        rows fill its row array exactly (a store whose every segment holds
        a block, in steady state) would otherwise rebuild the table on
        every put that follows a delete, since one tombstone crosses the
        bound; its table then costs 16 bytes a row, not 8, and probes stay
        short. Never smaller than now.
        """
        homes = max(int(self._homes), _homes_for(self.e.shape[0]))
        if 2 * (live + live // 8) > homes + _TAIL:
            homes = max(homes, _homes_for(2 * self.e.shape[0]))
        return homes

    def _set_table(self, homes: int) -> None:
        self._homes = np.uint64(homes)
        self._b = np.full(homes + _TAIL, _EMPTY, dtype=np.uint32)
        # _runs[h] is the run of _WINDOW buckets from home h (a view, no copy)
        self._runs = np.lib.stride_tricks.sliding_window_view(self._b, _WINDOW)

    def _rebuild(self, homes: int) -> None:
        self._set_table(homes)
        self._tomb = 0
        self._max_probe = 0
        live = np.nonzero(self.e["state"][: self._top] != FREE)[0]
        if live.size:
            self._place(live)

    def put(
        self,
        keys: np.ndarray[Any, Any],
        *,
        addr: Any,
        length: Any,
        checksum: Any,
        epoch: Any,
        segment: Any,
        device: Any = 0,
        state: int = PENDING,
        known_absent: bool = False,
    ) -> np.ndarray[Any, Any]:
        """Adds the keys that are absent; returns their rows (-1: already present).

        A key repeated within the batch is added once (its later copies are
        -1). The per-key fields are scalars or arrays of the batch's length.
        ``known_absent``: the caller knows the keys are distinct and none is
        in the index (it just looked), so neither is checked again.
        """
        hi, lo = _words(keys)
        n = hi.shape[0]
        rows_out = np.full(n, -1, dtype=np.int64)
        if n == 0:
            return rows_out
        absent = np.ones(n, dtype=bool) if known_absent else self._find(hi, lo)[0] < 0
        if n > 1 and not known_absent:  # the first of equal keys in the batch wins
            pair = np.stack([hi, lo], axis=1)
            _, first = np.unique(pair, axis=0, return_index=True)
            once = np.zeros(n, dtype=bool)
            once[first] = True
            absent &= once
        new = np.nonzero(absent)[0]
        if new.size == 0:
            return rows_out
        rows = self._take_rows(int(new.size))
        if 2 * (self._n + self._tomb + new.size) > self._b.shape[0]:
            self._rebuild(self._homes_after(self._n + int(new.size)))
        e = self.e
        e["hi"][rows] = hi[new]
        e["lo"][rows] = lo[new]
        for name, val in (
            ("addr", addr),
            ("length", length),
            ("checksum", checksum),
            ("epoch", epoch),
            ("segment", segment),
            ("device", device),
        ):
            v = np.asarray(val)
            e[name][rows] = v[new] if v.ndim else v
        e["pins"][rows] = 0
        e["state"][rows] = state
        self._place(rows)
        self._n += int(new.size)
        rows_out[new] = rows
        return rows_out

    def delete(self, keys: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Removes the keys; returns a mask of those that were present."""
        hi, lo = _words(keys)
        rows, slots = self._find(hi, lo)
        found = rows >= 0
        if found.any():
            r, s = rows[found], slots[found]
            r, first = np.unique(r, return_index=True)  # a key repeated in the batch
            self._drop(r, s[first])
        return found

    def delete_rows(self, rows: np.ndarray[Any, Any]) -> None:
        """Removes the entries in the given (live) rows."""
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        if rows.size == 0:
            return
        e = self.e
        keys = np.zeros(rows.size, dtype=KEY_DTYPE)
        keys["hi"] = e["hi"][rows]
        keys["lo"] = e["lo"][rows]
        hi, lo = _words(keys)
        found, slots = self._find(hi, lo)
        if not np.array_equal(found, rows):
            raise AssertionError("index: a row is not reachable from its key")
        self._drop(rows, slots)

    def _drop(self, rows: np.ndarray[Any, Any], slots: np.ndarray[Any, Any]) -> None:
        self._b[slots] = _TOMB
        self._tomb += int(rows.size)
        self.e["state"][rows] = FREE
        self.e["pins"][rows] = 0
        self._free.extend(int(r) for r in rows)
        self._n -= int(rows.size)
        if 4 * self._tomb > self._b.shape[0]:
            self._rebuild(int(self._homes))

    # ---- scans

    def live_rows(self) -> np.ndarray[Any, Any]:
        return np.nonzero(self.e["state"][: self._top] != FREE)[0]

    def rows_in_segment(self, segment: int) -> np.ndarray[Any, Any]:
        top = self._top
        e = self.e
        return np.nonzero((e["state"][:top] != FREE) & (e["segment"][:top] == segment))[0]

    def keys_of(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        k = np.zeros(len(rows), dtype=KEY_DTYPE)
        k["hi"] = self.e["hi"][rows]
        k["lo"] = self.e["lo"][rows]
        return k
