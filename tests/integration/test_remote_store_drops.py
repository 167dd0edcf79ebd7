"""The store's report of the blocks it drops on its own
(``Store.watch_drops``/``take_drops``), which a storage node
(``chm.daemon.node``) turns into Master unpublishes: on a real embedded
store (pread backend, files in the test's directory)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from chm.kv.keys import Namespace
from chm.kv.store import DROP_DTYPE, PutStatus, Store

MiB = 1 << 20
SEG8 = 8 * (MiB + 4096)  # 8 blocks of 1 MiB with their headers: a 72 MiB device holds 8
NS = Namespace(model="drops")


def _put(st: Store, keys: list[int]) -> None:
    for k in keys:
        for _ in range(200):
            (s,) = st.put([k], [np.full(MiB, k % 251, np.uint8)])
            if s != PutStatus.SKIPPED:
                break
            st.flush()  # the write buffer drains
        assert s == PutStatus.STORED, (k, s)


def test_take_drops_reports_evictions_not_removes(tmp_backing: Path) -> None:
    st = Store.open(
        tmp_backing,
        backend="pread",
        capacity="72M",
        dram="16M",
        slot_size="1M",
        device_options={"wbuf": "4M"},
        segment_bytes=SEG8,
        namespace=NS,
    )
    try:
        _put(st, list(range(8)))
        assert st.take_drops().size == 0  # not watching: nothing recorded
        st.watch_drops(limit=100)
        _put(st, list(range(8, 56)))  # segments 0..6
        ents = st.entries(list(range(8)))
        epochs = {k: e["epoch"] for k, e in zip(range(8), ents, strict=True) if e is not None}
        # a remove is its caller's to report: remove_seqs names each
        # removed block's put sequence, as take_drops does (None: absent)
        e21 = st.entries([21])[0]
        assert e21 is not None
        assert st.remove([20]) == [True]
        assert st.remove_seqs([21, 20, 999]) == [e21["epoch"], None, None]
        assert not any(st.contains([20, 21]))
        _put(st, list(range(100, 116)))  # two segments back: segment 0's 8 blocks go
        got = st.take_drops()
        assert got.dtype == DROP_DTYPE and got.size == 8
        ks = NS.keys(list(range(8)))
        mine = zip(got["hi"].tolist(), got["lo"].tolist(), got["epoch"].tolist(), strict=True)
        want = zip(ks["hi"].tolist(), ks["lo"].tolist(), [epochs[k] for k in range(8)], strict=True)
        assert sorted(mine) == sorted(want)
        assert not any(st.contains(list(range(8))))
        assert st.take_drops().size == 0  # drained
        st.watch_drops(limit=3)  # past the limit the oldest records go, counted
        before = st.stats().evicted_blocks
        _put(st, list(range(200, 216)))
        evicted = st.stats().evicted_blocks - before
        got = st.take_drops()
        assert evicted > 3 and got.size == 3 and st.drops_unreported == evicted - 3
    finally:
        st.close()
