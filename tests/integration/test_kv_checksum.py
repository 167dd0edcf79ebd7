"""A block corrupted or torn on the backing file is a counted miss, never wrong KV."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from chm.kv import Store

MiB = 1 << 20
GEOM: dict[str, Any] = {
    "capacity": "64M",
    "dram": "16M",
    "slot_size": "1M",
    "device_options": {"wbuf": "4M"},
}


def blk(i: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).integers(0, 256, MiB, dtype=np.uint8)


def test_corrupted_block_on_the_backing_file(tmp_backing: Path, data_backend: str) -> None:
    with Store.open(tmp_backing, backend=data_backend, **GEOM) as st:
        for i in range(3):
            st.put([i], [blk(i)])
            st.flush()
        info = st.info(1)
        assert info is not None
    # flip one byte of block 1 and tear block 2 (its second half zeroed) on disk
    fd = os.open(tmp_backing / "kv.img", os.O_RDWR)
    try:
        one = os.pread(fd, 1, info["addr"] + 12345)
        os.pwrite(fd, bytes([one[0] ^ 0x40]), info["addr"] + 12345)
        os.pwrite(fd, bytes(MiB // 2), info["addr"] + MiB + MiB // 2)
        os.fsync(fd)
    finally:
        os.close(fd)
    with Store.open(tmp_backing, backend=data_backend, **GEOM) as st:
        out = [np.zeros(MiB, np.uint8) for _ in range(3)]
        assert st.get([0, 1, 2], out) == [True, False, False]
        assert np.array_equal(out[0], blk(0))
        s = st.stats()
        assert s.checksum_errors == 2 and s.gets_miss == 2
        assert st.contains([0, 1, 2]) == [True, False, False]  # dropped from the index
        assert st.load_prefix([0, 1], out[:2], timeout=10) == 1
    with Store.open(tmp_backing, backend=data_backend, **GEOM) as st:
        assert st.contains([0, 1, 2]) == [True, False, False]  # the drop was journaled
        assert st.put([1], [blk(1)]) == [0]  # and the key can be stored again


def test_torn_journal_tail_is_cut_off(tmp_backing: Path) -> None:
    with Store.open(tmp_backing, backend="pread", **GEOM) as st:
        st.put([1, 2], [blk(1), blk(2)])
        st.flush()
        journal = st.stats().journal_path
    with open(journal, "ab") as f:
        f.write(b"\x01" * 40)  # a record torn in the middle of its write
    with Store.open(tmp_backing, backend="pread", **GEOM) as st:
        s = st.stats()
        assert s.torn_journal_bytes == 40 and s.recovered_entries == 2
        out = [np.zeros(MiB, np.uint8)]
        assert st.get([2], out) == [True] and np.array_equal(out[0], blk(2))
    assert os.path.getsize(journal) % 64 == 0
