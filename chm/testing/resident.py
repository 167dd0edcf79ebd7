"""A hypothesis state machine for the resident region (fw_spec/resident.yaml).

Small and separate from :mod:`chm.testing.stateful`: it drives one
prefetch-mode device with a resident region through the public Device API
only (prefetch with and without ``retain``, wait, release, write, flush,
``resident_evict``) and keeps an obviously-correct model of the region: which
objects are resident, which are held (and by how many handles), which are
stale, in the device's replacement order. The model says when a prefetch
must be a resident hit (R5), what its bytes must be (R2), and how many
entries are in use (R4).

    from chm.testing.resident import resident_machine
    TestResident = resident_machine("pread").TestCase
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

import chm
from chm.errors import WouldBlock

__all__ = ["ResidentMachine", "resident_machine"]

OBJ = 16 << 10
NOBJ = 5
SLOTS = 2
ENTRIES = 2
STRIDE = OBJ + 8192


def _bytes(obj: int, version: int) -> bytes:
    return bytes((obj * 7 + version * 13 + i) & 0xFF for i in range(256)) * (OBJ // 256)


@dataclass
class _Entry:
    obj: int
    holders: int = 0
    last_use: int = 0
    stale: bool = False  # out of service, dropped at its last release


@dataclass
class _Live:
    obj: int
    handle: Any
    entry: _Entry | None  # the entry a resident hit holds; None for a slot
    retain: bool
    version: int
    stale: bool = False  # a slot held when a write landed: not retained


@dataclass
class _Region:
    """The model: the entries in use, stale ones included (a stale entry
    and a serving one of the same object can coexist)."""

    entries: list[_Entry] = field(default_factory=list)
    tick: int = 0

    def serving(self, obj: int) -> _Entry | None:
        return next((e for e in self.entries if e.obj == obj and not e.stale), None)

    def touch(self, e: _Entry) -> None:
        self.tick += 1
        e.last_use = self.tick


class ResidentMachine(RuleBasedStateMachine):
    backend = "pread"

    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory(prefix="chm-resident-machine-")
        self.dev = chm.Device.open(
            targets=[Path(self._tmp.name) / "t0"],
            create=True,
            backend=self.backend,
            capacity="1M",
            dram=SLOTS * STRIDE + ENTRIES * STRIDE + (256 << 10),
            wbuf=256 << 10,
            slot_size=OBJ,
            slots=SLOTS,
            resident=ENTRIES * STRIDE,
        )
        self.version = [0] * NOBJ
        self.region = _Region()
        self.live: list[_Live] = []
        for o in range(NOBJ):
            assert self.dev.write(o * OBJ, _bytes(o, 0))
        self.dev.flush()

    def teardown(self) -> None:
        for lv in self.live:
            lv.handle.release()
        self.dev.close()
        self._tmp.cleanup()

    def _slots_used(self) -> int:
        return sum(1 for lv in self.live if lv.entry is None)

    @rule(target=handles, obj=st.integers(0, NOBJ - 1), retain=st.booleans())
    def prefetch(self, obj: int, retain: bool) -> Any:
        before = self.dev.stats()
        ent = self.region.serving(obj)
        want_hit = ent is not None
        try:
            h = self.dev.prefetch(obj * OBJ, OBJ, noqueue=True, retain=retain)
        except WouldBlock:
            assert not want_hit, "R5: a resident hit needs no slot"
            assert self._slots_used() == SLOTS, "S8: -EAGAIN with a free slot"
            return None
        view = bytes(h.wait(1.0))
        d = self.dev.stats() - before
        if ent is not None:
            assert (d.resident_hits, d.bytes_read_ssd) == (1, 0), f"R5: {obj} resident, {d}"
            ent.holders += 1
            self.region.touch(ent)
        else:
            assert d.resident_hits == 0, f"R5: {obj} is not resident, yet a hit"
        assert view == _bytes(obj, self.version[obj]), f"R2: bytes of {obj}"
        lv = _Live(obj, h, ent, retain, self.version[obj])
        self.live.append(lv)
        return lv

    @rule(lv=consumes(handles))
    def release(self, lv: _Live | None) -> None:
        if lv is None:
            return
        self.live.remove(lv)
        lv.handle.release()
        reg = self.region
        if lv.entry is not None:
            lv.entry.holders -= 1
            if lv.entry.holders == 0 and lv.entry.stale:
                reg.entries.remove(lv.entry)
            return
        if not lv.retain or lv.stale:
            return
        cur = reg.serving(lv.obj)
        if cur is not None:
            reg.touch(cur)
            return
        if len(reg.entries) >= ENTRIES:
            unheld = [e for e in reg.entries if e.holders == 0 and not e.stale]
            if not unheld:
                return  # every entry held: skipped
            reg.entries.remove(min(unheld, key=lambda e: e.last_use))
        e = _Entry(lv.obj)
        reg.entries.append(e)
        reg.touch(e)

    @rule(obj=st.integers(0, NOBJ - 1))
    def write(self, obj: int) -> None:
        if not self.dev.write(obj * OBJ, _bytes(obj, self.version[obj] + 1)):
            self.dev.flush()  # skipped: nothing changed
            return
        self.version[obj] += 1
        for lv in self.live:
            if lv.obj == obj and lv.entry is None:
                lv.stale = True
        self._out_of_service(obj)

    def _out_of_service(self, obj: int) -> int:
        """A write or an evict over obj: unheld entries go, held ones go stale."""
        n = 0
        for e in list(self.region.entries):
            if e.obj != obj or e.stale:
                continue
            n += 1
            if e.holders == 0:
                self.region.entries.remove(e)
            else:
                e.stale = True
        return n

    @rule(obj=st.integers(0, NOBJ - 1))
    def evict(self, obj: int) -> None:
        want = sum(1 for e in self.region.entries if e.obj == obj and not e.stale)
        assert self.dev.resident_evict(obj * OBJ, OBJ) == want, "R4: evicted entries"
        self._out_of_service(obj)

    @precondition(lambda self: not self.live)
    @rule()
    def flush(self) -> None:
        self.dev.flush()

    @invariant()
    def inv_R4_accounting(self) -> None:
        """R4: resident_entries_used equals the model's entries, stale ones included."""
        st_ = self.dev.stats()
        assert st_.resident_entries_used == len(self.region.entries), (
            f"R4: {st_.resident_entries_used} used, model {self.region.entries}"
        )
        assert st_.resident_entries_total == ENTRIES


def resident_machine(backend: str = "pread") -> type[ResidentMachine]:
    """The machine on ``backend`` (one that moves data: uring or pread)."""
    return type(f"ResidentMachine_{backend}", (ResidentMachine,), {"backend": backend})
