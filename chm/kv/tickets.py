"""Tickets of asynchronous store calls, pollable through an eventfd.

``Store.put_async`` / ``get_async`` return at once with a :class:`Ticket`;
the call runs on the store's worker thread. ``done()`` polls, ``wait(t)``
blocks up to ``t`` seconds and returns the call's result (or raises its
exception), and ``fileno()`` is an eventfd that becomes readable when the
ticket is done, for an engine's event loop (``select``, ``selectors``,
``asyncio``'s ``add_reader``). The eventfd is closed by ``close()``, on
garbage collection, or when the ticket is used as a context manager.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from chm.errors import WaitTimeout

__all__ = ["Ticket"]


class Ticket:
    """The future result of one asynchronous store call."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._event = threading.Event()
        self._fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._result: Any = None
        self._exc: BaseException | None = None
        self._lock = threading.Lock()

    def _finish(self, result: Any = None, exc: BaseException | None = None) -> None:
        self._result, self._exc = result, exc
        self._event.set()
        with self._lock:
            if self._fd >= 0:
                os.eventfd_write(self._fd, 1)

    def done(self) -> bool:
        """True once the call has finished (never blocks)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """The call's result; WaitTimeout if not done within ``timeout`` seconds."""
        if not self._event.wait(timeout):
            raise WaitTimeout(None, f"{self.what}: not done after {timeout} s", call=self.what)
        if self._exc is not None:
            raise self._exc
        return self._result

    def fileno(self) -> int:
        """An eventfd that is readable once the ticket is done (owned by the ticket)."""
        if self._fd < 0:
            raise ValueError(f"{self.what}: ticket is closed")
        return self._fd

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __repr__(self) -> str:
        return f"<chm.kv.Ticket {self.what} {'done' if self.done() else 'pending'}>"
