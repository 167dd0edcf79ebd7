"""``chm-emu stats``: the counters of a running daemon (table, --json, --watch)."""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

import chm
from chm.errors import ChmError

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
    for group in ("daemon", "held", "device", "kv"):
        for k, v in (s.get(group) or {}).items():
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
    try:
        dev = chm.connect(socket_path)
    except (ChmError, OSError) as exc:
        raise click.ClickException(f"cannot reach the daemon at {socket_path}: {exc}") from None
    con = Console(highlight=False)
    with dev:
        try:
            while True:
                try:
                    s = dev.daemon_stats()
                except ChmError as exc:
                    raise click.ClickException(str(exc)) from None
                if as_json:
                    click.echo(json.dumps(s))
                else:
                    con.print(_table(s))
                if watch is None:
                    return
                time.sleep(watch)
        except KeyboardInterrupt:  # the way to end --watch
            return
