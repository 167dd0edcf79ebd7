"""``chm-emu kv``: offline check and repair of a KV store (:mod:`chm.kv.repair`)."""

from __future__ import annotations

import json
import sys

import click

from chm.errors import ChmError
from chm.kv import repair as rp
from chm.sizes import parse_size

__all__ = ["kv"]


@click.group()
def kv() -> None:
    """Check and repair a KV store's journal against its device (offline)."""


def _fail(exc: ChmError) -> None:
    click.echo(f"chm-emu kv: {exc.strerror}", err=True)
    sys.exit(2)


@kv.command()
@click.argument("path", type=click.Path())
@click.option("--journal", default=None, help="The journal (default: BACKING.kvjournal).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(path: str, journal: str | None, as_json: bool) -> None:
    """Report a store's journal and blocks; exit 1 on damage, 2 on an error.

    PATH is the store's directory (kv.img inside) or its backing file.
    """
    try:
        r = rp.check(path, journal)
    except ChmError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps(r.to_dict(), indent=2))
    else:
        click.echo(f"backing          {r.backing}")
        click.echo(f"journal          {r.journal} ({r.journal_state})")
        for name in (
            "entries",
            "damaged_records",
            "missing_records",
            "torn_bytes",
            "header_mismatch",
            "headerless",
            "bad_payload",
            "device_blocks",
            "torn_blocks",
            "unjournaled",
        ):
            click.echo(f"{name:<16} {getattr(r, name)}")
        if r.damaged:
            click.echo("DAMAGED: " + "; ".join(r.problems) + f". Repair: chm-emu kv repair {path}")
        else:
            click.echo("ok")
    sys.exit(1 if r.damaged else 0)


@kv.command()
@click.argument("path", type=click.Path())
@click.option("--journal", default=None, help="The journal (default: BACKING.kvjournal).")
@click.option("--capacity", default=None, help="Store capacity, when no journal header is left.")
@click.option("--segment-bytes", default=None, help="Segment size, when no journal header is left.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def repair(
    path: str,
    journal: str | None,
    capacity: str | None,
    segment_bytes: str | None,
    as_json: bool,
) -> None:
    """Rebuild a damaged, empty or missing journal from what survives of it
    and the block headers on the device; the old journal is kept aside.

    PATH is the store's directory (kv.img inside) or its backing file.
    """
    try:
        r = rp.repair(
            path,
            journal,
            capacity=parse_size(capacity) if capacity else None,
            segment_bytes=parse_size(segment_bytes) if segment_bytes else None,
        )
    except ChmError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps(r.to_dict(), indent=2))
    elif not r.repaired:
        click.echo(f"{r.journal}: clean ({r.entries} entries); nothing to repair")
    else:
        click.echo(
            f"{r.journal}: rebuilt with {r.entries} entries ({r.from_journal} from the "
            f"journal, {r.from_device} from the device; {r.dropped} dropped: their blocks "
            "fail their checksum)"
        )
        if r.kept_aside:
            click.echo(f"the old journal is kept at {r.kept_aside}")
