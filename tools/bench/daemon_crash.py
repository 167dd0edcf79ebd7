#!/usr/bin/env python3
"""The daemon crash test's counts: SIGKILL during a KV write stream, restart, verify.

Each round streams puts + flushes from a client process, kills the daemon
with SIGKILL at a varying moment, restarts it on the same targets and reads
back every block whose flush was acknowledged.

    python tools/bench/daemon_crash.py --rounds 5
    python tools/bench/daemon_crash.py --quick --json results/daemon_crash.json

Verdicts last: 0 acknowledged blocks lost, 0 wrong, a new pool memfd after
every restart; exit 1 otherwise. These are correctness targets, so a
``--quick`` run (2 rounds) judges them as a full run does.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from _benchlib import Verdicts, environment, table, write_json

from chm.testing.daemon_crash import crash_round


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="crash rounds [5; --quick 2]")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds")
    ap.add_argument("--json", metavar="PATH", help="write the rounds and verdicts here")
    a = ap.parse_args()
    rounds = a.rounds if a.rounds is not None else (2 if a.quick else 5)
    if rounds < 1:
        ap.error(f"--rounds {rounds}: at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="chm-daemon-crash-"))
    rows = []
    acked = lost = wrong = reused = 0
    try:
        start = 0
        for k in range(rounds):
            r = crash_round(tmp, tmp / "chm.sock", start)
            start = max(r.acked) + 100
            rows.append([k + 1, len(r.acked), r.lost, r.wrong, "yes" if r.new_memfd else "NO"])
            acked += len(r.acked)
            lost += r.lost
            wrong += r.wrong
            reused += not r.new_memfd
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table(
        "daemon SIGKILL during writes",
        ["round", "acknowledged", "lost", "wrong", "new memfd"],
        rows,
    )
    v = Verdicts("daemon_crash", quick=a.quick)
    fmt = lambda x: f"{x:.0f}"  # noqa: E731
    v.check("acknowledged blocks lost", lost, 0, higher=False, fmt=fmt)
    v.check("acknowledged blocks wrong", wrong, 0, higher=False, fmt=fmt)
    v.check("restarts that reused the memfd", reused, 0, higher=False, fmt=fmt)
    v.check("acknowledged blocks checked", acked, 1, fmt=fmt)
    write_json(
        a.json,
        {
            "benchmark": "daemon_crash",
            "env": environment(),
            "quick": a.quick,
            "rounds": [
                dict(zip(("round", "acknowledged", "lost", "wrong", "new_memfd"), r, strict=True))
                for r in rows
            ],
            "verdicts": v.to_dict(),
        },
    )
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
