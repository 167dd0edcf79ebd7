"""A client's staging-queue skips, seen by the daemon: the adapters' queue
reports its counters (KV_STAGING), and the daemon's stats, ``chm-emu stats``
and its Prometheus endpoint show them; a client that never reports (an older
one) is served as before; a malformed report is a protocol error."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chm
from chm.integrations._tier import TierOptions, open_tier
from chm.kv import Namespace, PutStatus
from chm.remote import DaemonGone
from chm.remote.protocol import Op
from chm.testing.daemon_proc import DaemonProcess

MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[DaemonProcess, int]]:
    port = _free_port()
    args = [
        "--target", str(tmp_path / "t0.img"), "--create", "--capacity", "128M",
        "--dram", "40M", "--slot-size", "1M", "--backend", "pread",
        "--metrics", f"127.0.0.1:{port}",
    ]  # fmt: skip
    with DaemonProcess(args, tmp_path / "chm.sock") as d:
        yield d, port


def _metric(port: int, name: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def _until(what: str, check: object, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def _blocks(n: int) -> list[np.ndarray[Any, Any]]:
    return [np.full(MIB, i + 1, dtype=np.uint8) for i in range(n)]


def test_queue_skips_show_in_the_daemons_metrics_and_stats(
    daemon: tuple[DaemonProcess, int],
) -> None:
    d, port = daemon
    assert _metric(port, "chm_kv_staging_skipped_total") == 0
    tier = open_tier(
        TierOptions(socket=d.socket, staging=2 * MIB, flush_interval=None),
        namespace=Namespace(model="staging-report"),
    )
    try:
        # a call larger than the queue: its tail is skipped in this process
        got = tier.staging.submit([bytes([i]) * 8 for i in range(5)], _blocks(5)).wait(30)
        skipped = got.count(PutStatus.SKIPPED)
        st = tier.staging.stats()
        assert skipped > 0 and st.skipped == skipped
        _until(
            "the daemon's metrics count the skips",
            lambda: _metric(port, "chm_kv_staging_skipped_total") == skipped,
        )
        assert _metric(port, "chm_kv_staging_skipped_full_total") == st.skipped_full
        _until(  # the next periodic report (report_every_s) carries the stores
            "the daemon's metrics count the stores",
            lambda: _metric(port, "chm_kv_staging_stored_blocks_total") == st.stored_blocks,
        )
        assert _metric(port, "chm_kv_staging_queued_bytes") == 0
        assert _metric(port, "chm_kv_staging_capacity_bytes") == 2 * MIB
        assert _metric(port, "chm_kv_staging_clients") == 1
        out = subprocess.run(
            [sys.executable, "-m", "chm_emu.cli", "stats", "--socket", d.socket, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        s = json.loads(out)["staging"]
        assert s["skipped_total"] == skipped and s["clients"] == 1
        table = subprocess.run(
            [sys.executable, "-m", "chm_emu.cli", "stats", "--socket", d.socket],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert re.search(rf"staging\s.*skipped_total\s.*\b{skipped}\b", table), table
    finally:
        tier.close()
    # the client went: its counters stay in the totals, its queue does not
    _until("the client is gone", lambda: _metric(port, "chm_kv_staging_clients") == 0)
    assert _metric(port, "chm_kv_staging_skipped_total") == skipped
    assert _metric(port, "chm_kv_staging_capacity_bytes") == 0


def test_a_client_that_never_reports_is_served_as_before(
    daemon: tuple[DaemonProcess, int],
) -> None:
    d, port = daemon
    with chm.connect(d.socket) as dev:
        assert dev.welcome["staging_report"] is True
        kv = dev.kv(Namespace(model="old"))
        assert kv.put([b"a"], [_blocks(1)[0]]) == [PutStatus.STORED]
        assert dev.daemon_stats()["staging"]["clients"] == 0
        # a daemon that predates KV_STAGING says nothing of it in WELCOME: the
        # client then sends nothing (here the welcome is edited, as no older
        # daemon is installed to run)
        del dev.welcome["staging_report"]
        assert kv.report_staging({}) is False
        assert kv.contains([b"a"]) == [True]
    assert _metric(port, "chm_kv_staging_skipped_total") == 0


@pytest.mark.parametrize(
    "body",
    [{"queued_bytes": 1}, [1, 2], {"capacity_bytes": -1, "queued_bytes": 0,
     "submitted_blocks": 0, "stored_blocks": 0, "skipped_full": 0, "skipped_timeout": 0}],
)  # fmt: skip
def test_a_malformed_report_is_a_protocol_error(
    daemon: tuple[DaemonProcess, int], body: object
) -> None:
    d, _ = daemon
    with chm.connect(d.socket) as dev, pytest.raises(DaemonGone, match="KV_STAGING"):
        dev._call(Op.KV_STAGING, body)
    with chm.connect(d.socket) as dev:  # others are served on
        assert dev.daemon_stats()["daemon"]["protocol_errors"] == 1


def test_a_tcp_client_reports_too(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"0123456789abcdef0123456789abcdef")
    secret.chmod(0o600)
    args = [
        "--target", str(tmp_path / "t0.img"), "--create", "--capacity", "128M",
        "--dram", "40M", "--slot-size", "1M", "--backend", "pread",
        "--listen", "127.0.0.1:0", "--secret-file", str(secret),
    ]  # fmt: skip
    with DaemonProcess(args, tmp_path / "chm.sock") as d:
        (start,) = [e for e in d.events() if e.get("event") == "start"]
        url = "tcp://" + start["listen"]
        counters = {"capacity_bytes": 4 * MIB, "queued_bytes": MIB, "submitted_blocks": 9,
                    "stored_blocks": 5, "skipped_full": 3, "skipped_timeout": 1}  # fmt: skip
        with chm.connect(url, secret_file=str(secret)) as dev:
            assert dev.kv().report_staging(counters) is True
            s = dev.daemon_stats()["staging"]
            assert s["skipped_total"] == 4 and s["queued_bytes"] == MIB and s["clients"] == 1
        with chm.connect(d.socket) as dev:
            _until("the TCP client is gone", lambda: dev.daemon_stats()["staging"]["clients"] == 0)
            s = dev.daemon_stats()["staging"]
            assert s["skipped_total"] == 4 and s["stored_blocks_total"] == 5
            assert s["queued_bytes"] == 0
