"""The opener every serving adapter shares (chm.integrations._tier), on real
files: path or socket, per-rank directories, the write buffer sized from the
engine's chunk and batch, the capacity check, and the loud failure when
another opener holds the path."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from chm.errors import Busy, InvalidArgument, NoSpace
from chm.integrations._tier import TierOptions, default_wbuf, open_tier
from chm.kv import Namespace, PutStatus
from chm.kv.capacity import free_bytes

MIB = 1 << 20
NS = Namespace(model="m")


def opts(path: Path, **kw: object) -> TierOptions:
    o = TierOptions(path=str(path), capacity="256M", dram="96M", slot_size="4M", backend="pread")
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def test_write_buffer_holds_one_store_call() -> None:
    assert default_wbuf(16 * MIB, 8, "1G", "16M") == 129 * MIB  # 8 chunks and their slack
    assert default_wbuf(None, 8, "1G", "16M") is None  # chunk unknown: the device default
    assert default_wbuf(MIB, 2, "1G", "16M") is None  # the device default is larger
    assert default_wbuf(64 * MIB, 8, "256M", "64M") is None  # no room beside two slots


def test_store_call_larger_than_the_write_buffer_is_stored(tmp_path: Path) -> None:
    t = open_tier(opts(tmp_path / "kv"), namespace=NS, chunk_bytes=4 * MIB, batch=8)
    try:
        wbuf = t.store.device.config.wbuf_bytes
        assert wbuf >= 8 * 4 * MIB
        blocks = [np.full(4 * MIB, i, np.uint8) for i in range(12)]  # 48 MiB > wbuf
        assert t.staging.put([bytes([i]) for i in range(12)], blocks) == [PutStatus.STORED] * 12
        assert t.stats()["staging_skipped"] == 0
    finally:
        t.close()


def test_path_xor_socket_and_daemon_settings(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"exactly one of 'chm\.path'"):
        open_tier(TierOptions(), namespace=NS, key_prefix="chm.")
    with pytest.raises(InvalidArgument, match="exactly one"):
        open_tier(opts(tmp_path, socket="/x.sock"), namespace=NS)
    with pytest.raises(InvalidArgument, match="'dram' is the daemon's setting"):
        open_tier(TierOptions(socket=str(tmp_path / "s"), dram="1G"), namespace=NS)


def test_embedded_settings_are_refused_with_a_daemon_or_nodes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An embedded store's settings given with socket or master would be
    ignored (the daemon's and the nodes' stores have their own): refused,
    naming each, before anything is connected to."""
    given = frozenset({"capacity", "slot_size", "batch"})  # batch: every tier's
    sock = TierOptions(socket=str(tmp_path / "no.sock"), capacity="1T", given=given)
    with (
        caplog.at_level(logging.ERROR, "chm.integrations"),
        pytest.raises(
            InvalidArgument,
            match=r"'chm\.capacity', 'chm\.slot_size': setting\(s\) of an embedded store "
            r"\('chm\.path'\); with 'chm\.socket' the store and its settings are the daemon's",
        ),
    ):
        open_tier(sock, namespace=NS, key_prefix="chm.")
    assert "chm: tier not in use" in caplog.text
    nodes = TierOptions(master="redis://127.0.0.1:1/0", given=frozenset({"backend"}))
    with pytest.raises(InvalidArgument, match=r"'backend': .* with 'master' .* each node's"):
        open_tier(nodes, namespace=NS)
    # the same settings on an embedded store are its own
    t = open_tier(opts(tmp_path / "kv", given=given), namespace=NS)
    t.close()


def test_second_opener_is_busy_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    t = open_tier(opts(tmp_path / "kv"), namespace=NS)
    try:
        with caplog.at_level(logging.ERROR, logger="chm.integrations"), pytest.raises(Busy):
            open_tier(opts(tmp_path / "kv"), namespace=NS, key_prefix="chm.")
        msg = caplog.records[-1].getMessage()
        assert msg.startswith("chm: tier not in use") and "chm.socket" in msg
        assert "chm.per_rank_dir" in msg and str(tmp_path / "kv") in msg
        r1 = open_tier(opts(tmp_path / "kv", per_rank_dir=True), namespace=NS, rank=1)
        assert r1.where == str(tmp_path / "kv" / "rank1")
        r1.close()
    finally:
        t.close()


def test_capacity_beyond_the_free_space(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    huge = f"{(free_bytes(tmp_path) >> 30) + 1024}G"
    with caplog.at_level(logging.ERROR, logger="chm.integrations"), pytest.raises(NoSpace):
        open_tier(opts(tmp_path / "kv", capacity=huge), namespace=NS)
    assert "sparse_overcommit" in caplog.records[-1].getMessage()
    assert not (tmp_path / "kv" / "kv.img").exists()
    t = open_tier(opts(tmp_path / "kv", capacity=huge, sparse_overcommit=True), namespace=NS)
    t.close()
