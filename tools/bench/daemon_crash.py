#!/usr/bin/env python3
"""The daemon crash test's counts: SIGKILL during a KV write stream, restart, verify.

Each round streams puts + flushes from a client process, kills the daemon
with SIGKILL at a varying moment, restarts it on the same targets and reads
back every block whose flush was acknowledged.

    python tools/bench/daemon_crash.py --rounds 5

Verdicts last: 0 acknowledged blocks lost, 0 wrong, a new pool memfd after
every restart; exit 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from _benchlib import Verdicts, table

from chm_emu.serve_crash import crash_round


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="chm-daemon-crash-"))
    rows = []
    acked = lost = wrong = reused = 0
    try:
        start = 0
        for k in range(a.rounds):
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
    v = Verdicts("daemon_crash")
    fmt = lambda x: f"{x:.0f}"  # noqa: E731
    v.check("acknowledged blocks lost", lost, 0, higher=False, fmt=fmt)
    v.check("acknowledged blocks wrong", wrong, 0, higher=False, fmt=fmt)
    v.check("restarts that reused the memfd", reused, 0, higher=False, fmt=fmt)
    v.check("acknowledged blocks checked", acked, 1, fmt=fmt)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
