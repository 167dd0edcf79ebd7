"""``chm-emu serve``: run the daemon in the foreground (flags or a TOML file).

A TOML file has the serve settings at the top level and the device options
(any name ``chm-emu options`` lists) in ``[device]``::

    socket = "/run/chm/chm.sock"
    group = "chm"
    journal = "/var/lib/chm/kv.journal"
    force = []                 # refusal reasons to override, e.g. ["filesystem"]
    metrics = "127.0.0.1:9464" # optional Prometheus endpoint (loopback only)
    client_quota = 16          # slots + queue entries per client (default: all the device's)
    raw = "1G"                 # raw client access to the top 1 GiB (default: none with KV)
    kv_writers = ["@chm-writers"]  # who may put/remove shared keys (default: every client)
    hello_timeout = 2.0        # seconds a new connection has to say HELLO
    idle_timeout = 0           # seconds a client may stay silent (0: forever)
    idle_reclaim = 60          # when full, a client idle this long gives way (0: never)
    poll_us = 200              # us a connection may poll for its client's next request (0: never)
    listen = "10.0.0.5:7464"   # TCP clients too (optional; needs secret_file)
    secret_file = "/etc/chm/secret"
    master = "redis://10.0.0.1:6379/0"  # a remote storage node (needs listen, node_name)
    node_name = "node-a"
    data_host = "10.0.0.5"     # the Transfer Engine's address (default: listen's host)
    lease = 3.0                # seconds the node's Master lease lasts unless renewed
    flush_interval = 0.2       # seconds between flushes of pending puts (default: none)

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

from chm.daemon.devices import FORCE_KEYS
from chm.daemon.metrics import parse_listen
from chm.daemon.options import POLL_US
from chm.daemon.server import Daemon, ServeError, ServeOptions, setup_logging
from chm.daemon.tcp import parse_hostport
from chm.errors import ChmError, InvalidArgument
from chm.sizes import parse_size

from .flag_names import in_flags

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
    "raw",
    "kv_writers",
    "hello_timeout",
    "idle_timeout",
    "idle_reclaim",
    "poll_us",
    "listen",
    "secret_file",
    "master",
    "node_name",
    "data_host",
    "lease",
    "flush_interval",
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


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def _seconds(value: Any, what: str, above: float | None) -> float:
    """Seconds (> above, or >= 0 when above is None) from a flag or the file."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or (value <= above if above is not None else value < 0):
        raise click.UsageError(f"{what}: a number of seconds, not {value!r}")
    return float(value)


def _poll_us(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
        raise click.UsageError(f"poll_us: an integer 0..1000000 (microseconds), not {value!r}")
    return value


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65536:
        raise click.UsageError(f"{what}: an integer 1..65536, not {value!r}")
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
@click.option(
    "--raw",
    "raw",
    help="Bytes at the top of the device clients may read and write raw, e.g. 1G "
    "(default: the whole device with --no-kv, none with the KV store).",
)
@click.option(
    "--kv-writer",
    "kv_writers",
    multiple=True,
    help="User, uid or @group that may put and remove shared KV keys (repeatable; "
    "default: every client; the others only read).",
)
@click.option(
    "--hello-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a new connection has to say HELLO [default: 2].",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0),
    help="Seconds a client may send nothing before it is disconnected; 0: never [default: 0].",
)
@click.option(
    "--idle-reclaim",
    type=click.FloatRange(min=0),
    help="At max_clients, the client idle longest gives way to a new one once idle this "
    "many seconds; 0: never [default: 60].",
)
@click.option(
    "--poll-us",
    type=click.IntRange(min=0, max=1_000_000),
    help="Microseconds a connection's thread may poll for its client's next request before "
    "it sleeps; the window follows the client's recent gaps between requests and is none "
    "for a client that asks less often (an idle daemon never polls); 0: never poll "
    "[default: 200].",
)
@click.option(
    "--listen",
    help="Serve TCP clients on HOST:PORT as well (authenticated with --secret-file).",
)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    help="File holding the shared secret TCP clients must prove (at least 16 bytes).",
)
@click.option(
    "--master",
    help="Be a remote storage node: register with the Master at redis://HOST:PORT/N and "
    "publish every stored block there (needs --listen and --node-name).",
)
@click.option("--node-name", help="The node's name in the Master (stable across restarts).")
@click.option(
    "--data-host",
    help="Address the Transfer Engine listens on for workers' reads and writes "
    "[default: --listen's host].",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds the node's lease in the Master lasts unless renewed [default: 3].",
)
@click.option(
    "--flush-interval",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds between flushes of the KV store's pending blocks, so a put is durable "
    "within about that long [default: only on request and at stop].",
)
@click.option(
    "--max-clients", type=click.IntRange(1, 65536), help="Clients at once [default: 256]."
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
            raise click.BadParameter(str(exc), param_hint="'--metrics'") from None
    listen = flags["listen"] or data.get("listen")
    secret_file = flags["secret_file"] or data.get("secret_file")
    if listen:
        try:
            parse_hostport(listen)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--listen'") from None
        if not secret_file:
            raise click.UsageError("--listen needs --secret-file: TCP clients must authenticate")
    master = flags["master"] or data.get("master")
    node_name = flags["node_name"] or data.get("node_name")
    if master and not (listen and node_name):
        raise click.UsageError("--master needs --listen and --node-name: workers dial the node")
    flush = _first(flags["flush_interval"], data.get("flush_interval"), False)
    flush = None if flush is False else flush
    writers = list(flags["kv_writers"]) or data.get("kv_writers")
    if writers is not None and (
        not isinstance(writers, list) or not all(isinstance(w, str) and w for w in writers)
    ):
        raise click.UsageError(
            f"kv_writers: a list of user names, uids or @groups, not {writers!r}"
        )
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
        max_clients=_count(flags["max_clients"] or data.get("max_clients", 256), "max_clients"),
        raw_bytes=_size(flags["raw"] or data.get("raw"), "--raw"),
        kv_writers=writers,
        listen=listen,
        secret_file=secret_file,
        master=master,
        node_name=node_name,
        data_host=flags["data_host"] or data.get("data_host"),
        lease=_seconds(_first(flags["lease"], data.get("lease"), 3.0), "lease", 0),
        flush_interval=None if flush is None else _seconds(flush, "flush_interval", 0),
        hello_timeout=_seconds(
            _first(flags["hello_timeout"], data.get("hello_timeout"), 2.0), "hello_timeout", 0
        ),
        idle_timeout=_seconds(
            _first(flags["idle_timeout"], data.get("idle_timeout"), 0.0), "idle_timeout", None
        ),
        idle_reclaim=_seconds(
            _first(flags["idle_reclaim"], data.get("idle_reclaim"), 60.0), "idle_reclaim", None
        ),
        client_quota=_quota(flags["client_quota"] or data.get("client_quota")),
        poll_us=_poll_us(_first(flags["poll_us"], data.get("poll_us"), POLL_US)),
    )
    log = setup_logging(flags["log_level"] or data.get("log_level", "info"))
    d = Daemon(opts, log)
    try:
        d.start()
    except (ServeError, ChmError) as exc:
        log.error(str(exc), extra={"event": "refused"})
        click.echo(f"chm-emu serve: {in_flags(str(exc), serve)}", err=True)
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
