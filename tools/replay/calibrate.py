#!/usr/bin/env python3
"""Fit a timing preset's SSD parameters to latency and bandwidth points.

The points are a preset's published figures (fw_spec/timing_presets.yaml,
--preset NAME) or measured here with fio on a local file (--fio PATH:
O_DIRECT random reads, io_uring, one job per --sizes x --depths). Prints
the points, the fitted latency, bandwidth and channel count
(chm.sim.replay.calibration), each point's residuals, the preset's own values
beside the fit, and the device options that make a preset of the fit
(--json writes them). Verdicts last: the fit's RMS log error within
--max-rms (exit 1 on a miss).

    python tools/replay/calibrate.py --preset gen5-tlc-200g
    python tools/replay/calibrate.py --fio /var/tmp/chm-fio.dat --json local-disk.json
    python tools/replay/calibrate.py --fio /var/tmp/chm-fio.dat --quick
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import yaml
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _benchlib as bl

import chm
from chm.errors import InvalidArgument
from chm.sim.replay import calibration as cal
from chm.sizes import format_size, parse_size

SPEC = Path(__file__).resolve().parents[2] / "fw_spec" / "timing_presets.yaml"
console = Console(highlight=False, markup=False)


def _preset_fields(name: str) -> dict[str, int]:
    """The preset's fields as the device sets them (csrc/timing.c)."""
    cfg = chm.Config(backend="ghost", capacity="1G", timing=name)
    keys = ("ssd_read_lat_ns", "ssd_read_bw_bps", "ssd_channels")
    return {k: int(cfg[k]) for k in keys}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--preset", help="Fit the published points of this preset (fw_spec).")
@click.option("--fio", "fio_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--sizes", default="4K,64K,1M", show_default=True, help="fio block sizes.")
@click.option("--depths", default="1,8,32", show_default=True, help="fio queue depths.")
@click.option("--runtime", type=float, default=2.0, show_default=True, help="s per fio job.")
@click.option("--quick", is_flag=True, help="fio: two sizes x two depths, 0.5 s each.")
@click.option("--max-rms", type=float, default=0.35, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
def main(
    preset: str | None,
    fio_path: Path | None,
    sizes: str,
    depths: str,
    runtime: float,
    quick: bool,
    max_rms: float,
    json_out: Path | None,
) -> None:
    """Fit the timing model's SSD parameters to published or measured points."""
    if (preset is None) == (fio_path is None):
        raise click.UsageError("give one of --preset NAME or --fio PATH")
    if preset is not None:
        doc = yaml.safe_load(SPEC.read_text())["presets"]
        if preset not in doc:
            raise click.BadParameter(f"{preset!r} (known: {', '.join(doc)})", param_hint="--preset")
        points = cal.spec_points(doc[preset]["points"])
        label = preset
    else:
        assert fio_path is not None
        try:
            sz = [parse_size(s) for s in sizes.split(",") if s.strip()]
            qd = [int(q) for q in depths.split(",") if q.strip()]
        except (InvalidArgument, ValueError) as exc:
            raise click.BadParameter(f"--sizes/--depths: {exc}") from None
        if quick:
            sz, qd, runtime = sz[:1] + sz[-1:], qd[:1] + qd[-1:], 0.5
        console.print(
            f"measuring {fio_path} with fio: sizes {sizes}, depths {qd}, {runtime} s each"
        )
        try:
            points = cal.fio_points(fio_path, sz, qd, runtime_s=runtime)
        except (RuntimeError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        label = f"fio {fio_path}"
    for p in points:
        console.print(
            f"  point: {p.op} {format_size(p.size_bytes)} QD{p.queue_depth}: "
            f"{p.latency_s * 1e6:.1f} us, {p.bandwidth_Bps / 1e9:.3f} GB/s  ({p.source})"
        )
    try:
        f = cal.fit(points)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    console.print(
        f"fit ({label}): ssd_read_lat_ns={f.lat_ns} ssd_read_bw_bps={f.bw_bps} "
        f"ssd_channels={f.channels}, RMS log error {f.rms_log_error:.3f}"
    )
    for p, dl, db in cal.residuals(points, f):
        console.print(
            f"  residual {format_size(p.size_bytes)} QD{p.queue_depth}: latency {dl:+.1%}, "
            f"bandwidth {db:+.1%}"
        )
    if preset is not None:
        built = _preset_fields(preset)
        console.print(f"preset {preset} as built: {built}")
        as_built = cal.Fit(
            "read", built["ssd_read_lat_ns"], built["ssd_read_bw_bps"], built["ssd_channels"], 0.0
        )
        for p, dl, db in cal.residuals(points, as_built):
            console.print(
                f"  as built, {format_size(p.size_bytes)} QD{p.queue_depth}: "
                f"latency {dl:+.1%}, bandwidth {db:+.1%}"
            )
    opts = f.options()
    console.print("device options for this fit: " + " ".join(f"{k}={v}" for k, v in opts.items()))
    if json_out is not None:
        doc_out = {
            "source": label,
            "points": [p.__dict__ for p in points],
            "fit": f.__dict__,
            "options": opts,
        }
        json_out.write_text(json.dumps(doc_out, indent=2) + "\n")
        console.print(f"wrote {json_out}")
    v = bl.Verdicts("calibrate")
    v.check("fit RMS log error", f.rms_log_error, max_rms, higher=False, fmt=lambda x: f"{x:.3f}")
    sys.exit(v.finish())


if __name__ == "__main__":
    main()
