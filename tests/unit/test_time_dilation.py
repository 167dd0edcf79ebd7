"""time_dilation: a real-time device runs its timing model D times slower.

On a real file (the pread backend, O_DIRECT) a direct-mode read whose modeled
cost is one SSD latency takes about D times that in wall time and the same on
the device clock; ``clock_ns()`` advances 1/D of the wall time; the option's
refusals are InvalidArgument naming it. Wall-time bounds are one-sided where
a noisy machine can only add time, and generous where it cannot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import chm
from chm.config import Config
from chm.errors import InvalidArgument

LAT_NS = 20_000_000  # the read's one modeled cost: 20 ms of SSD latency


def _open(make_device: Callable[..., chm.Device], dilation: int) -> chm.Device:
    # the shared factory: a sparse file in tmp_backing (O_DIRECT-capable), closed at teardown
    return make_device(
        "pread", capacity="16M", mode="direct", ssd_read_lat_ns=LAT_NS, time_dilation=dilation
    )


@pytest.mark.parametrize("dilation", [1, 8])
def test_paced_read_takes_d_times_longer_in_wall_time(
    make_device: Callable[..., chm.Device], dilation: int
) -> None:
    with _open(make_device, dilation) as dev:
        dev.read(0, 4096)  # the first read opens nothing lazily later
        w0, t0 = time.monotonic_ns(), dev.clock_ns()
        dev.read(1 << 20, 4096)
        t1, w1 = dev.clock_ns(), time.monotonic_ns()
        late = dev.stats().pacing_late
    wall, device = w1 - w0, t1 - t0
    # pacing never completes early (up to the truncation to whole device ns)
    assert wall + dilation >= LAT_NS * dilation, (wall, dilation)
    assert device + 1 >= LAT_NS, device
    # the host's own time adds to both, 1/D of it on the device clock
    assert wall < LAT_NS * dilation + 500_000_000, wall
    if late == 0:  # the disk kept up: the device time is the model's
        assert device < LAT_NS + 500_000_000 // dilation, device


def test_clock_advances_wall_over_d(make_device: Callable[..., chm.Device]) -> None:
    d = 16
    with _open(make_device, d) as dev:
        t0, w0 = dev.clock_ns(), time.monotonic_ns()
        time.sleep(0.1)
        w1, t1 = time.monotonic_ns(), dev.clock_ns()
        s = dev.stats().clock_now_ns
        assert dev.config["time_dilation"] == d
    # [t0, t1] spans [w0, w1] on a clock that is wall / D
    assert (t1 - t0) * d + d >= w1 - w0
    assert (t1 - t0) * d <= (w1 - w0) + 100_000_000
    assert s >= t1


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"time_dilation": 0}, "1..1000000"),
        ({"time_dilation": 1_000_001}, "1..1000000"),
        ({"time_dilation": 2, "clock": "virtual"}, "clock=real"),
    ],
)
def test_refusals_name_the_option(options: dict[str, Any], why: str) -> None:
    cfg = Config(backend="ghost", **options)
    with pytest.raises(InvalidArgument, match="time_dilation") as info:
        cfg.validate()
    assert why in str(info.value)
    with pytest.raises(InvalidArgument, match="time_dilation"):
        chm.Device.open(backend="ghost", **options)


def test_negative_is_refused_when_set() -> None:
    with pytest.raises(InvalidArgument, match="time_dilation"):
        Config(backend="ghost", time_dilation=-1)


def test_default_is_one_and_virtual_time_takes_it() -> None:
    cfg = Config(backend="ghost", clock="virtual")
    assert cfg["time_dilation"] == 1
    cfg.validate()
