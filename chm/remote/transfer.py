"""The data path between hosts: Mooncake Transfer Engine, one engine per process.

    eng = Engine.get("10.0.0.2")                 # initialize(host, "P2PHANDSHAKE", "tcp", "")
    buf = RegisteredBuffer(eng, 64 << 20)        # page-aligned host memory, registered
    status = eng.read(peer, [buf.addr], [pool_addr], [n], timeout=2.0)  # OK, FAILED, TIMEOUT

:class:`Engine` wraps ``mooncake.engine.TransferEngine`` (the
``mooncake-transfer-engine-non-cuda`` package: TCP transport here, RDMA by
configuration in production): its endpoint is ``host:rpc_port``, which a
peer names to read or write this process's registered memory. Transfers
are one-sided: the peer's software is not on the path.

Timeouts: the engine's synchronous batch calls block until the peer answers
or its connection breaks (a killed peer fails at once; a stopped or
partitioned one can block for long). :meth:`Engine.read` and
:meth:`Engine.write` therefore run the batch on a helper thread (the engine
releases the GIL) and wait at most ``timeout`` seconds: on a timeout they
return ``TIMEOUT`` and the local memory of that transfer is **quarantined**
(:meth:`RegisteredBuffer.quarantine`) until the late transfer ends, so no
later load can see bytes a stale transfer writes. Each peer has its own
helper threads, so a stopped node never delays transfers with other nodes. They return ``OK``,
``FAILED`` or ``TIMEOUT``; only ``OK`` means every byte arrived.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import mmap
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from chm.errors import ChmError, InvalidArgument, NoSpace, NotFound

__all__ = ["FAILED", "OK", "TIMEOUT", "Engine", "RegisteredBuffer", "TransferFailed"]

OK, FAILED, TIMEOUT = "ok", "failed", "timeout"


class TransferFailed(ChmError):
    """A Transfer Engine call failed (it returned a negative status)."""


def _engine_class() -> Any:
    try:
        from mooncake.engine import TransferEngine  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - the 'remote' extra is missing
        raise NotFound(
            None,
            "the remote data path needs mooncake-transfer-engine-non-cuda "
            "(pip install chm[remote])",
        ) from exc
    return TransferEngine


class Engine:
    """The process's Transfer Engine (see the module docstring).

    Use :meth:`get`: the engine allows one instance per process, so a second
    ``get`` with another host raises InvalidArgument.
    """

    _the: Engine | None = None
    _the_lock = threading.Lock()

    def __init__(self, host: str, protocol: str = "tcp") -> None:
        self.host = host
        self.protocol = protocol
        self._te = _engine_class()()
        rc = self._te.initialize(host, "P2PHANDSHAKE", protocol, "")
        if rc != 0:
            raise TransferFailed(None, f"TransferEngine.initialize({host!r}, {protocol!r}) = {rc}")
        self.rpc_port = int(self._te.get_rpc_port())
        # one small pool per peer: transfers stuck on a stopped node never
        # hold the threads another node's transfers need
        self._pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._regions: dict[int, int] = {}
        self._lock = threading.Lock()
        self.stats = {"reads": 0, "writes": 0, "bytes": 0, "failed": 0, "timeouts": 0}

    @classmethod
    def get(cls, host: str = "127.0.0.1", protocol: str = "tcp") -> Engine:
        """The process's engine, made on first use."""
        with cls._the_lock:
            if cls._the is None:
                cls._the = cls(host, protocol)
            elif cls._the.host != host or cls._the.protocol != protocol:
                raise InvalidArgument(
                    None,
                    f"this process's Transfer Engine is {cls._the.endpoint} over "
                    f"{cls._the.protocol}; one engine per process",
                )
            return cls._the

    @property
    def endpoint(self) -> str:
        """``host:rpc_port``: what peers name to reach this process's memory."""
        return f"{self.host}:{self.rpc_port}"

    def register(self, addr: int, length: int) -> None:
        """Registers ``[addr, addr + length)`` so peers may read or write it."""
        if length <= 0:
            raise InvalidArgument(None, f"register: length={length} must be > 0")
        rc = self._te.register_memory(addr, length)
        if rc != 0:
            raise TransferFailed(None, f"register_memory({addr:#x}, {length}) = {rc}")
        with self._lock:
            self._regions[addr] = length

    def unregister(self, addr: int) -> None:
        with self._lock:
            if self._regions.pop(addr, None) is None:
                return
        self._te.unregister_memory(addr)

    def _run(
        self,
        fn: Any,
        what: str,
        peer: str,
        local: Sequence[int],
        remote: Sequence[int],
        lengths: Sequence[int],
        timeout: float | None,
        on_late: Any = None,
    ) -> str:
        if not (len(local) == len(remote) == len(lengths)):
            raise InvalidArgument(None, f"{what}: local, remote and lengths differ in length")
        if not local:
            return OK
        with self._lock:
            pool = self._pools.get(peer)
            if pool is None:
                pool = self._pools[peer] = concurrent.futures.ThreadPoolExecutor(
                    2, thread_name_prefix=f"chm-te-{peer}"
                )
        fut = pool.submit(fn, peer, list(local), list(remote), list(lengths))
        try:
            rc = fut.result(timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self.stats["timeouts"] += 1
            if on_late is not None:
                ended = on_late()  # the transfer's memory is held until it ends
                fut.add_done_callback(lambda _f: ended())
            return TIMEOUT
        with self._lock:
            if rc != 0:
                self.stats["failed"] += 1
                return FAILED
            self.stats[what] += 1
            self.stats["bytes"] += sum(lengths)
        return OK

    def read(
        self,
        peer: str,
        local: Sequence[int],
        remote: Sequence[int],
        lengths: Sequence[int],
        timeout: float | None = None,
        on_late: Any = None,
    ) -> str:
        """One batched one-sided read of ``remote`` ranges at ``peer`` into ``local``.

        ``OK`` when every byte arrived; ``FAILED`` when the engine reported an
        error (the transfer is over); ``TIMEOUT`` after ``timeout`` seconds,
        the transfer still running: ``on_late()`` is called then and returns
        the callback to run when it ends (until then ``local`` may still be
        written), e.g. ``lambda: buf.quarantine(offset, n)``.
        """
        return self._run(
            self._te.batch_transfer_sync_read,
            "reads",
            peer,
            local,
            remote,
            lengths,
            timeout,
            on_late,
        )

    def write(
        self,
        peer: str,
        local: Sequence[int],
        remote: Sequence[int],
        lengths: Sequence[int],
        timeout: float | None = None,
        on_late: Any = None,
    ) -> str:
        """One batched one-sided write of ``local`` ranges into ``remote`` at ``peer``."""
        return self._run(
            self._te.batch_transfer_sync_write,
            "writes",
            peer,
            local,
            remote,
            lengths,
            timeout,
            on_late,
        )


class RegisteredBuffer:
    """Page-aligned anonymous memory registered with the engine, cut into regions.

    :meth:`take` hands out a region (first fit), :meth:`give` returns it,
    :meth:`quarantine` keeps a region out of use until a late transfer
    into it has ended (then it is given back).
    """

    def __init__(self, engine: Engine, nbytes: int) -> None:
        if nbytes <= 0:
            raise InvalidArgument(None, f"RegisteredBuffer: nbytes={nbytes} must be > 0")
        self.engine = engine
        self.nbytes = int(nbytes)
        self._map = mmap.mmap(-1, self.nbytes, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.addr = int(self.array.ctypes.data)
        engine.register(self.addr, self.nbytes)
        self._free: list[tuple[int, int]] = [(0, self.nbytes)]  # (offset, length), sorted
        self._lock = threading.Lock()
        self.quarantined = 0

    @staticmethod
    def span(nbytes: int) -> int:
        """The bytes a region of ``nbytes`` takes (64-byte aligned)."""
        return (int(nbytes) + 63) & ~63

    def take(self, nbytes: int) -> int:
        """The offset of a free region of ``nbytes`` (NoSpace when none is free)."""
        n = self.span(nbytes)
        with self._lock:
            for i, (off, ln) in enumerate(self._free):
                if ln >= n:
                    if ln == n:
                        del self._free[i]
                    else:
                        self._free[i] = (off + n, ln - n)
                    return off
        raise NoSpace(None, f"registered buffer: no free region of {nbytes} bytes")

    def give(self, offset: int, nbytes: int) -> None:
        n = self.span(nbytes)
        with self._lock:
            self._free.append((offset, n))
            self._free.sort()
            merged: list[tuple[int, int]] = []
            for off, ln in self._free:
                if merged and merged[-1][0] + merged[-1][1] == off:
                    merged[-1] = (merged[-1][0], merged[-1][1] + ln)
                else:
                    merged.append((off, ln))
            self._free = merged

    def quarantine(self, offset: int, nbytes: int) -> Any:
        """Marks a region as still written by a late transfer; returns the
        callback that gives it back (pass it as ``on_late``)."""
        with self._lock:
            self.quarantined += 1

        def done() -> None:
            with self._lock:
                self.quarantined -= 1
            self.give(offset, nbytes)

        return done

    def view(self, offset: int, nbytes: int) -> np.ndarray[Any, Any]:
        return self.array[offset : offset + nbytes]

    def close(self) -> None:
        self.engine.unregister(self.addr)
        del self.array
        with contextlib.suppress(BufferError):  # a view is still held: it keeps the mapping
            self._map.close()
