"""Two processes opening the same backing embedded: the second is refused, naming the first."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import chm
from chm.errors import Busy
from chm.kv import Store

GEOM = {"capacity": "64M", "dram": "16M", "slot_size": "1M"}


def test_a_second_process_is_refused(tmp_backing: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from chm.kv import Store
        st = Store.open({str(tmp_backing)!r}, backend="pread", capacity="64M", dram="16M",
                        slot_size="1M", device_options={{"wbuf": "4M"}})
        print("open", flush=True)
        sys.stdin.read()
        st.close()
        """
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "open\n"
        with pytest.raises(Busy) as ei:
            Store.open(tmp_backing, backend="pread", device_options={"wbuf": "4M"}, **GEOM)
        assert f"by pid {p.pid}" in str(ei.value)
        assert ei.value.filename == str(tmp_backing / "kv.img")
        with pytest.raises(Busy, match=f"kv.img: already open by pid {p.pid}"):
            chm.Device.open(targets=[tmp_backing / "kv.img"], backend="pread", wbuf="4M", **GEOM)
    finally:
        p.communicate("", timeout=30)
    assert p.returncode == 0
    Store.open(tmp_backing, backend="pread", device_options={"wbuf": "4M"}, **GEOM).close()
