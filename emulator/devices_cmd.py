"""``chm-emu devices``: what serve could run on, and why not."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from chm.daemon.devices import discover
from chm.sizes import format_size

__all__ = ["devices"]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the discovery as JSON.")
def devices(as_json: bool) -> None:
    """List block devices with a verdict, devdax devices and NUMA nodes.

    A block device is usable by `chm-emu serve` only when it is not mounted
    and has no partitions, holders, filesystem or swap signature, and is
    writable; otherwise the verdict names why (serve refuses it unless
    --force names that reason).
    """
    d = discover()
    if as_json:
        click.echo(json.dumps(d.to_dict(), indent=2))
        return
    con = Console(highlight=False)
    t = Table(title="block devices", title_justify="left")
    for col in ("device", "size", "model", "lbs", "rot", "verdict"):
        t.add_column(col)
    for b in d.blocks:
        style = "green" if b.usable else "yellow"
        t.add_row(
            b.path,
            format_size(b.size, exact=False),
            b.model,
            str(b.logical_block_size),
            "yes" if b.rotational else "no",
            f"[{style}]{b.verdict}[/]",
        )
    con.print(t)
    if d.dax:
        t = Table(title="devdax devices", title_justify="left")
        for col in ("device", "size", "align", "target node"):
            t.add_column(col)
        for x in d.dax:
            t.add_row(x.path, format_size(x.size, exact=False), str(x.align), str(x.target_node))
        con.print(t)
    else:
        con.print("devdax devices: none (/sys/bus/dax/devices is empty or absent)")
    t = Table(title="NUMA nodes", title_justify="left")
    for col in ("node", "cpus", "memory", "CXL candidate"):
        t.add_column(col)
    for n in d.numa:
        cpus = ",".join(map(str, n.cpus)) if n.cpus else "none"
        t.add_row(
            str(n.node),
            cpus,
            format_size(n.mem_bytes, exact=False),
            "yes (memory, no CPUs)" if n.cxl_candidate else "no",
        )
    con.print(t)
    for note in d.notes:
        con.print(f"[dim]note: {note}[/]")
