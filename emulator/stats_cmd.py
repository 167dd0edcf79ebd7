"""``chm-emu stats``: the counters of a running daemon (table, --json, --watch)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

import chm
import chm.remote
from chm.errors import ChmError
from chm.stats import enum_names

from .serve_cmd import DEFAULT_SOCKET

__all__ = ["stats"]


def _table(s: dict[str, Any]) -> Table:
    t = Table(
        title=f"chm-emu daemon {s['daemon']['pid']} on {s['daemon']['socket']}",
        title_justify="left",
    )
    t.add_column("group", style="bold")
    t.add_column("counter")
    t.add_column("value", justify="right")
    for group in ("daemon", "node", "held", "device", "kv", "staging"):
        counters = s.get(group) or {}
        if group == "device":
            counters = enum_names(counters)  # backend, mode, pool kind by name
        for k, v in counters.items():
            if isinstance(v, (int, float, str)) and not isinstance(v, bool):
                t.add_row(group, k, str(v))
    return t


@click.command()
@click.option(
    "--socket",
    "socket_path",
    default=DEFAULT_SOCKET,
    show_default=True,
    help="The daemon's socket.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--watch",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Print again every SECONDS until interrupted (Ctrl-C ends it; so does the "
    "daemon going away, with status 1).",
)
def stats(socket_path: str, as_json: bool, watch: float | None) -> None:
    """Show a running daemon's device, KV and client counters."""
    with _Interrupt() as stop:
        try:
            dev = chm.connect(socket_path)
        except (ChmError, OSError) as exc:
            raise click.ClickException(f"cannot reach the daemon at {socket_path}: {exc}") from None
        con = Console(highlight=False)
        stop.device = dev
        with dev:
            while not stop.is_set():
                try:
                    s = dev.daemon_stats()
                except ChmError as exc:
                    if stop.is_set():  # interrupted while the daemon was answering
                        return
                    raise click.ClickException(str(exc)) from None
                if as_json:
                    click.echo(json.dumps(s))
                else:
                    con.print(_table(s))
                if watch is None:
                    return
                stop.sleep(watch)


class _Interrupt:
    """SIGINT (Ctrl-C) as a flag, not an exception: a KeyboardInterrupt can
    land anywhere (inside a lock's acquisition, between a request and its
    answer) and leave the connection or a lock in a state nothing undoes.
    The handler only sets a flag (``is_set``) and aborts the connection (no lock taken:
    a call blocked on a stopped daemon returns at once); ``sleep`` returns at
    once when it has (the signal also writes to a wakeup pipe, so a SIGINT
    that arrives just before the sleep is not missed either)."""

    def __init__(self) -> None:
        self._set = False
        self.device: chm.remote.RemoteDevice | None = None
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def is_set(self) -> bool:
        return self._set

    def _on_signal(self, signum: int, frame: object) -> None:
        self._set = True
        if self.device is not None:
            self.device.abort("interrupted (SIGINT)")

    def __enter__(self) -> _Interrupt:
        self._old_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._old = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._set:
            left = end - time.monotonic()
            if left <= 0:
                return
            select.select([self._r], [], [], left)
            with contextlib.suppress(BlockingIOError):
                os.read(self._r, 512)

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._old)
        signal.set_wakeup_fd(self._old_fd)
        os.close(self._r)
        os.close(self._w)
