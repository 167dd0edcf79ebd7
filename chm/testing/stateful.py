"""A model-based hypothesis state machine for a chm device.

:class:`DeviceMachine` drives one embedded device through random sequences
of prefetch / wait / release / read / write / flush (plus deliberate races,
stale and foreign handles, bad arguments) and compares it after every step
with the obviously-correct model of :mod:`chm.testing.model`. Subclass it
(or call :func:`device_machine`) per backend, mode and geometry::

    TestPreadPrefetch = device_machine("pread", "prefetch").TestCase

The ``ghost`` backend moves no data, so there the machine compares states and
counters only; ``uring`` and ``pread`` also compare every byte: reads, held
views and, after each flush and at close, the backing files read back with
separate descriptors.

Every ``@invariant`` names the fw_spec invariant it checks (``S*``: staging
window, ``W*``: write buffer, ``L*``: lru mode; fw_spec/spec.yaml). The
machine settles after every step (waits until no fill is in flight), so the
model is exact; rules that race on purpose say so and widen the counters
they make uncertain.

Every step goes through the public device API only (``prefetch``,
``prefetch_many``, ``release_many``, ``write_many``, ``adopt``, ``view_info``,
``stats``, ``session``, ... of :class:`chm.Device`), and every expectation
that differs between modes lives in the mode's model class
(:mod:`chm.testing.model`: ``PrefetchMode``, ``LruMode``, ``DirectMode``), so
the same machine runs unchanged against another front end of the device with
that API, such as the daemon client (``chm.connect(path)``): set
:attr:`DeviceMachine.device_factory` (or override
:meth:`DeviceMachine.create_device`).
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

import chm
from chm.errors import (
    Cancelled,
    ChmError,
    InvalidArgument,
    StaleHandle,
    WaitTimeout,
    WouldBlock,
)
from chm.stats import Stats
from chm.testing.model import (
    FILL_ALIGN,
    IO_ALIGN,
    MODE_MODELS,
    Counters,
    Geometry,
    ModelRequest,
    ModeModel,
    SessionModel,
    fill_range,
    initial_image,
    read_backing,
    widened,
    write_backing,
)

__all__ = ["DATA_BACKENDS", "DeviceMachine", "Geometry", "device_machine"]

DATA_BACKENDS = frozenset({"uring", "pread"})
SETTLE_TIMEOUT_S = 20.0  # a fill of one small slot that takes longer is a hang
FLUSH_TIMEOUT_S = 30.0

E = TypeVar("E", bound=BaseException)


@contextmanager
def raises(exc: type[E], what: str) -> Iterator[None]:
    """Asserts the block raises exactly ``exc`` (or a subclass)."""
    try:
        yield
    except exc:
        return
    except ChmError as other:
        raise AssertionError(f"{what}: expected {exc.__name__}, got {other!r}") from other
    raise AssertionError(f"{what}: expected {exc.__name__}, nothing was raised")


DeviceFactory = Callable[[list[str], str, str, dict[str, Any]], Any]


def open_embedded(targets: list[str], backend: str, mode: str, options: dict[str, Any]) -> Any:
    """The default device factory: an embedded :class:`chm.Device`."""
    return chm.Device.open(targets=targets, backend=backend, mode=mode, **options)


# ---------------------------------------------------------------- strategies


def _objects(g: Geometry) -> st.SearchStrategy[tuple[int, int]]:
    """Prefetch objects: page-aligned, odd, at the capacity's end, anywhere."""
    cap, top = g.capacity, g.slot_size
    pages = top // FILL_ALIGN

    def place(addr: int, length: int) -> tuple[int, int]:
        return min(addr, cap - length), length

    page = st.builds(
        lambda a, n: place(a * FILL_ALIGN, n * FILL_ALIGN),
        st.integers(0, g.hot // FILL_ALIGN - 1),
        st.integers(1, max(1, pages)),
    )
    odd = st.builds(place, st.integers(0, g.hot - 1), st.integers(1, top))
    tail = st.builds(
        lambda back, n: (cap - n - back, n), st.integers(0, FILL_ALIGN), st.integers(1, top)
    )
    anywhere = st.builds(place, st.integers(0, cap - 1), st.integers(1, top))
    return st.one_of(page, odd, tail, anywhere)


def _read_ranges(g: Geometry) -> st.SearchStrategy[tuple[int, int]]:
    cap = g.capacity
    top = 2 * g.slot_size

    def place(addr: int, length: int) -> tuple[int, int]:
        return min(addr, cap - length), length

    return st.one_of(
        st.builds(place, st.integers(0, g.hot - 1), st.integers(1, top)),
        st.builds(place, st.integers(0, cap - 1), st.integers(1, 8 * FILL_ALIGN)),
        st.builds(lambda n: (cap - n, n), st.integers(1, 2 * FILL_ALIGN)),
    )


def _write_ranges(g: Geometry) -> st.SearchStrategy[tuple[int, int]]:
    """512-aligned writes: mostly small, some up to max_write (some larger
    than the whole write buffer, which prefetch mode must always refuse)."""
    cap, sec = g.capacity, IO_ALIGN

    def place(a: int, n: int) -> tuple[int, int]:
        length = n * sec
        return min(a * sec, cap - length), length

    small = st.builds(place, st.integers(0, g.hot // sec - 1), st.integers(1, 32))
    big = st.builds(place, st.integers(0, g.hot // sec - 1), st.integers(1, g.max_write // sec))
    tail = st.builds(lambda n: (cap - n * sec, n * sec), st.integers(1, 16))
    return st.one_of(small, small, big, tail)


def _strategy(name: str) -> st.SearchStrategy[Any]:
    """A strategy built from the running machine's geometry."""
    return st.runner().flatmap(lambda m: m.strategies[name])


OBJ = _strategy("obj")
READ = _strategy("read")
WRITE = _strategy("write")


# ---------------------------------------------------------------- the machine


class DeviceMachine(RuleBasedStateMachine):
    """One chm device against the model. Subclass per backend/mode/geometry."""

    backend: ClassVar[str] = "pread"
    mode: ClassVar[str] = "prefetch"
    geometry: ClassVar[Geometry] = Geometry()
    tmp_parent: ClassVar[str | None] = None
    # (targets, backend, mode, options) -> a device with chm.Device's API
    device_factory: ClassVar[DeviceFactory] = staticmethod(open_embedded)
    # at most this many sessions besides the device's own (0: no session rules)
    max_sessions: ClassVar[int] = 2

    handles = Bundle("handles")
    dead = Bundle("dead")
    sessions = Bundle("sessions")
    session_handles = Bundle("session_handles")

    _strategy_cache: ClassVar[dict[Geometry, dict[str, st.SearchStrategy[Any]]]] = {}

    def __init__(self) -> None:
        super().__init__()
        g = self.geometry
        self.dev: chm.Device | None = None
        parent = self.tmp_parent or os.environ.get("CHM_TEST_TMPDIR") or None
        self.tmpdir = tempfile.mkdtemp(prefix="chm-machine-", dir=parent)
        self.paths = [os.path.join(self.tmpdir, f"target{i}.img") for i in range(g.targets)]
        self.image = bytearray()
        self.data = self.backend in DATA_BACKENDS
        self.c = Counters()
        self.model: ModeModel = MODE_MODELS[self.mode](g, self.c)
        self.staging = self.model.staging
        self.dead_tokens: list[int] = []
        self.window_bytes = -1
        self.nwrites = 0
        self.seed = 0
        self.open_sessions: list[SessionModel] = []

    @property
    def strategies(self) -> dict[str, st.SearchStrategy[Any]]:
        g = self.geometry
        cached = DeviceMachine._strategy_cache.get(g)
        if cached is None:
            cached = {"obj": _objects(g), "read": _read_ranges(g), "write": _write_ranges(g)}
            DeviceMachine._strategy_cache[g] = cached
        return cached

    # ---- lifecycle

    @initialize(seed=st.integers(0, 2**32 - 1))
    def open_device(self, seed: int) -> None:
        g = self.geometry
        self.seed = seed
        self.image = initial_image(g.capacity, seed)
        if self.data:
            write_backing(g, self.paths, self.image)
        self.dev = self.create_device(self.paths, self.model.device_options())
        st0 = self.dev.stats()
        note(f"open {self.backend}/{self.mode} seed={seed}: {self.dev.config!r}")
        self.model.check_open(st0)
        self.window_bytes = st0.window_bytes

    def teardown(self) -> None:
        try:
            dev = self.dev
            if dev is None:
                return
            self.dev = None
            live = list(self.staging.slotted) + list(self.staging.queue)
            dev.close()
            for req in live:
                with raises(Cancelled, f"S13: wait on {req} after close"):
                    req.handle.wait(0)
            with raises(Cancelled, "S13: prefetch after close"):
                dev.prefetch(0, 1)
            if self.data:
                # close flushes the write buffer / writes back dirty lines
                self._check_backing("W3: backing files after close")
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    # ---- helpers

    @property
    def d(self) -> Any:
        """The device under test (a :class:`chm.Device` or anything with its API)."""
        assert self.dev is not None
        return self.dev

    def _settle(self) -> Stats:
        """Waits until no fill is in flight and no staged slot is still
        catching up with the write buffer (S18: READY but behind, so a read
        of it misses); the model describes that state."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            s: Stats = self.d.stats()
            if s.slots_filling == 0 and s.slots_catching_up == 0:
                return s
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"S11: fills still in flight after {SETTLE_TIMEOUT_S}s: {s.slots_filling} "
                    f"slots FILLING, {s.slots_catching_up} catching up, queue {s.queue_len}"
                )
            time.sleep(0.0002)

    def _payload(self, length: int) -> bytes:
        self.nwrites += 1
        return random.Random(f"{self.seed}:{self.nwrites}").randbytes(length)

    def _fill_started(self, req: ModelRequest, *, orphan: bool = False) -> None:
        """Counters of a fill that starts for req (at issue or promotion)."""
        if orphan:
            # released at once: the fill either completed first or was orphaned
            self.c.add("prefetch_completed", 0, maybe=1)
            self.c.add("prefetch_cancelled", 0, maybe=1)
        else:
            self.c.add("prefetch_completed")
        self.c.add("completed+cancelled")
        self.model.fill_started(req, self.image)

    def _issue(
        self, obj: tuple[int, int], *, noqueue: bool = False, sess: SessionModel | None = None
    ) -> ModelRequest | None:
        addr, length = obj
        outcome = self.staging.predict_issue(noqueue)
        if sess is not None and len(sess.reqs) >= sess.quota:
            outcome = "reject"  # its quota is in use
        try:
            h = (sess.session if sess is not None else self.d).prefetch(
                addr, length, noqueue=noqueue
            )
        except WouldBlock:
            assert outcome == "reject", (
                f"S8: prefetch [{addr:#x}+{length}) got EAGAIN but the model has "
                f"{self.staging.free} free slots, queue {len(self.staging.queue)}/"
                f"{self.staging.queue_cap}"
            )
            self.c.add("prefetch_rejected")
            event(f"prefetch: reject (noqueue={noqueue})")
            note(f"prefetch [{addr:#x}+{length}) -> EAGAIN")
            return None
        assert outcome != "reject", (
            f"S8: prefetch [{addr:#x}+{length}) succeeded though the model has no free slot "
            f"and a full queue ({len(self.staging.queue)}/{self.staging.queue_cap}), "
            f"noqueue={noqueue}"
        )
        req = ModelRequest(addr, length, fill_range(addr, length, self.geometry.capacity), h)
        self.staging.issue(req, outcome)
        if sess is not None:
            req.session = sess
            sess.reqs.append(req)
        self.c.add("prefetch_issued")
        if outcome == "queue":
            self.c.add("prefetch_queued")
        event(f"prefetch: {outcome}" + (" (session)" if sess is not None else ""))
        note(f"prefetch [{addr:#x}+{length}) -> {outcome} {req!r}")
        return req

    def _release(self, req: ModelRequest, *, done: bool = False) -> list[ModelRequest]:
        """Releases req (``done``: a batched release already did) and applies
        it to the model; returns the queued requests that got its slot."""
        view = req.view
        req.view = None
        was = req.state
        if not done:
            req.handle.release()
        self.c.add("prefetch_released")
        if was == "queued":
            self.c.add("prefetch_cancelled")
            self.c.add("completed+cancelled")
        promoted = self.staging.release(req)
        if req.session is not None:
            req.session.reqs.remove(req)
        self.dead_tokens.append(req.handle.token)
        event(f"release: {was}" + (" (promotes)" if promoted else ""))
        note(f"release {req!r} (was {was}); promoted {promoted}")
        if view is not None:
            with raises(ValueError, "a view after its release"):
                view.tobytes()
        return promoted

    def _release_settled(self, req: ModelRequest) -> ModelRequest:
        """Releases req; the queue's head(s) take the freed slot (FIFO)."""
        promoted = self._release(req)
        for p in promoted:
            self._fill_started(p)
        self._settle()
        return req

    def _read(self, addr: int, length: int, what: str) -> bytes:
        event(f"read: {self.model.expect_read(addr, length)}")
        got: bytes = self.d.read(addr, length)
        assert len(got) == length
        if self.data:
            want = bytes(self.image[addr : addr + length])
            assert got == want, f"{what}: read [{addr:#x}+{length}) differs from the model " + (
                _first_diff(got, want, addr)
            )
        return got

    def _write(self, addr: int, length: int, what: str = "write") -> bool:
        data = self._payload(length)
        too_big = self.model.write_refused(length)
        try:
            admitted = self.d.write(addr, data)
        except InvalidArgument:
            # never admissible: a configuration error, not a skip (W2)
            assert too_big, f"{what} [{addr:#x}+{length}) refused as too large"
            event("write: refused, larger than the write buffer")
            note(f"{what} [{addr:#x}+{length}) -> refused (wbuf {self._wbuf_bytes()})")
            if self.data:
                self._settle()
                self._read(addr, length, "W2: a refused write changed the device")
            return False
        assert not too_big, (
            f"W2: a write of {length} bytes larger than the {self._wbuf_bytes()}-byte write "
            "buffer was not refused"
        )
        event("write: admitted" if admitted else "write: skipped")
        note(f"{what} [{addr:#x}+{length}) -> {'admitted' if admitted else 'SKIPPED'}")
        self._count_write(addr, length, admitted)
        if not admitted:
            if self.data:
                # the model knows hit from miss only with no fill in flight
                # (write_during_fill races one on purpose)
                self._settle()
                self._read(addr, length, "W2: a skipped write changed the device")
            return False
        self.image[addr : addr + length] = data
        self.model.wrote(addr, length)
        return True

    def _wbuf_bytes(self) -> int:
        """The write buffer's size (prefetch mode; 0 in the other modes)."""
        return int(getattr(self.model, "wbuf_bytes", 0))

    def _count_write(self, addr: int, length: int, admitted: bool) -> None:
        """Counters of one write (W2: a skip counts only as a skip)."""
        self.model.count_write(addr, length, admitted)

    def _check_backing(self, what: str) -> None:
        disk = read_backing(self.geometry, self.paths)
        if disk != self.image:
            raise AssertionError(
                f"{what}: backing files differ from the model "
                + (_first_diff(bytes(disk), bytes(self.image), 0))
            )

    # ---- hooks (to run the machine against another device front end)

    def create_device(self, targets: list[str], options: dict[str, Any]) -> Any:
        """Opens the device under test over ``targets`` (already laid out),
        with :attr:`device_factory`."""
        return type(self).device_factory(targets, self.backend, self.mode, options)

    def view_info(self, req: ModelRequest) -> tuple[int, int, int]:
        """``(dev_addr, length, pool_offset)`` of req's view, asked of the
        device again (``view_info``: a wait that polls on a HELD or READY
        handle), not the driver's cached memoryview."""
        info: tuple[int, int, int] = self.d.view_info(req.handle)
        return info

    def _staged(self) -> list[ModelRequest]:
        return [r for r in self.staging.slotted if r.staged]

    # ---- rules: issue - wait - release

    @precondition(lambda self: self.model.stages)
    @rule(target=handles, obj=OBJ)
    def prefetch(self, obj: tuple[int, int]) -> Any:
        req = self._issue(obj)
        if req is None:
            return multiple()
        if req.state == "ready":
            self._fill_started(req)
        self._settle()
        return req

    @precondition(lambda self: self.model.stages)
    @rule(target=handles, obj=OBJ)
    def prefetch_noqueue(self, obj: tuple[int, int]) -> Any:
        req = self._issue(obj, noqueue=True)
        if req is None:
            return multiple()
        self._fill_started(req)
        self._settle()
        return req

    @precondition(lambda self: self.model.stages)
    @rule(target=handles, objs=st.lists(OBJ, min_size=1, max_size=6))
    def prefetch_burst(self, objs: list[tuple[int, int]]) -> Any:
        """Several prefetches back to back: fills the window and the queue."""
        reqs = []
        for obj in objs:
            req = self._issue(obj)
            if req is not None:
                if req.state == "ready":
                    self._fill_started(req)
                reqs.append(req)
        self._settle()
        return multiple(*reqs)

    @rule(req=handles)
    def wait(self, req: ModelRequest) -> None:
        if req.state == "queued":
            with raises(WaitTimeout, f"S7: wait(0) on queued {req}"):
                req.handle.wait(0)
            return
        if req.state == "held":
            mv = req.handle.wait(0)
            assert mv is req.view
            info = self.view_info(req)
            assert info == (req.addr, req.length, req.pool_offset), (
                f"S10: a second wait on held {req} returned another view: {info}"
            )
            return
        # READY after settling: staged, though a slot a write landed on during
        # its fill may still be catching up with the write buffer (S18, with
        # the device lock dropped), which wait lets finish: a bounded wait,
        # not a poll
        mv = req.handle.wait(SETTLE_TIMEOUT_S)
        dev_addr, length, pool_offset = self.view_info(req)
        assert len(mv) == length == req.length and dev_addr == req.addr, (
            f"S2: the view of {req} is [{dev_addr:#x}+{length}), {len(mv)} bytes"
        )
        req.view = mv
        req.pool_offset = pool_offset
        req.state = "held"
        want = self.model.expected_view(req, self.image)
        got = mv.tobytes()
        if self.data:
            assert got == want, f"S2: the view of {req} differs from the model " + (
                _first_diff(got, want, req.addr)
            )
        req.snapshot = bytearray(got)
        note(f"wait {req!r} -> view at pool offset {pool_offset:#x}")

    @rule(req=consumes(handles), target=dead)
    def release(self, req: ModelRequest) -> ModelRequest:
        return self._release_settled(req)

    @precondition(lambda self: self.model.stages)
    @rule(
        target=handles,
        objs=st.lists(OBJ, min_size=1, max_size=8),
        noqueue=st.booleans(),
        bad=st.integers(-1, 7),
    )
    def prefetch_batch(self, objs: list[tuple[int, int]], noqueue: bool, bad: int) -> Any:
        """S8 per element: one prefetch_many call gives every object, in
        order, what prefetch() would have (a slot, the queue or EAGAIN); an
        element of length 0 (``bad``) is refused alone."""
        lens = [n if i != bad else 0 for i, (_, n) in enumerate(objs)]
        out = self.d.prefetch_many([a for a, _ in objs], lens, noqueue=noqueue)
        assert len(out) == len(objs)
        reqs = []
        for i, ((addr, length), got) in enumerate(zip(objs, out, strict=True)):
            if i == bad:
                assert isinstance(got, InvalidArgument), f"S8: element {i} of len 0 gave {got!r}"
                continue
            outcome = self.staging.predict_issue(noqueue)
            if isinstance(got, WouldBlock):
                assert outcome == "reject", f"S8: batch element {i} got EAGAIN, model {outcome}"
                self.c.add("prefetch_rejected")
                continue
            # a handle of whatever kind the front end issues (chm.Handle here)
            assert not isinstance(got, BaseException), f"S8: batch element {i}: {got!r}"
            assert outcome != "reject", f"S8: batch element {i} issued, the model rejects it"
            req = ModelRequest(addr, length, fill_range(addr, length, self.geometry.capacity), got)
            self.staging.issue(req, outcome)
            self.c.add("prefetch_issued")
            if outcome == "queue":
                self.c.add("prefetch_queued")
            else:
                self._fill_started(req)
            reqs.append(req)
        event(f"prefetch batch: {len(reqs)} of {len(objs)} issued")
        note(f"prefetch_many {objs} (noqueue={noqueue}, bad={bad}) -> {reqs}")
        self._settle()
        return multiple(*reqs)

    @rule(reqs=st.lists(consumes(handles), min_size=1, max_size=6), target=dead)
    def release_batch(self, reqs: list[ModelRequest]) -> Any:
        """S3, S7: one release_many call releases every handle, in order; the
        queue's head takes each freed slot as with one release at a time."""
        # queued ones first: a slot freed by the batch then goes to a request
        # outside it (one promoted and released in the same call would be
        # orphaned while FILLING, which one release at a time never is)
        reqs = sorted(reqs, key=lambda r: r.state != "queued")
        assert self.d.release_many([r.handle for r in reqs]) == [None] * len(reqs)
        promoted: list[ModelRequest] = []
        for req in reqs:
            assert req.handle.released, f"S3: {req} not released by release_many"
            promoted += self._release(req, done=True)
        for p in promoted:
            self._fill_started(p)
        self._settle()
        return multiple(*reqs)

    @precondition(lambda self: bool(self.staging.queue))
    @rule(req=consumes(handles), target=dead)
    def wait_then_release(self, req: ModelRequest) -> ModelRequest:
        """While requests wait for a slot: consume an object (wait, the usual
        lifecycle) and release it, which must start the queue's head."""
        if req.state != "queued":
            self.wait(req)
        return self._release_settled(req)

    @rule(req=dead)
    def use_released(self, req: ModelRequest) -> None:
        with raises(StaleHandle, f"S9: wait on released {req}"):
            req.handle.wait(0)
        with raises(StaleHandle, f"S3: second release of {req}"):
            self.d.adopt(req.handle.token).release()

    @rule(req=handles, how=st.sampled_from(["tag", "index"]))
    def use_foreign(self, req: ModelRequest, how: str) -> None:
        tok = req.handle.token
        # another device's tag, or a request index the device does not have
        bad = tok ^ (1 << 48) if how == "tag" else tok | 0xFFFFFF
        with raises(InvalidArgument, f"wait on foreign handle {bad:#x}"):
            self.d.adopt(bad).wait(0)
        with raises(InvalidArgument, f"release of foreign handle {bad:#x}"):
            self.d.adopt(bad).release()

    @precondition(lambda self: self.model.stages)
    @rule(obj=OBJ)
    def prefetch_release_at_once(self, obj: tuple[int, int]) -> None:
        """Races release against the fill (the fill_done_orphan path)."""
        req = self._issue(obj)
        if req is None:
            return
        slotted = req.state == "ready"
        self._release(req)
        if slotted:
            self._fill_started(req, orphan=True)
        self._settle()

    @precondition(lambda self: self.model.prefetch_error is not None)
    @rule(obj=OBJ)
    def prefetch_unsupported(self, obj: tuple[int, int]) -> None:
        err = self.model.prefetch_error
        assert err is not None
        with raises(err, f"prefetch in {self.mode} mode"):
            self.d.prefetch(*obj)

    # ---- rules: sessions (a second scope of handles, with a quota)

    @precondition(lambda self: self.model.stages and len(self.open_sessions) < self.max_sessions)
    @rule(target=sessions, quota=st.integers(1, 3))
    def open_session(self, quota: int) -> SessionModel:
        sm = SessionModel(self.d.session(quota=quota), quota)
        self.open_sessions.append(sm)
        note(f"open {sm!r}")
        return sm

    @rule(target=session_handles, sm=sessions, obj=OBJ)
    def session_prefetch(self, sm: SessionModel, obj: tuple[int, int]) -> Any:
        """S8 in a session: a prefetch takes a free slot while the session
        holds fewer than its quota, else WouldBlock. (noqueue, so the refill
        queue, served round-robin across sessions, holds only the device's
        own session's requests and stays the model's FIFO.)"""
        req = self._issue(obj, noqueue=True, sess=sm)
        if req is None:
            return multiple()
        self._fill_started(req)
        self._settle()
        return req

    @rule(req=session_handles)
    def session_wait(self, req: ModelRequest) -> None:
        if req.state == "released":  # its session was closed
            with raises(StaleHandle, f"S9: wait on {req} of a closed session"):
                req.handle.wait(0)
            return
        self.wait(req)

    @rule(req=consumes(session_handles), target=dead)
    def session_release(self, req: ModelRequest) -> ModelRequest:
        if req.state == "released":  # released by closing its session
            req.handle.release()  # a no-op, as a second release is
            return req
        return self._release_settled(req)

    @rule(req=session_handles)
    def session_foreign_handle(self, req: ModelRequest) -> None:
        """A session's handle is refused by the device's own session and by
        any other session (InvalidArgument), and keeps its slot."""
        if req.state == "released":
            return
        others = [sm.session for sm in self.open_sessions if sm is not req.session]
        for scope in [self.d, *others]:
            (got,) = scope.release_many([req.handle])
            assert isinstance(got, InvalidArgument), (
                f"release of {req} through {scope!r} (not its session) gave {got!r}"
            )
        assert not req.handle.released
        self._settle()

    @rule(req=handles, sm=sessions)
    def session_refuses_device_handle(self, req: ModelRequest, sm: SessionModel) -> None:
        """A handle of the device's own session is refused by a session."""
        (got,) = sm.session.release_many([req.handle])
        assert isinstance(got, InvalidArgument), f"{sm!r} released {req}: {got!r}"

    @rule(sm=consumes(sessions), target=dead)
    def close_session(self, sm: SessionModel) -> Any:
        """Closing a session releases every handle it holds (their slots go
        to the queue's head, S7) and ends their views; its handles are
        stale afterwards (S9)."""
        reqs = list(sm.reqs)
        sm.session.close()
        self.open_sessions.remove(sm)
        promoted: list[ModelRequest] = []
        for req in reqs:
            promoted += self._release(req, done=True)
        for p in promoted:
            self._fill_started(p)
        self._settle()
        for req in reqs:
            assert req.handle.released, f"S3: {req} not released by closing {sm!r}"
            with raises(StaleHandle, f"S9: wait on {req} after its session closed"):
                req.handle.wait(0)
        note(f"close {sm!r}: released {reqs}, promoted {promoted}")
        return multiple(*reqs)

    # ---- rules: data path

    @rule(rng=READ)
    def read(self, rng: tuple[int, int]) -> None:
        """W1, W7 / L4: reads return the newest written (or original) bytes,
        whatever the write buffer or the cache lines are doing."""
        self._read(*rng, "W1, W7 / L4")

    @precondition(
        lambda self: self.model.write_buffer and any(r.staged for r in self.staging.slotted)
    )
    @rule(data=st.data())
    def read_staged(self, data: st.DataObject) -> None:
        """S14: any range inside a staged object's (widened) fill is a hit,
        unless a write landed on it since its view was handed out (W11: then
        a miss, unless another staged slot covers it)."""
        req = data.draw(st.sampled_from(self._staged()), label="staged")
        a, b = req.fill
        addr = data.draw(st.integers(a, b - 1), label="addr")
        length = data.draw(st.integers(1, b - addr), label="length")
        outcome = self.staging.read_outcome(addr, length)
        before = self.d.stats().read_hits
        self._read(addr, length, "S14")
        hits = self.d.stats().read_hits - before
        if outcome == "hit":
            assert hits == 1, f"S14: read inside {req} was a miss"
        elif outcome == "miss":
            assert hits == 0, f"S14, W11: read inside {req}, written over since wait, was a hit"

    @rule(rng=WRITE)
    def write(self, rng: tuple[int, int]) -> None:
        self._write(*rng)

    @rule(rngs=st.lists(WRITE, min_size=2, max_size=6))
    def write_burst(self, rngs: list[tuple[int, int]]) -> None:
        """Back-to-back writes: faster than the flusher, so some get skipped."""
        for addr, length in rngs:
            self._write(addr, length, "burst write")

    @rule(rngs=st.lists(WRITE, min_size=1, max_size=6), bad=st.integers(-1, 5))
    def write_batch(self, rngs: list[tuple[int, int]], bad: int) -> None:
        """W2 per element: one write_many call gives every object, in order,
        what write() would have (admitted or skipped, W2); an element at a
        misaligned address (``bad``) alone is refused with InvalidArgument."""
        addrs = [a + IO_ALIGN // 2 if i == bad else a for i, (a, _) in enumerate(rngs)]
        datas = [self._payload(n) for _, n in rngs]
        out = self.d.write_many(addrs, datas)
        assert len(out) == len(rngs)
        skipped = []
        for i, (addr, data, got) in enumerate(zip(addrs, datas, out, strict=True)):
            if i == bad or self.model.write_refused(len(data)):
                assert isinstance(got, InvalidArgument), f"batch element {i} at {addr:#x}: {got!r}"
                continue
            assert isinstance(got, bool), f"batch element {i}: {got!r}"
            self._count_write(addr, len(data), got)
            if got:
                self.image[addr : addr + len(data)] = data
                self.model.wrote(addr, len(data))
            else:
                skipped.append((addr, len(data)))
        event(f"write batch: {sum(1 for g in out if g is True)} of {len(out)} admitted")
        note(f"write_many {[(hex(a), len(d)) for a, d in zip(addrs, datas, strict=True)]} -> {out}")
        if self.data:
            self._settle()
            for addr, length in skipped:
                self._read(addr, length, "W2: a skipped batch write changed the device")

    @precondition(lambda self: self.model.stages and bool(self.staging.slotted))
    @rule(data=st.data())
    def write_over_staged(self, data: st.DataObject) -> None:
        """A write overlapping a staged object (patched into its copy)."""
        req = data.draw(st.sampled_from(list(self.staging.slotted)), label="staged")
        lo = max(0, req.addr - 2 * IO_ALIGN) // IO_ALIGN
        hi = (min(self.geometry.capacity, req.end + 2 * IO_ALIGN) - 1) // IO_ALIGN
        a = data.draw(st.integers(lo, hi), label="first sector")
        b = data.draw(st.integers(a, min(hi, a + 40)), label="last sector")
        self._write(a * IO_ALIGN, (b - a + 1) * IO_ALIGN, f"write over {req!r}")

    @precondition(lambda self: self.model.write_buffer and self.staging.free > 0)
    @rule(target=handles, obj=OBJ, data=st.data())
    def write_during_fill(self, obj: tuple[int, int], data: st.DataObject) -> ModelRequest:
        """Races a write against a fill of the same range: the staged copy
        must show the write whichever finishes first (read-your-writes)."""
        req = self._issue(obj)
        assert req is not None and req.state == "ready"
        lo, hi = req.addr // IO_ALIGN, (req.end - 1) // IO_ALIGN
        a = data.draw(st.integers(lo, hi), label="first sector")
        b = data.draw(st.integers(a, min(hi, a + 16)), label="last sector")
        self._write(a * IO_ALIGN, (b - a + 1) * IO_ALIGN, f"write during fill of {req!r}")
        self._fill_started(req)
        self._settle()
        self.wait(req)  # held now; the view must match the model
        return req

    @precondition(lambda self: self.model.write_buffer and self.staging.free > 0)
    @rule(obj=OBJ)
    def read_during_fill(self, obj: tuple[int, int]) -> None:
        """Races a read against a fill: a hit or a miss, same bytes."""
        req = self._issue(obj)
        assert req is not None and req.state == "ready"
        addr, length = req.addr, req.length
        self.c.add("read_hits+read_misses")  # one read, a hit or a miss
        self.c.add("bytes_from_dram", 0, maybe=length)
        self.c.add("bytes_read_ssd", 0, maybe=widened(addr, length, self.geometry.capacity))
        got = self.d.read(addr, length)
        if self.data:
            want = bytes(self.image[addr : addr + length])
            assert got == want, "read during fill " + _first_diff(got, want, addr)
        self._fill_started(req)
        self._settle()
        self._release(req)  # keeps the window small; release of READY
        self._settle()

    # ---- rules: a second thread

    @precondition(
        lambda self: self.model.stages and (bool(self.staging.held) or self.staging.free > 0)
    )
    @rule(data=st.data(), writes=st.integers(2, 24), fresh=st.booleans())
    def concurrent_writer(self, data: st.DataObject, writes: int, fresh: bool) -> None:
        """W11, W10, L9: a second thread rewrites an object's range ``writes``
        times (every 8-byte word holds the write's version) while this one
        scans a view of it. The view never changes and so never goes back in
        time (W11; lru: a host copy); a view taken while the writer runs (a
        fresh prefetch) is one whole version, no older than the newest write
        admitted before wait (W10, L9: not a mix across lines); afterwards
        chm_read returns the newest admitted version (read-your-writes)."""
        fresh = (fresh and self.staging.free > 0) or not self.staging.held
        if not fresh:
            req = data.draw(st.sampled_from(self.staging.held), label="held")
        g = self.geometry
        tag = self.nwrites = self.nwrites + 1
        phase = [0]  # 0: before wait, 1: in wait, 2: wait returned
        log: list[tuple[int, bool, int, int]] = []  # (version, admitted, phase at start, end)
        newest = [0]  # newest admitted version
        started, stop = threading.Event(), threading.Event()
        failed: list[BaseException] = []
        span: tuple[int, int] | None = None

        def payload(v: int, length: int) -> bytes:
            return ((tag << 32) | v).to_bytes(8, "little") * (length // 8)

        def writer(addr: int, length: int) -> None:
            try:
                for v in range(1, writes + 1):
                    if stop.is_set():
                        break
                    p0 = phase[0]
                    ok = self.d.write(addr, payload(v, length))
                    if ok:
                        newest[0] = v
                    log.append((v, ok, p0, phase[0]))
                    started.set()
            except BaseException as e:  # re-raised by the rule's thread
                failed.append(e)
            finally:
                started.set()

        def versions(buf: bytes, base: int) -> set[int]:
            """The versions of this rule's writes in buf (device address
            base), or {-1} for bytes that are not such a version."""
            out: set[int] = set()
            if span is None:
                return out
            for i in range(0, len(buf) - 7):
                a = base + i
                if (a - span[0]) % 8 == 0 and span[0] <= a and a + 8 <= span[1]:
                    w = int.from_bytes(buf[i : i + 8], "little")
                    out.add(w & 0xFFFFFFFF if w >> 32 == tag else -1)
            return out

        obj = data.draw(OBJ, label="object") if fresh else (req.addr, req.length)
        wa = obj[0] // IO_ALIGN * IO_ALIGN
        wb = min(g.capacity, -(-(obj[0] + obj[1]) // IO_ALIGN) * IO_ALIGN)
        while wb - wa > IO_ALIGN and self.model.write_refused(wb - wa):
            wb -= IO_ALIGN  # a write larger than the write buffer is refused
        span = (wa, wb)
        t = threading.Thread(target=writer, args=(wa, wb - wa), daemon=True)
        t.start()
        try:
            started.wait(SETTLE_TIMEOUT_S)
            before = 0
            if fresh:
                before = newest[0]
                issued = self._issue(obj)
                assert issued is not None and issued.state == "ready", issued
                req = issued
                self._fill_started(req)
                self._settle()
                if self.model.view_from_wait:
                    before = newest[0]  # wait hands out every write admitted so far
                phase[0] = 1
                mv = req.handle.wait(SETTLE_TIMEOUT_S)
                phase[0] = 2
                _, _, req.pool_offset = self.view_info(req)
                req.view, req.state = mv, "held"
                req.snapshot = bytearray(mv.tobytes())
                req.lru_image = bytes(req.snapshot)
                if self.data:
                    got = versions(bytes(req.snapshot), req.addr)
                    assert len(got) <= 1, (
                        f"W10, L9: a view of {req} taken while it was rewritten mixes "
                        f"versions {sorted(got)} (-1: bytes from before the writer)"
                    )
                    if got and got != {-1}:
                        (v0,) = got
                        assert v0 >= before, (
                            f"W10: the view of {req} shows version {v0}, older than version "
                            f"{before}, admitted before wait"
                        )
                    elif got:
                        assert before == 0, (
                            f"W10: the view of {req} shows bytes from before the writer, though "
                            f"version {before} was admitted before wait"
                        )
            assert req.view is not None and req.snapshot is not None
            scans = 0
            while t.is_alive() or scans < 3:
                got_b = req.view.tobytes()
                scans += 1
                if got_b != req.snapshot:
                    raise AssertionError(
                        f"W11: scan {scans} of the held view of {req} changed while another thread "
                        f"wrote over it: versions {sorted(versions(got_b, req.addr))}, at wait "
                        f"{sorted(versions(bytes(req.snapshot), req.addr))} "
                        + _first_diff(got_b, bytes(req.snapshot), req.addr)
                    )
        except BaseException:
            stop.set()  # no writer left running behind a failed check
            t.join(SETTLE_TIMEOUT_S)
            raise
        t.join(SETTLE_TIMEOUT_S)
        assert not t.is_alive(), "the writer thread hangs"
        if failed:
            raise failed[0]
        admitted = [v for v, ok, _, _ in log if ok]
        for _, ok, _, _ in log:
            self._count_write(wa, wb - wa, ok)
        event("concurrent writer: " + ("fresh view" if fresh else "held view"))
        note(f"concurrent writer over [{wa:#x}, {wb:#x}): {log}; {scans} scans of {req!r}")
        if admitted:
            self.image[wa:wb] = payload(admitted[-1], wb - wa)
            self.model.wrote(wa, wb - wa)
            if fresh and self.model.view_from_wait:
                after = any(ok and p0 == 2 for _, ok, p0, _ in log)
                unsure = any(ok and p0 < 2 and p1 > 0 for _, ok, p0, p1 in log)
                req.stale = True if after else (None if unsure else False)
        self._read(wa, wb - wa, "W10: read-your-writes after a concurrent writer")

    @rule()
    def flush(self) -> None:
        """W3: a flush returns (W8) and everything admitted before it is in
        the backing files; the write buffer then drains (W6)."""
        self.d.flush(FLUSH_TIMEOUT_S)
        note("flush")
        self.model.check_flushed(self.d.stats())
        if self.model.write_buffer:
            self._wait_drained()
        if self.data:
            self._check_backing("W3: after flush")

    def _wait_drained(self) -> None:
        """W6: after a flush (and no new writes) the write buffer empties."""
        deadline = time.monotonic() + 5.0
        while True:
            s = self.d.stats()
            if s.wbuf_used_bytes == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"W6: write buffer still holds {s.wbuf_used_bytes} bytes 5 s after a flush"
                )
            time.sleep(0.001)

    @rule(
        kind=st.sampled_from(
            ["len0", "too_long", "beyond", "unaligned_write", "unaligned_len", "read_beyond"]
        )
    )
    def bad_argument(self, kind: str) -> None:
        """A call the mode's model says is a bad argument raises InvalidArgument."""
        method, args = self.model.bad_call(kind)
        with raises(InvalidArgument, f"bad argument {kind}: {method}{args!r:.60}"):
            getattr(self.d, method)(*args)

    # ---- invariants

    @invariant()
    def inv_S4_slot_accounting(self) -> None:
        """S4: slot and request accounting always sums; the window never changes."""
        if self.dev is None:
            return
        s = self.d.stats()
        m = self.staging
        parts = s.slots_free + s.slots_filling + s.slots_ready + s.slots_held + s.slots_failed
        assert parts == s.slots_total == m.slots_total, (parts, s.slots_total, m.slots_total)
        assert s.window_bytes == self.window_bytes, (s.window_bytes, self.window_bytes)
        got = (s.slots_free, s.slots_filling, s.slots_ready, s.slots_held, s.slots_failed)
        want = (m.free, 0, len(m.ready), len(m.held), 0)
        assert got == want, f"S4: slots free/filling/ready/held/failed {got}, model {want}"
        assert s.queue_len == len(m.queue), f"S4: queue_len {s.queue_len}, model {len(m.queue)}"

    @invariant()
    def inv_S7_freed_slot_goes_to_queue_head(self) -> None:
        """S7: a freed slot goes to the queue head at once (FIFO): no slot is
        FREE while a request is queued, and every request the model still has
        queued (the later ones, in FIFO order) is not staged: wait(0) times out."""
        if self.dev is None:
            return
        s = self.d.stats()
        assert not (s.queue_len and s.slots_free), (
            f"S7: {s.slots_free} slots FREE while {s.queue_len} requests are queued"
        )
        for pos, req in enumerate(self.staging.queue):
            with raises(WaitTimeout, f"S7: {req} at FIFO position {pos} is staged"):
                req.handle.wait(0)

    @invariant()
    def inv_S15_prefetch_counters_balance(self) -> None:
        """S15: prefetch counters balance: with no fill in flight, every issued
        prefetch completed, failed, was cancelled or is still queued."""
        if self.dev is None:
            return
        s = self.d.stats()
        pending = s.queue_len + s.slots_filling
        assert s.prefetch_issued == (
            s.prefetch_completed + s.prefetch_failed + s.prefetch_cancelled + pending
        ), (
            f"S15: issued {s.prefetch_issued} != completed {s.prefetch_completed} + failed "
            f"{s.prefetch_failed} + cancelled {s.prefetch_cancelled} + pending {pending}"
        )

    @invariant()
    def inv_S1_held_views_unchanged(self) -> None:
        """S1, W11: a slot is never refilled while held and a held view is a
        snapshot: every held view still shows what it showed at wait, whatever
        was written since, and no two held views share slot memory."""
        if self.dev is None:
            return
        spans = []
        for req in self.staging.held:
            assert req.view is not None and req.snapshot is not None
            got = req.view.tobytes()
            if got != req.snapshot:
                raise AssertionError(
                    f"S1: held view of {req} changed "
                    + (_first_diff(got, bytes(req.snapshot), req.addr))
                )
            if not self.model.view_in_pool(req):
                continue  # lru-mode views are host copies: no pool memory to share
            spans.append((req.pool_offset, req.pool_offset + req.length, req))
        spans.sort(key=lambda t: t[0])
        for (_, end, r1), (start, _, r2) in itertools.pairwise(spans):
            assert end <= start, f"S1: held views of {r1} and {r2} overlap in the pool"

    @invariant()
    def inv_S2_held_views_match_model(self) -> None:
        """S2: a held view shows the object's bytes (prefetch mode: until a
        write lands over it, W11; lru mode: a host copy made at the fill)."""
        if self.dev is None or not self.data or not self.model.view_from_wait:
            return
        for req in self.staging.held:
            assert req.snapshot is not None
            if req.stale is not False:
                continue
            assert req.snapshot == self.image[req.addr : req.end], f"S2: {req}"

    @invariant()
    def inv_S9_released_handles_stale(self) -> None:
        """S9: a released handle is stale forever (the last few are re-checked)."""
        if self.dev is None:
            return
        for tok in self.dead_tokens[-3:]:
            with raises(StaleHandle, f"S9: wait on released handle {tok:#x}"):
                self.d.adopt(tok).wait(0)

    @invariant()
    def inv_counters_match_model(self) -> None:
        """S4, S15, W2: every counter equals the model's (a range where a rule
        raced on purpose): prefetch issued/queued/rejected/released/cancelled/
        completed, read hits/misses, bytes moved, writes admitted/skipped."""
        if self.dev is None:
            return
        s = self.d.stats()
        derived = {
            "completed+cancelled": s.prefetch_completed + s.prefetch_cancelled,
            "read_hits+read_misses": s.read_hits + s.read_misses,
        }
        for name in (
            "prefetch_issued",
            "prefetch_queued",
            "prefetch_rejected",
            "prefetch_released",
            "prefetch_cancelled",
            "prefetch_completed",
            "prefetch_failed",
            "completed+cancelled",
            "wr_admitted",
            "wr_skipped",
            "wr_admitted_bytes",
            "wr_skipped_bytes",
            "bytes_from_dram",
        ):
            self.c.check(name, derived[name] if name in derived else getattr(s, name))
        # reads whose hit/miss the model knows, plus reads that may be either
        hits, misses = self.c.exact("read_hits"), self.c.exact("read_misses")
        either = self.c.exact("read_hits+read_misses")
        assert hits <= s.read_hits <= hits + either, ("read_hits", s.read_hits, hits, either)
        assert misses <= s.read_misses <= misses + either, (
            "read_misses",
            s.read_misses,
            misses,
            either,
        )
        assert s.read_hits + s.read_misses == hits + misses + either, (
            f"reads: hits {s.read_hits} + misses {s.read_misses}, model {hits} + {misses} "
            f"+ {either} either way"
        )
        self.model.check_counters(s)

    @invariant()
    def inv_W6_L1_L6_mode_state(self) -> None:
        """W6 (prefetch: write-buffer space sums, flushing never runs ahead),
        L1, L6 (lru: capacity never exceeded, line accounting sums): the
        mode model's checks of one stats snapshot."""
        if self.dev is None:
            return
        self.model.check_state(self.d.stats())


def _first_diff(got: bytes, want: bytes, base: int) -> str:
    if len(got) != len(want):
        return f"(length {len(got)} != {len(want)})"
    for i, (x, y) in enumerate(zip(got, want, strict=True)):
        if x != y:
            n = sum(1 for a, b in zip(got, want, strict=True) if a != b)
            return (
                f"(first difference at device address {base + i:#x}: got {got[i : i + 8].hex()}, "
                f"want {want[i : i + 8].hex()}; {n} bytes differ)"
            )
    return "(equal)"


def device_machine(
    backend: str,
    mode: str,
    geometry: Geometry | None = None,
    *,
    name: str | None = None,
    tmp_parent: str | None = None,
    device_factory: DeviceFactory | None = None,
    max_sessions: int | None = None,
) -> type[DeviceMachine]:
    """A :class:`DeviceMachine` subclass for one backend, mode and geometry;
    ``device_factory`` opens the device under test (default: an embedded
    :class:`chm.Device`), ``max_sessions`` bounds the sessions it opens
    besides the device's own (0 for a front end without ``session()``)."""
    attrs: dict[str, Any] = {
        "backend": backend,
        "mode": mode,
        "geometry": geometry or Geometry(),
        "tmp_parent": tmp_parent,
    }
    if device_factory is not None:
        attrs["device_factory"] = staticmethod(device_factory)
    if max_sessions is not None:
        attrs["max_sessions"] = max_sessions
    cls_name = name or f"{backend.capitalize()}{mode.capitalize()}Machine"
    return type(cls_name, (DeviceMachine,), attrs)
