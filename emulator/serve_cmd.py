"""``chm-emu serve``: run the daemon in the foreground (flags or a TOML file).

A TOML file has the serve settings at the top level and the device options
(any name ``chm-emu options`` lists) in ``[device]``::

    socket = "/run/chm/chm.sock"
    group = "chm"
    journal = "/var/lib/chm/kv.journal"
    force = []                 # refusal reasons to override, e.g. ["filesystem"]
    metrics = "127.0.0.1:9464" # optional Prometheus endpoint (loopback only)
    client_quota = 16          # slots + queue entries per client (default: all the device's)

    [device]
    targets = ["/dev/nvme1n1"]
    dram = "8G"
    mode = "prefetch"

Flags override the file.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import click

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from chm.errors import ChmError, InvalidArgument
from chm.sizes import parse_size

from .devices import FORCE_KEYS
from .metrics import parse_listen
from .serve import Daemon, ServeError, ServeOptions, setup_logging

__all__ = ["DEFAULT_SOCKET", "serve"]

DEFAULT_SOCKET = "/run/chm/chm.sock"
_TOP = {
    "socket",
    "group",
    "kv",
    "journal",
    "segment_bytes",
    "eviction",
    "area_bytes",
    "force",
    "metrics",
    "max_clients",
    "log_level",
    "device",
}


def _load_toml(path: str) -> dict[str, Any]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise click.UsageError(f"--config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise click.UsageError(f"--config {path}: {exc}") from None
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise click.UsageError(
            f"--config {path}: unknown setting(s) {', '.join(unknown)}; "
            "device options go in [device]"
        )
    if not isinstance(data.get("device", {}), dict):
        raise click.UsageError(f"--config {path}: [device] must be a table")
    return dict(data)


def _size(v: Any, what: str) -> int | None:
    if v is None:
        return None
    try:
        return parse_size(v) if isinstance(v, str) else int(v)
    except InvalidArgument as exc:
        raise click.UsageError(f"{what}: {exc.detail or exc}") from None


def _quota(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**32:
        raise click.UsageError(f"client_quota: an integer 1..2^32-1, not {value!r}")
    return value


@click.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="TOML settings.")
@click.option("--target", "targets", multiple=True, help="Block device or file (repeatable).")
@click.option("--capacity", help="Device capacity, e.g. 64G (default: the targets' size).")
@click.option("--dram", help="Device DRAM, e.g. 8G.")
@click.option("--slot-size", help="Staging slot size, e.g. 16M.")
@click.option("--pool", type=click.Choice(["memfd", "file"]), help="DRAM source (memfd default).")
@click.option("--pool-path", help="File or devdax device for --pool file.")
@click.option("--numa-node", type=int, help="NUMA node to place the DRAM pool on.")
@click.option("--mode", type=click.Choice(["prefetch", "lru", "direct"]), help="Device mode.")
@click.option("--timing", help="Timing preset (none, gen5-tlc-200g, fpga-cxlhm).")
@click.option("--backend", type=click.Choice(["auto", "uring", "pread"]), help="I/O backend.")
@click.option("--create", is_flag=True, default=None, help="Create or extend file targets.")
@click.option("--journal", help="KV journal path (default: beside the first file target).")
@click.option("--eviction", type=click.Choice(["lru", "fifo"]), help="KV segment eviction.")
@click.option("--no-kv", is_flag=True, default=None, help="Serve the device only, no KV store.")
@click.option("--socket", "socket_path", help=f"Unix socket path [default: {DEFAULT_SOCKET}].")
@click.option("--group", help="Group that may connect (socket mode 0660).")
@click.option(
    "--force",
    multiple=True,
    type=click.Choice(FORCE_KEYS),
    help="Use a target despite this refusal reason (repeatable).",
)
@click.option("--metrics", help="Serve Prometheus metrics on HOST:PORT (loopback only).")
@click.option(
    "--client-quota",
    type=click.IntRange(1, 2**32 - 1),
    help="Slots + queue entries one client may hold at once (default: all the device's).",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), help="Log level.")
def serve(config_file: str | None, **flags: Any) -> None:
    """Run the chm device daemon in the foreground, serving local clients.

    Logs are JSON lines on stderr. SIGTERM or SIGINT flushes the device,
    journals the KV index and exits 0.
    """
    data = _load_toml(config_file) if config_file else {}
    dev: dict[str, Any] = dict(data.get("device", {}))
    for flag, opt in (
        ("capacity", "capacity"),
        ("dram", "dram"),
        ("slot_size", "slot_size"),
        ("pool", "pool"),
        ("pool_path", "pool_path"),
        ("numa_node", "numa_node"),
        ("mode", "mode"),
        ("timing", "timing"),
        ("backend", "backend"),
        ("create", "create"),
    ):
        if flags[flag] is not None:
            dev[opt] = flags[flag]
    if flags["targets"]:
        dev["targets"] = list(flags["targets"])
    metrics = flags["metrics"] or data.get("metrics")
    if metrics:
        try:
            parse_listen(metrics)
        except ValueError as exc:
            raise click.UsageError(f"--metrics {exc}") from None
    force = list(flags["force"]) or list(data.get("force", []))
    bad = sorted(set(force) - set(FORCE_KEYS))
    if bad:
        raise click.UsageError(f"force: unknown reason(s) {bad}; valid: {', '.join(FORCE_KEYS)}")
    opts = ServeOptions(
        device=dev,
        socket=flags["socket_path"] or data.get("socket", DEFAULT_SOCKET),
        group=flags["group"] or data.get("group"),
        kv=not flags["no_kv"] and bool(data.get("kv", True)),
        journal=flags["journal"] or data.get("journal"),
        segment_bytes=_size(data.get("segment_bytes"), "segment_bytes"),
        eviction=flags["eviction"] or data.get("eviction", "lru"),
        area_bytes=_size(data.get("area_bytes"), "area_bytes"),
        force=force,
        metrics=metrics,
        max_clients=int(data.get("max_clients", 256)),
        client_quota=_quota(flags["client_quota"] or data.get("client_quota")),
    )
    log = setup_logging(flags["log_level"] or data.get("log_level", "info"))
    d = Daemon(opts, log)
    try:
        d.start()
    except (ServeError, ChmError) as exc:
        log.error(str(exc), extra={"event": "refused"})
        click.echo(f"chm-emu serve: {exc}", err=True)
        sys.exit(2)

    def _on_signal(signum: int, frame: object) -> None:
        log.info("stopping", extra={"event": "signal", "signal": signal.Signals(signum).name})
        d.stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        d.serve_forever()
    finally:
        d.close()
    log.info("stopped", extra={"event": "exit"})
