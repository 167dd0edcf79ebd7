"""Crash recovery check: a writer process is killed with SIGKILL, then the store is reopened.

The writer (``python -m chm.testing.kv_crash write DIR START``) puts blocks
whose bytes are a pure function of their key, calls ``flush()`` after each
batch, and only then prints ``ACK <first> <count>`` on stdout. The checker
kills it at a random moment, reopens the same backing and counts, over
every block acknowledged in all rounds so far: how many are found and
byte-exact (recovered), missing (lost), or found with other bytes (wrong);
and how many unacknowledged blocks were found (each must be byte-exact too).
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CrashResult", "block_for", "run_rounds"]

BATCH = 4


def block_for(key: int, size: int) -> np.ndarray[Any, Any]:
    """The bytes of block ``key``: reproducible from the key alone."""
    return np.random.default_rng(key).integers(0, 256, size, dtype=np.uint8)


def _store_options(block: int, backend: str) -> dict[str, Any]:
    return {
        "capacity": 131072 * block,
        "backend": backend,
        "dram": 16 * block,
        "slot_size": block,
        "device_options": {"wbuf": 8 * block},
    }


def _writer(directory: str, start: int, limit: int, block: int, backend: str) -> None:
    from chm.kv.store import PutStatus, Store

    out = sys.stdout.fileno()
    with Store.open(directory, **_store_options(block, backend)) as st:
        os.write(out, b"READY\n")
        key = start
        while key < start + limit:
            keys = list(range(key, key + BATCH))
            res = st.put(keys, [block_for(k, block) for k in keys])
            st.flush()
            n = 0
            for r in res:  # the leading run that is stored (a skip ends it)
                if r not in (PutStatus.STORED, PutStatus.EXISTS):
                    break
                n += 1
            if n:
                os.write(out, f"ACK {key} {n}\n".encode())
            key += BATCH
        os.write(out, b"DONE\n")
        time.sleep(3600)  # wait for the kill with the store open


@dataclass
class CrashResult:
    """Counts over every block acknowledged in all rounds so far."""

    rounds: int = 0
    acknowledged: int = 0
    recovered: int = 0  # found after the last reopen
    lost: int = 0  # acknowledged, not found (or failed its checksum)
    wrong: int = 0  # found with bytes other than written (any block)
    bytes_checked: int = 0
    unacknowledged_found: int = 0  # written, killed before the ack: fine either way
    kills_while_writing: int = 0  # kills that came before the writer was done
    kill_delays_s: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check(st: Any, keys: list[int], block: int, res: CrashResult) -> set[int]:
    """Byte-checks the keys that load; returns those that do not."""
    dst = np.empty(block, dtype=np.uint8)
    missed = set()
    for k in keys:
        dst[:] = 0
        if not st.get([k], [dst])[0]:
            missed.add(k)
            continue
        res.bytes_checked += block
        if not np.array_equal(dst, block_for(k, block)):
            res.wrong += 1
    return missed


def run_rounds(
    directory: str | os.PathLike[str],
    rounds: int,
    *,
    seed: int = 0,
    block: int = 16 << 10,
    per_round: int = 4096,
    backend: str = "pread",
    max_delay: float = 0.5,
    sample: int = 32,
) -> CrashResult:
    """``rounds`` writer processes on one backing, each killed with SIGKILL after
    a random delay (up to ``max_delay`` seconds after it is ready; it writes
    at most ``per_round`` blocks). After each kill the store is reopened:
    every acknowledged block must be there; the round's blocks and a sample
    of earlier ones are byte-checked, and after the last round all of them."""
    from chm.kv.store import Store

    d = os.fspath(directory)
    Path(d).mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    acked: set[int] = set()
    res = CrashResult()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for r in range(rounds):
        start = r * (per_round + BATCH)
        cmd = [
            sys.executable, "-m", "chm.testing.kv_crash", "write",
            d, str(start), str(per_round), str(block), backend,
        ]  # fmt: skip
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert p.stdout is not None
        buf = b""
        deadline = time.monotonic() + 60
        while b"READY\n" not in buf and time.monotonic() < deadline:
            if select.select([p.stdout], [], [], 1.0)[0]:
                chunk = os.read(p.stdout.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk
        if b"READY\n" not in buf:
            p.kill()
            _, err = p.communicate()
            raise RuntimeError(f"crash writer did not start: {err.decode(errors='replace')}")
        delay = rng.uniform(0.0, max_delay)
        res.kill_delays_s.append(round(delay, 3))
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        rest, err = p.communicate()
        if p.returncode != -signal.SIGKILL:
            raise RuntimeError(
                f"crash writer exited with {p.returncode}, not by SIGKILL: "
                f"{err.decode(errors='replace')}"
            )
        if b"DONE\n" not in buf + rest:
            res.kills_while_writing += 1
        for line in (buf + rest).splitlines():
            if line.startswith(b"ACK "):
                _, first, n = line.split()
                acked.update(range(int(first), int(first) + int(n)))
        res.rounds += 1
        last = r == rounds - 1
        with Store.open(d, **_store_options(block, backend)) as st:
            all_acked = sorted(acked)
            present = st.contains(all_acked) if all_acked else []
            res.acknowledged = len(all_acked)
            missing = {k for k, there in zip(all_acked, present, strict=True) if not there}
            mine = list(range(start, start + per_round + BATCH))
            res.unacknowledged_found += sum(
                1
                for k, there in zip(mine, st.contains(mine), strict=True)
                if there and k not in acked
            )
            if last:
                todo = sorted(set(all_acked) | set(range(0, start + per_round + BATCH)))
            else:
                earlier = [k for k in all_acked if k < start]
                todo = mine + rng.sample(earlier, min(sample, len(earlier)))
            missing |= _check(st, todo, block, res) & acked  # a checksum miss is lost too
            res.lost = len(missing)
            res.recovered = res.acknowledged - res.lost
    return res


def main(argv: list[str]) -> int:
    if len(argv) == 6 and argv[0] == "write":
        _writer(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), argv[5])
        return 0
    print(
        "usage: python -m chm.testing.kv_crash write DIR START LIMIT BLOCK BACKEND", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
