"""The ``chm-emu`` command line."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

import chm
from chm.backend import uring_unavailable
from chm.errors import ChmError, InvalidArgument
from chm.sizes import format_size, parse_size

from .cost_cmd import cost
from .demo_cmd import demo
from .devices_cmd import devices
from .flag_names import FlagErrors
from .kv_cmd import kv
from .serve_cmd import serve
from .stats_cmd import stats

console = Console(highlight=False)

_CONTEXT = {"help_option_names": ["-h", "--help"]}


@click.group(cls=FlagErrors, context_settings=_CONTEXT)
def main() -> None:
    """chm-emu: a CXL hybrid-memory device (DRAM in front of SSD) in software."""


main.add_command(cost)
main.add_command(demo)
main.add_command(devices)
main.add_command(kv)
main.add_command(serve)
main.add_command(stats)


# ---------------------------------------------------------------- version


@main.command()
def version() -> None:
    """Print the driver and C core versions."""
    click.echo(f"chm {chm.__version__} (C core {chm.version()})")


# ---------------------------------------------------------------- options


@main.command()
@click.option("--plain", is_flag=True, help="Tab-separated output instead of a table.")
def options(plain: bool) -> None:
    """List the device configuration options with defaults and help."""
    opts = chm.options()
    if plain:
        for o in opts:
            click.echo(f"{o.name}\t{o.type}\t{o.default}\t{_help_of(o)}")
        return
    table = Table(title="chm device options", title_justify="left")
    table.add_column("option", style="bold")
    table.add_column("type")
    table.add_column("default")
    table.add_column("meaning")
    for o in opts:
        table.add_row(o.name, o.type, o.default or "-", _help_of(o))
    console.print(table)


def _help_of(o: chm.OptionInfo) -> str:
    if o.name == "backend":
        return f"{o.help}; when not set (or auto): uring if this host allows io_uring, else pread"
    return o.help


# ---------------------------------------------------------------- demo


@dataclass
class _Obj:
    index: int
    addr: int
    length: int


def _pattern(index: int, length: int) -> np.ndarray[Any, Any]:
    """Recognisable contents: a text tag, then (index << 48 | word number) words."""
    words: np.ndarray[Any, Any] = np.arange(length // 8, dtype=np.uint64) | np.uint64(index << 48)
    tag = f"chm demo object {index} ".encode()
    raw = words.view(np.uint8)
    raw[: len(tag)] = np.frombuffer(tag, dtype=np.uint8)
    return words


def _expected_bytes(index: int, length: int) -> bytes:
    return _pattern(index, length).tobytes()


def _populate(path: Path, capacity: int, objs: list[_Obj]) -> None:
    """Writes the objects straight into the sparse backing file (one target)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, capacity)
        for o in objs:
            os.pwrite(fd, _pattern(o.index, o.length).tobytes(), o.addr)
        os.fsync(fd)
    finally:
        os.close(fd)


def _demo_dram(obj_bytes: int, slots: int) -> int:
    # each slot carries a little alignment slack; the write buffer takes 32M
    return (obj_bytes + parse_size("64K")) * slots + parse_size("32M")


def _open_demo_device(
    path: Path, capacity: int, obj_bytes: int, slots: int, backend: str, timing: str
) -> chm.Device:
    dram = _demo_dram(obj_bytes, slots)
    kw: dict[str, Any] = dict(
        targets=[path],
        create=True,  # the demo's own scratch file
        capacity=capacity,
        dram=dram,
        mode="prefetch",
        slot_size=obj_bytes,
        slots=slots,
        # one target: device address == file offset
        stripe_unit="1M",
        timing=timing,
    )
    dev = chm.Device.open(backend=backend, **kw)  # "auto": chosen at open time
    refused = uring_unavailable()
    if backend == "auto" and dev.backend == "pread" and refused:
        console.print(f"[yellow]io_uring is unavailable here ({refused}); using the pread backend.")
    return dev


def _stats_table(st: chm.Stats) -> Table:
    t = Table(title="device counters", title_justify="left")
    t.add_column("counter", style="bold")
    t.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("backend / mode", f"{st.backend_name} / {st.mode_name}"),
        ("staging slots", f"{st.slots_total} x {format_size(st.slot_bytes, exact=False)}"),
        ("prefetches issued", str(st.prefetch_issued)),
        ("  queued for a slot", str(st.prefetch_queued)),
        ("  staged into DRAM (fills completed)", str(st.staged)),
        ("  failed", str(st.prefetch_failed)),
        ("  released", str(st.prefetch_released)),
        ("  staged rate (of issued)", f"{st.staged_rate:.0%}"),
        ("read() calls: DRAM hits", str(st.read_hits)),
        ("read() calls: SSD misses", str(st.read_misses)),
        ("read() hit rate", f"{st.read_hit_rate:.0%}"),
        ("bytes read from SSD", format_size(st.bytes_read_ssd, exact=False)),
        ("bytes served from DRAM", format_size(st.bytes_from_dram, exact=False)),
        ("mean fill latency", f"{st.refill_lat_mean_ns / 1e6:.2f} ms"),
        ("DRAM pool", f"{format_size(st.pool_bytes, exact=False)} {st.pool_kind_name}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _object_size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A byte size ("16M", "64K") that is a positive multiple of 4K."""
    try:
        n = parse_size(value)
    except InvalidArgument as exc:
        raise click.BadParameter(exc.detail or str(exc.strerror), ctx, param) from None
    if n <= 0 or n % 4096:
        raise click.BadParameter(f"{value!r}: must be a positive multiple of 4K", ctx, param)
    return n


def _check_timing(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        chm.Config(timing=value)
    except InvalidArgument as exc:
        raise click.BadParameter(exc.detail or str(exc.strerror), ctx, param) from None
    return value


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


@main.command("stage-demo")
@click.option(
    "--backend",
    type=click.Choice(["auto", "uring", "pread"]),
    default="auto",
    show_default=True,
    help="I/O backend; auto: io_uring if this host allows it, else pread.",
)
@click.option(
    "--objects",
    "n_objects",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Objects to stage.",
)
@click.option(
    "--object-size",
    "obj_bytes",
    default="16M",
    callback=_object_size,
    show_default=True,
    help="Bytes per object, a multiple of 4K.",
)
@click.option(
    "--slots",
    type=click.IntRange(min=1),
    default=6,
    show_default=True,
    help="Staging slots in device DRAM.",
)
@click.option(
    "--timing",
    default="none",
    show_default=True,
    callback=_check_timing,
    help="Timing preset to pace the device to (none, gen5-tlc-200g, fpga-cxlhm).",
)
def stage_demo(backend: str, n_objects: int, obj_bytes: int, slots: int, timing: str) -> None:
    """Stage a few objects from a sparse backing file and show what the device did.

    Runs an embedded device over a temporary sparse file: writes recognisable
    objects into the file, prefetches them (more objects than slots, so some
    wait in the refill queue), checks every staged byte, reads a DRAM hit and
    an SSD miss, releases everything and prints the counters.
    """
    # the staged slots and the copies the checks make all live in host memory
    need = _demo_dram(obj_bytes, slots) + 3 * obj_bytes
    host = _host_memory()
    if host is not None and need > host // 2:
        raise click.UsageError(
            f"--object-size {format_size(obj_bytes)} with --slots {slots} needs about "
            f"{format_size(need, exact=False)} of memory; this host has "
            f"{format_size(host, exact=False)} (the demo uses at most half)"
        )
    spacing = max(obj_bytes * 4, parse_size("64M"))
    capacity = spacing * (n_objects + 2)
    objs = [_Obj(i, (i + 1) * spacing, obj_bytes) for i in range(n_objects)]
    miss_addr = 0  # never staged: a read there is an SSD miss

    tmp = Path(tempfile.mkdtemp(prefix="chm-demo-"))
    try:
        target = tmp / "ssd0.img"
        t0 = time.perf_counter()
        try:
            _populate(target, capacity, objs)
            fd = os.open(target, os.O_WRONLY)
            try:
                os.pwrite(fd, _expected_bytes(99, 65536), miss_addr)
            finally:
                os.close(fd)
        except OSError as exc:
            raise click.ClickException(
                f"could not write the backing file {target} "
                f"({format_size(capacity, exact=False)} sparse): {exc.strerror}"
            ) from exc
        console.print(
            f"[bold]backing file[/] {target}: {format_size(capacity, exact=False)} sparse, "
            f"{n_objects} objects of {format_size(obj_bytes, exact=False)} written "
            f"({time.perf_counter() - t0:.2f} s)"
        )
        try:
            dev = _open_demo_device(target, capacity, obj_bytes, slots, backend, timing)
        except ChmError as exc:
            raise click.ClickException(f"could not open the device: {exc}") from exc
        with dev:
            _run_demo(dev, objs, miss_addr, timing)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_demo(dev: chm.Device, objs: list[_Obj], miss_addr: int, timing: str) -> None:
    cfg = dev.config
    console.print(
        f"[bold]device[/] backend={cfg.backend} mode={cfg.mode} "
        f"dram={format_size(cfg.dram_bytes, exact=False)} "
        f"slots={dev.stats().slots_total} x {format_size(cfg.slot_bytes, exact=False)}"
    )
    t0 = time.perf_counter()
    handles = [dev.prefetch(o.addr, o.length) for o in objs]
    after_issue = dev.stats()
    console.print(
        f"issued {len(handles)} prefetches in {(time.perf_counter() - t0) * 1e3:.2f} ms "
        f"(none blocked): {after_issue.slots_filling + after_issue.slots_ready} filling/ready, "
        f"{after_issue.queue_len} waiting in the refill queue"
    )
    verified = 0
    hit_checked = False
    for o, h in zip(objs, handles, strict=True):
        tw = time.perf_counter()
        view = h.wait(timeout=30.0)
        waited = time.perf_counter() - tw
        expected = _expected_bytes(o.index, o.length)
        ok = bytes(view) == expected
        taglen = len(f"chm demo object {o.index}")
        tag = bytes(view[:taglen]).decode(errors="replace")
        if not ok:
            h.release()
            raise click.ClickException(f"object {o.index}: staged bytes differ from the file")
        verified += 1
        if not hit_checked:
            # A read inside a staged object is served from device DRAM.
            part = dev.read(o.addr + 4096, 65536)
            if part != expected[4096 : 4096 + 65536]:
                raise click.ClickException("DRAM hit returned wrong bytes")
            hit_checked = True
        del view
        h.release()
        console.print(
            f"  object {o.index} @ {o.addr:#x}: {format_size(o.length, exact=False)} "
            f"verified ('{tag}'), waited {waited * 1e3:.1f} ms"
        )
    miss = dev.read(miss_addr, 65536)
    if miss != _expected_bytes(99, 65536):
        raise click.ClickException("SSD miss returned wrong bytes")
    elapsed = time.perf_counter() - t0
    st = dev.stats()
    console.print(_stats_table(st))
    total = sum(o.length for o in objs)
    console.print(
        f"[bold]What happened:[/] {len(objs)} objects ({format_size(total, exact=False)}) were "
        f"staged through {st.slots_total} DRAM slots; {st.prefetch_queued} prefetches found no "
        f"free slot and waited in the bounded refill queue until earlier objects were released. "
        f"Every staged byte matched the backing file ({verified}/{len(objs)} objects). A read "
        f"inside a held object was a DRAM hit; a read of an unstaged range went to the SSD "
        f"without disturbing the staging window ({st.read_hits} hit, {st.read_misses} miss). "
        f"Staging ran at {total / elapsed / 2**30:.2f} GiB/s end to end on this host."
    )
    if timing != "none":
        if st.pacing_late:
            console.print(
                f"[yellow]Timing preset {timing}: this host was slower than the model on "
                f"{st.pacing_late} completions (late by {st.pacing_late_ns / 1e6:.1f} ms in all); "
                f"an emulator can slow hardware down, never speed it up."
            )
        else:
            console.print(f"Timing preset {timing}: every completion was paced to the model.")


if __name__ == "__main__":  # pragma: no cover
    main()
