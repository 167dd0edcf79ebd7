"""chm.sim.replay.calibration, fw_spec/timing_presets.yaml and tools/replay/calibrate.py."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import chm
from chm.sim.replay import calibration as cal

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "fw_spec" / "timing_presets.yaml"
TOOL = ROOT / "tools" / "replay" / "calibrate.py"


def _synthetic(lat_s: float, bw: float, c: int) -> list[cal.Point]:
    pts = []
    for size in (4096, 65536, 1 << 20):
        for qd in (1, 4, 16, 64):
            lat, b = cal.predict(size, qd, lat_s, bw, c)
            pts.append(cal.Point(size, qd, float(lat), float(b)))
    return pts


def test_fit_recovers_the_parameters_that_made_the_points() -> None:
    f = cal.fit(_synthetic(80e-6, 5e9, 8))
    assert f.channels == 8
    assert f.lat_ns == pytest.approx(80_000, rel=0.01)
    assert f.bw_bps == pytest.approx(5e9, rel=0.01)
    assert f.rms_log_error < 0.01
    assert all(
        abs(dl) < 0.02 and abs(db) < 0.02
        for _, dl, db in cal.residuals(_synthetic(80e-6, 5e9, 8), f)
    )
    assert f.options() == {
        "ssd_read_lat_ns": f.lat_ns,
        "ssd_read_bw_bps": f.bw_bps,
        "ssd_channels": 8,
    }


def test_the_model_at_queue_depth_one_is_the_core_s_refill_latency() -> None:
    # One 1 MiB fill on a fresh ghost device (one piece: max_io 1M) is one
    # channel transfer: lat + size * C / bw, which the device now reports as
    # its refill latency in device time.
    lat_ns, bw, c, size = 70_000, 3_000_000_000, 4, 1 << 20
    with chm.Device.open(
        backend="ghost",
        clock="virtual",
        capacity="1G",
        mode="prefetch",
        dram="16M",
        wbuf="4M",
        slot_size="1M",
        max_io="1M",
        ssd_read_lat_ns=lat_ns,
        ssd_read_bw_bps=bw,
        ssd_channels=c,
    ) as dev:
        with dev.prefetch(0, size) as h:
            assert len(h.wait()) == size
        st = dev.stats()
    model, _ = cal.predict(size, 1, lat_ns / 1e9, bw, c)
    assert st.refill_lat_count == 1
    assert st.refill_lat_sum_ns == lat_ns + math.ceil(size * c * 1e9 / bw)
    assert st.refill_lat_sum_ns / 1e9 == pytest.approx(float(model), abs=1e-9)  # whole ns


def test_every_preset_field_cites_a_source_and_equals_the_core() -> None:
    doc = yaml.safe_load(SPEC.read_text())["presets"]
    assert set(doc) == {"gen5-tlc-200g", "fpga-cxlhm"}
    for name, p in doc.items():
        cfg = chm.Config(backend="ghost", capacity="1G", timing=name)
        for field, v in p["fields"].items():
            assert v["source"].strip(), (name, field)
            assert int(cfg[field]) == v["value"], (name, field)
        pts = cal.spec_points(p["points"])
        assert len(pts) >= 3 and all(pt.source for pt in pts)


def test_bad_points_are_errors() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        cal.fit([cal.Point(4096, 1, 1e-4, 4e7)])
    with pytest.raises(ValueError, match="one of latency_us or bandwidth_GBps"):
        cal.spec_points([{"size": 4096, "qd": 1, "latency_us": 60, "bandwidth_GBps": 1}])
    with pytest.raises(ValueError, match="size and queue depth"):
        cal.Point(0, 1, 1e-4, 1.0)
    with pytest.raises(ValueError, match="no jobs"):
        cal.parse_fio({"jobs": []})


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio not installed")
def test_fio_measures_a_real_file(tmp_path: Path) -> None:
    pts = cal.fio_points(
        tmp_path / "f.dat", [4096, 65536], [1, 4], runtime_s=0.2, file_bytes=16 << 20
    )
    assert [(p.size_bytes, p.queue_depth) for p in pts] == [
        (4096, 1),
        (4096, 4),
        (65536, 1),
        (65536, 4),
    ]
    assert all(p.latency_s > 0 and p.bandwidth_Bps > 0 for p in pts)
    f = cal.fit(pts)
    assert 1 <= f.channels <= 64 and f.lat_ns > 0 and f.bw_bps > 0


def test_the_tool_fits_a_preset_and_rejects_unknown_ones() -> None:
    p = subprocess.run(
        [sys.executable, str(TOOL), "--preset", "gen5-tlc-200g"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "residual 4K QD1" in p.stdout and "as built" in p.stdout
    assert p.stdout.strip().splitlines()[-1] == "calibrate: all 1 targets met"
    bad = subprocess.run(
        [sys.executable, str(TOOL), "--preset", "nope"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "known: gen5-tlc-200g" in bad.stderr
