#!/usr/bin/env python3
"""Remote prefix loads over Mooncake Transfer Engine, next to the engine's own raw read.

Redis (the Master), one storage node (a ``chm-emu serve --master`` daemon) and
one worker run in three network namespaces joined by veth pairs
(:mod:`chm.testing.netns`; loopback, said so, where namespaces cannot be
made). The worker (:func:`chm.testing.remote.measure`) saves N blocks to
the node, then alternates, ``--reps`` times:

(a) a remote prefix load of all N through chm (``RemoteTier.load``: Master
    lookup, stage on the node, one batched Transfer Engine read, release,
    checksum, copy into the caller's buffers), and
(b) the Transfer Engine's own batched read of the same staged bytes from
    the same node into the same buffer (the link's limit), and
(c) the same prefix load through the node's daemon over its Unix socket
    (``chm.connect(socket).kv().load_prefix``): what a worker on the
    node's own host gets, with no network in the way.

The headline is the median of the per-round chm / raw bandwidth ratios
(each round's two runs side by side, so the shared machine's drift between
rounds cancels; target >= 0.8), after one untimed warm-up round. Then
32-key Master lookups against Redis for a while: lookups/s (target
>= 500/s, a round trip under 2 ms: small next to moving even one 16 MiB
block over a link of a few GB/s).
Any load that misses a block, or wrong bytes, is a missed target.

    python tools/bench/remote_bench.py --quick
    python tools/bench/remote_bench.py --json results/remote_bench.json

The node has a resident region as large as the N blocks (its store's
admission keeps blocks read twice in device DRAM, as on one host), so
after the first turns a load is served from DRAM as the raw read is;
``--no-resident`` stages every load from the node's backing file instead.
Full run: 32 x 16 MiB. The verdict lines are printed last; the exit status
is 1 on a missed target.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _benchlib import (
    Verdicts,
    environment,
    fmt_bw,
    fmt_rate,
    median,
    paired_ratios,
    table,
    write_json,
)

from chm.testing.netns import Network
from chm.testing.redisd import RedisServer
from chm.testing.remote import NodeProcess, write_secret


def run(a: argparse.Namespace) -> tuple[dict[str, Any], Network]:
    net = Network(["redis", "node", "worker"], fallback=True)
    if net.loopback:
        print(f"remote_bench: network namespaces unavailable ({net.reason}): on loopback")
    slot = a.block_mib << 20
    wbuf = max(4, 8 // a.block_mib + 1) * slot if a.block_mib < 8 else 8 * slot
    resident = a.blocks * slot if a.resident else 0
    dram = (a.blocks + 2) * slot + wbuf + resident
    with tempfile.TemporaryDirectory(prefix="chm-remote-bench-") as tmp:
        secret = Path(tmp) / "secret"
        write_secret(secret)
        with (
            net,
            RedisServer(
                net.host("redis"), 0 if net.loopback else 6379, prefix=net.prefix("redis")
            ) as srv,
        ):
            opts = [
                "--capacity",
                str(2 * a.blocks * slot + wbuf),
                "--dram",
                str(dram),
                "--wbuf",
                str(wbuf),
                "--slot-size",
                str(slot),
                "--write-area",
                str(min(a.blocks, 8) * slot),
                "--resident",
                str(resident),
            ]
            node = NodeProcess(
                srv.url,
                "bench-node",
                Path(tmp) / "node",
                secret,
                host=net.host("node"),
                prefix=net.prefix("node"),
                options=opts,
            ).start()
            try:
                argv = [
                    *net.prefix("worker"),
                    sys.executable,
                    "-m",
                    "chm.testing.remote",
                    "measure",
                    srv.url,
                    net.host("worker"),
                    str(secret),
                    str(a.blocks),
                    str(slot),
                    str(a.reps),
                    str(a.lookup_seconds),
                    node.info["socket"],
                ]
                out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
                if out.returncode != 0:
                    raise SystemExit(f"remote_bench: the worker failed:\n{out.stderr[-3000:]}")
                res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
            finally:
                node.stop()
    return res, net


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 x 4 MiB, 3 reps: a smoke run")
    ap.add_argument("--blocks", type=int, default=None)
    ap.add_argument("--block-mib", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--lookup-seconds", type=float, default=None)
    ap.add_argument(
        "--no-resident",
        dest="resident",
        action="store_false",
        help="no resident region on the node: every load stages from its backing file",
    )
    ap.add_argument("--target", type=float, default=0.8, help="chm / raw bandwidth target")
    ap.add_argument(
        "--target-lookups",
        type=float,
        default=500.0,
        help="32-key Master lookups per second (500: a round trip under 2 ms)",
    )
    ap.add_argument("--json", default=None, help="write the results here")
    a = ap.parse_args()
    a.blocks = a.blocks or (8 if a.quick else 32)
    a.block_mib = a.block_mib or (4 if a.quick else 16)
    a.reps = a.reps or (3 if a.quick else 7)
    a.lookup_seconds = a.lookup_seconds or (0.5 if a.quick else 3.0)
    res, net = run(a)
    total = a.blocks * (a.block_mib << 20)
    chm_bw = [total / s for s in res["chm_s"]]
    raw_bw = [total / s for s in res["raw_s"]]
    m_chm, m_raw = median(chm_bw), median(raw_bw)
    local_bw = [total / s for s in res["local_s"]]
    m_local = median(local_bw)
    per_round = median(paired_ratios(chm_bw, raw_bw))
    vs_local = median(paired_ratios(chm_bw, local_bw))
    where = "loopback" if net.loopback else "3 network namespaces (veth + bridge)"
    table(
        f"remote prefix load: {a.blocks} x {a.block_mib} MiB, {a.reps} alternating runs, {where}",
        ["path", "median", "min", "max"],
        [
            [
                "chm (lookup+stage+read+verify+copy)",
                fmt_bw(m_chm),
                fmt_bw(min(chm_bw)),
                fmt_bw(max(chm_bw)),
            ],
            ["Transfer Engine raw read", fmt_bw(m_raw), fmt_bw(min(raw_bw)), fmt_bw(max(raw_bw))],
            [
                "local daemon (Unix socket, node's host)",
                fmt_bw(m_local),
                fmt_bw(min(local_bw)),
                fmt_bw(max(local_bw)),
            ],
        ],
    )
    print(
        f"Master lookups ({res['lookup_batch']} keys per round trip): "
        f"{res['lookups_per_s']:,.0f} lookups/s"
    )
    misses = sum(1 for h in res["hits"] if h != a.blocks and h != -1) + res["hits"].count(-1)
    v = Verdicts("remote_bench", quick=a.quick)
    print(
        f"chm / raw: {per_round:.2f}x (median of the per-round ratios; "
        f"ratio of the medians {m_chm / m_raw:.2f}x)"
    )
    print(
        f"chm remote / local daemon: {vs_local:.2f}x (median of the per-round ratios; the "
        "remote load crosses the link, the local one reads the shared pool)"
    )
    v.check("chm / raw Transfer Engine read bandwidth", per_round, a.target, speed=True)
    v.check("loads that missed a block", misses, 0, higher=False, fmt=lambda x: f"{x:.0f}")
    v.check(
        "loads with wrong bytes",
        0 if res["exact"] else 1,
        0,
        higher=False,
        fmt=lambda x: f"{x:.0f}",
    )
    v.check(
        f"{res['lookup_batch']}-key lookups/s against Redis",
        res["lookups_per_s"],
        a.target_lookups,
        fmt=fmt_rate,
        speed=True,
    )
    write_json(
        a.json,
        {
            "env": environment(),
            "args": vars(a),
            "loopback": net.loopback,
            "result": res,
            "verdicts": v.to_dict(),
        },
    )
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
