"""The cost model of fw_spec/cost.yaml, mode by mode, against hand-computed times.

Each expectation is computed here from the preset's parameters with the
formulas of cost.yaml (not by calling the timing model): a fresh ghost device
in virtual time, one operation, and the simulated clock must move by exactly
that. The same bytes cost the same in every mode, and direct mode honours
the preset (gen5 and fpga differ).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import chm
from chm.errors import InvalidArgument, NotSupported

MIB = 1 << 20
L = 64 * MIB  # one object
PIECE = MIB  # max_io (default) and the lru line used here


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _xfer(n: int, bw: int, mult: int = 1) -> int:
    return _cdiv(n * mult * 10**9, bw) if bw else 0


class Preset:
    def __init__(self, name: str) -> None:
        cfg = chm.Config(timing=name)
        keys = (
            *("ssd_read_lat_ns", "ssd_write_lat_ns", "ssd_read_bw_bps", "ssd_write_bw_bps"),
            *("ssd_channels", "dram_bw_bps", "link_bw_bps", "link_lat_ns"),
        )
        self.p = {k: int(cfg[k]) for k in keys}

    def ssd(self, write: bool, nbytes: int, piece: int = PIECE) -> int:
        """SSD(L) of an idle drive: n pieces on C channels, all submitted together."""
        lat = self.p["ssd_write_lat_ns" if write else "ssd_read_lat_ns"]
        bw = self.p["ssd_write_bw_bps" if write else "ssd_read_bw_bps"]
        c = self.p["ssd_channels"] or 1
        n = _cdiv(nbytes, piece)
        chan = math.ceil(n / c) * (lat + _xfer(piece, bw, c))
        pipe = n * _xfer(piece, bw)
        return max(chan, pipe)

    def link(self, nbytes: int) -> int:
        """LINK(L) of an idle direction."""
        busy = max(_xfer(nbytes, self.p["dram_bw_bps"]), _xfer(nbytes, self.p["link_bw_bps"]))
        return busy + self.p["link_lat_ns"]


@contextmanager
def ghost(mode: str, preset: str, **kw: Any) -> Iterator[chm.Device]:
    opts: dict[str, Any] = dict(
        backend="ghost", clock="virtual", capacity="1T", mode=mode, timing=preset
    )
    if mode != "direct":
        opts["dram"] = "1G"
    if mode == "prefetch":
        opts.update(wbuf="256M", slot_size="64M")
    if mode == "lru":
        opts.update(lru_line="1M", slot_size="64M")
    opts.update(kw)
    with chm.Device.open(**opts) as dev:
        yield dev


def _elapsed(dev: chm.Device, op: Any) -> int:
    t0 = dev.clock_ns()
    op()
    return dev.clock_ns() - t0


def _wait_once(dev: chm.Device, addr: int) -> None:
    with dev.prefetch(addr, L) as h:
        h.wait(1.0)


PRESETS = ["fpga-cxlhm", "gen5-tlc-200g"]


@pytest.mark.parametrize("preset", PRESETS)
def test_reads_cost_the_same_in_every_mode(preset: str) -> None:
    m = Preset(preset)
    cold_read = m.ssd(False, L) + m.link(L)  # store and forward
    buf = bytearray(L)
    got = {}
    for mode in ("prefetch", "lru", "direct"):
        with ghost(mode, preset) as dev:
            got[f"{mode} miss"] = _elapsed(dev, lambda d=dev: d.read_into(0, buf))
    for mode in ("prefetch", "lru"):
        with ghost(mode, preset) as dev:
            got[f"{mode} prefetch+wait"] = _elapsed(dev, lambda d=dev: _wait_once(d, 0))
    assert got == dict.fromkeys(got, cold_read), (cold_read, got)


@pytest.mark.parametrize("preset", PRESETS)
def test_writes_pay_the_link_and_direct_also_the_ssd(preset: str) -> None:
    m = Preset(preset)
    got = {}
    for mode in ("prefetch", "lru", "direct"):
        with ghost(mode, preset) as dev:
            got[mode] = _elapsed(dev, lambda d=dev: d.write_length(0, L))
    assert got["prefetch"] == m.link(L)
    assert got["lru"] == m.link(L)  # whole lines, free victims: no I/O to wait for
    assert got["direct"] == m.link(L) + m.ssd(True, L)


def test_lru_hinted_read_pays_the_link_once_and_a_hit_pays_only_the_link() -> None:
    m = Preset("fpga-cxlhm")
    with ghost("lru", "fpga-cxlhm") as dev:
        assert _elapsed(dev, lambda: _wait_once(dev, 0)) == m.ssd(False, L) + m.link(L)
        buf = bytearray(L)
        assert _elapsed(dev, lambda: dev.read_into(0, buf)) == m.link(L)


def test_prefetch_hit_pays_only_the_link() -> None:
    m = Preset("fpga-cxlhm")
    with ghost("prefetch", "fpga-cxlhm") as dev:
        h = dev.prefetch(0, L)
        dev.advance_clock(dev.clock_ns() + 10**9)  # the fill is long done
        buf = bytearray(L)
        assert _elapsed(dev, lambda: dev.read_into(0, buf)) == m.link(L)
        h.release()


def test_direct_mode_honours_the_preset() -> None:
    buf = bytearray(L)
    t = {}
    for preset in PRESETS:
        with ghost("direct", preset) as dev:
            t[preset] = _elapsed(dev, lambda d=dev: d.read_into(0, buf))
    assert t["fpga-cxlhm"] < t["gen5-tlc-200g"], t


def test_a_flush_completes_when_the_modeled_ssd_says_so() -> None:
    m = Preset("fpga-cxlhm")
    with ghost("prefetch", "fpga-cxlhm") as dev:
        assert dev.write_length(0, L)
        t_in = dev.clock_ns()
        dev.flush()
        # the batch started when the data was in (reads idle) and ends at SSD(L)
        assert dev.clock_ns() - t_in == m.ssd(True, L)
        assert dev.stats().wbuf_used_bytes == 0


def test_the_buffer_fills_when_writes_outpace_the_ssd_and_idle_time_drains_it() -> None:
    m = Preset("fpga-cxlhm")
    with ghost("prefetch", "fpga-cxlhm", wbuf="128M") as dev:
        res = [dev.write_length(i * L, L) for i in range(4)]
        # two fit; the flush of the first is not done when the third arrives
        assert m.ssd(True, L) > m.link(L) - 2 * m.p["link_lat_ns"]
        assert res == [True, True, False, False]
        dev.advance_clock(dev.clock_ns() + 10**9)
        assert dev.stats().wbuf_used_bytes == 0
        assert dev.write_length(8 * L, L)


def test_clock_calls_refuse_bad_input() -> None:
    with ghost("prefetch", "fpga-cxlhm") as dev:
        t = dev.clock_ns()
        dev.advance_clock(t - 1 if t else 0)  # the past: nothing changes
        assert dev.clock_ns() == t
        with pytest.raises(InvalidArgument):
            dev.advance_clock(-1)
        with pytest.raises(InvalidArgument):
            dev.advance_clock(True)
        with pytest.raises(TypeError):
            dev.advance_clock("1")  # type: ignore[arg-type]
    with chm.Device.open(backend="ghost", capacity="1G", dram="64M", wbuf="8M") as dev:
        with pytest.raises(NotSupported):
            dev.advance_clock(10**9)
        assert dev.clock_ns() >= 0
    with (
        chm.Device.open(
            backend="pread", capacity="64M", dram="16M", wbuf="4M", slot_size="1M"
        ) as dev,
        pytest.raises(InvalidArgument, match="ghost backend"),
    ):
        dev.write_length(0, 4096)
