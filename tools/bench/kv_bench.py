#!/usr/bin/env python3
"""The KV layer's figures, each measured in this run, with its target.

(1) Index memory: bytes per entry of an index holding 10 TiB of 16 MiB
    blocks (655,360 entries, eq. 1), measured on a filled index; target
    <= 64 B/entry (~40 MB).
(2) Lookups/s: Index.find over 32-key batches on that index, all hits and
    half hits (the misses probe until an empty bucket); target >= 1,000,000
    keys/s for both. Store.prefix_len (namespace hashing of each key
    included) is shown next to it, with no target.
(3) Store get bandwidth into caller numpy buffers vs the raw prefetch / wait /
    copy loop (chm.kv.window.SlidingWindow, the same W_max) over the same
    objects on a real file (io_uring), alternating; target >= 0.9x.
(4) Multi-turn reload: users x turns through the connector, DRAM smaller
    than one user's history, every load cold (from the SSD); the connector's
    load bandwidth of the last turn vs fio sequential O_DIRECT read of the
    same file at the same object size and an iodepth of W_max; target >= 0.8x.
(5) Crash recovery: writer processes killed with SIGKILL at random moments
    (chm.testing.kv_crash); acknowledged, recovered, lost; target 0 lost, 0 wrong.

Verdict lines come last; the exit status is 1 when a target is missed.

    python tools/bench/kv_bench.py --quick
    python tools/bench/kv_bench.py --json results/kv_bench.json
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

import chm
from chm.kv import Connector, Namespace, Store, w_max
from chm.kv.index import Index, bytes_at
from chm.kv.keys import KEY_DTYPE
from chm.kv.window import SlidingWindow
from chm.testing.kv_crash import run_rounds

# _benchlib.py sits next to this file, which is on sys.path when the script is
# run as a file; `python -m tools.bench.kv_bench` puts the repository there instead.
if __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

TARGET_BYTES_PER_ENTRY = 64.0
TARGET_LOOKUPS = 1_000_000.0
TARGET_GET_RATIO = 0.9
TARGET_RELOAD_RATIO = 0.8
ENTRIES_10TB = (10 << 40) // (16 << 20)
DEFAULT_DIR = "/var/tmp/chm-bench-kv"


def random_keys(n: int, seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    k = np.zeros(n, dtype=KEY_DTYPE)
    k["hi"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    k["lo"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    return k


# ---------------------------------------------------------------- (1) + (2)


def part_index(reps: int, seconds: float) -> dict[str, Any]:
    n = ENTRIES_10TB
    ix = Index(n)
    keys = random_keys(n, 1)
    t0 = time.perf_counter()
    ix.put(keys, addr=0, length=16 << 20, checksum=0, epoch=0, segment=0)
    build = time.perf_counter() - t0
    per_entry = ix.nbytes / len(ix)
    miss = random_keys(16, 2)
    batches = {
        "all hits": [keys[i : i + 32].copy() for i in range(0, 32 * 64, 32)],
        "half hits": [np.concatenate([keys[i : i + 16], miss]) for i in range(0, 16 * 64, 16)],
    }

    def rate(batch_list: list[np.ndarray[Any, Any]]) -> float:
        find = ix.find

        def step(k: int) -> int:
            for j in range(k):
                find(batch_list[j % len(batch_list)])
            return k * 32

        done, dt = bl.run_for(seconds, step, 256)
        return done / dt

    series = {name: bl.Series(name, "keys/s") for name in batches}
    for rep in range(reps):
        for name in bl.rotate(list(batches), rep):
            series[name].add(rate(batches[name]))
    bl.console.print()
    bl.table(
        f"(1) index at 10 TiB of 16 MiB blocks ({n:,} entries), (2) Index.find of 32-key "
        f"batches, median of {reps}",
        ["measurement", "value"],
        [
            ["bytes per entry (56 B row + hash table)", f"{per_entry:.1f}"],
            ["index bytes", f"{ix.nbytes / 1e6:.1f} MB ({ix.nbytes / bl.MiB:.1f} MiB)"],
            ["bytes_at() formula", f"{bytes_at(n) / 1e6:.1f} MB"],
            ["build (one batched put)", f"{build:.2f} s"],
            ["longest probe run", ix.max_probe],
            *[[f"lookups, {k}", bl.fmt_rate(s.median)] for k, s in series.items()],
        ],
    )
    return {
        "entries": n,
        "bytes_per_entry": per_entry,
        "index_bytes": ix.nbytes,
        "build_seconds": build,
        "lookups": {k: s.to_dict() for k, s in series.items()},
    }


def store_prefix_rate(st: Store, seconds: float) -> float:
    """Store.prefix_len over 32 engine hashes (bytes) per call, hits then misses."""
    ks = [os.urandom(16) for _ in range(32 * 16)]
    st.put(ks[:16], [b"x" * 512] * 16)

    def step(k: int) -> int:
        for j in range(k):
            st.prefix_len(ks[(j % 16) * 32 : (j % 16) * 32 + 32])
        return k * 32

    done, dt = bl.run_for(seconds, step, 64)
    return done / dt


# ---------------------------------------------------------------- (3)


def raw_loop(dev: chm.Device, ranges: list[tuple[int, int]], window: int, dsts: list[Any]) -> float:
    """prefetch / wait / copy / release through a sliding window; seconds."""
    t0 = time.perf_counter()
    with SlidingWindow(dev, ranges, window) as win:
        for j, h in win:
            v = h.wait()
            np.copyto(dsts[j][: len(v)], np.frombuffer(v, np.uint8))
            del v
    return time.perf_counter() - t0


def part_get(directory: Path, block: int, nblocks: int, reps: int) -> dict[str, Any]:
    cap = -(-nblocks * block * 2 // (64 * bl.MiB)) * 64 * bl.MiB
    st = Store.open(
        directory / "get",
        capacity=cap,
        dram=16 * block + 4 * block,
        slot_size=block,
        backend="uring",
        device_options={"wbuf": 4 * block},
    )
    try:
        keys = list(range(nblocks))
        rng = np.random.default_rng(3)
        src = [rng.integers(0, 256, block, dtype=np.uint8) for _ in range(2)]
        for k in keys:
            st.put([k], [src[k % 2]])
            if k % 2:
                st.flush()
        st.flush()
        dev: chm.Device = st.device  # type: ignore[assignment]
        infos = [st.info(k) for k in keys]
        ranges = [(i["addr"], i["length"]) for i in infos if i is not None]
        window = w_max(block, nblocks)
        dsts = [np.empty(block, np.uint8) for _ in keys]
        raw = bl.Series("raw prefetch/wait/copy", "B/s")
        store = bl.Series("Store.get", "B/s")
        total = nblocks * block
        for rep in range(reps):
            for which in bl.rotate(["raw", "store"], rep):
                if which == "raw":
                    raw.add(total / raw_loop(dev, ranges, window, dsts))
                else:
                    t0 = time.perf_counter()
                    ok = st.get(keys, dsts)
                    dt = time.perf_counter() - t0
                    if not all(ok):
                        raise click.ClickException("Store.get missed a block it holds")
                    store.add(total / dt)
        if not all(np.array_equal(d, src[k % 2]) for k, d in zip(keys, dsts, strict=True)):
            raise click.ClickException("Store.get returned wrong bytes")
        ratio = bl.ratio(store.median, raw.median)
        paired = bl.median(bl.paired_ratios(store.values, raw.values))
        s = st.stats()
    finally:
        st.close()
    bl.console.print()
    bl.table(
        f"(3) get bandwidth, {nblocks} x {block // bl.MiB} MiB objects, io_uring, W = {window}, "
        f"staging {16} slots, median of {reps} alternating",
        ["reader", "bandwidth", "range"],
        [
            [
                x.name,
                bl.fmt_bw(x.median),
                f"{bl.fmt_bw(min(x.values))} .. {bl.fmt_bw(max(x.values))}",
            ]
            for x in (raw, store)
        ],
    )
    bl.console.print(
        f"  Store.get / raw: {bl.fmt_ratio(ratio)} (paired {bl.fmt_ratio(paired)}); checksum "
        f"errors {s.checksum_errors}"
    )
    return {
        "raw": raw.to_dict(),
        "store": store.to_dict(),
        "ratio": ratio,
        "paired": paired,
        "window": window,
    }


# ---------------------------------------------------------------- (4)


def part_reload(
    directory: Path, block: int, users: int, turns: int, prefix: int, growth: int, reps: int
) -> dict[str, Any]:
    tpb = 128
    bpt = block // tpb
    per_user = prefix + growth * (turns - 1)
    cap = -(-users * (per_user + growth) * block * 2 // (64 * bl.MiB)) * 64 * bl.MiB
    d = directory / "reload"
    st = Store.open(
        d,
        capacity=cap,
        dram=8 * block + 4 * block,  # staging: 8 slots, less than one user's history
        slot_size=block,
        backend="uring",
        device_options={"wbuf": 4 * block},
        namespace=Namespace(model="bench"),
    )
    conn = Connector(st, bytes_per_token=bpt, tokens_per_block=tpb)
    rng = np.random.default_rng(4)
    src = rng.integers(0, 256, block, dtype=np.uint8)
    hist: list[list[bytes]] = [[] for _ in range(users)]
    per_turn: list[dict[str, Any]] = []
    dsts = [np.empty(block, np.uint8) for _ in range(per_user + growth)]
    last = bl.Series("connector load, last turn", "B/s")
    cold: list[float] = []  # SSD bytes read per byte loaded (1.0: every load from the SSD)
    try:
        for t in range(turns):
            n = prefix if t == 0 else prefix + growth * t
            loaded = 0
            dt = 0.0
            for u in range(users):
                need = n - len(hist[u])
                new = [f"{u}:{len(hist[u]) + j}".encode() for j in range(need)]
                for j in range(0, len(new), 2):
                    conn.save((u, t), new[j : j + 2], [src] * len(new[j : j + 2]))
                    st.flush()
                hist[u] += new
                if t == 0:
                    continue
                t0 = time.perf_counter()
                got = conn.load((u, t), hist[u], dsts[: len(hist[u])])
                dt += time.perf_counter() - t0
                if got != len(hist[u]) * tpb:
                    raise click.ClickException(f"user {u} turn {t}: loaded {got} tokens")
                loaded += len(hist[u]) * block
            if t:
                per_turn.append({"turn": t, "bytes": loaded, "seconds": dt, "bw": loaded / dt})
        if not np.array_equal(dsts[0], src):
            raise click.ClickException("reload returned wrong bytes")
        # the last turn again, alternating with fio over the same file
        used = st.stats().allocated_bytes
        fio_size = max(block, used // block * block)
        fio = bl.Series("fio sequential read", "B/s")
        window = w_max(block, per_user)
        for rep in range(reps):
            for which in bl.rotate(["fio", "load"], rep):
                if which == "fio":
                    r = bl.fio_read(d / "kv.img", fio_size, bs=block, iodepth=window)
                    fio.add(r["bw_bps"])
                else:
                    ssd0 = st.device.stats().bytes_read_ssd
                    t0 = time.perf_counter()
                    nbytes = 0
                    for u in range(users):
                        got = conn.load(("again", u), hist[u], dsts[: len(hist[u])])
                        nbytes += got // tpb * block
                    last.add(nbytes / (time.perf_counter() - t0))
                    cold.append((st.device.stats().bytes_read_ssd - ssd0) / nbytes)
    finally:
        st.close()
    ratio = bl.ratio(last.median, fio.median)
    bl.console.print()
    bl.table(
        f"(4) multi-turn reload, {users} users x {turns} turns, {block // bl.MiB} MiB blocks, "
        f"prefix {prefix} + {growth}*t blocks, staging 8 slots (< one history), io_uring",
        ["turn", "loaded", "bandwidth"],
        [[p["turn"], f"{p['bytes'] / bl.MiB:,.0f} MiB", bl.fmt_bw(p["bw"])] for p in per_turn],
    )
    bl.console.print(
        f"  last turn again: connector {bl.fmt_bw(last.median)} vs fio --rw=read --direct=1 "
        f"--bs={block // bl.MiB}M --iodepth={window} on the same file "
        f"{bl.fmt_bw(fio.median)}: {bl.fmt_ratio(ratio)} (median of {reps} alternating); "
        f"SSD bytes read per byte loaded {min(cold):.2f} .. {max(cold):.2f} (cold)"
    )
    return {
        "per_turn": per_turn,
        "load": last.to_dict(),
        "fio": fio.to_dict(),
        "ratio": ratio,
        "window": window,
        "ssd_bytes_per_loaded_byte": cold,
    }


# ---------------------------------------------------------------- (5)


def part_crash(directory: Path, rounds: int, seed: int) -> dict[str, Any]:
    res = run_rounds(directory / "crash", rounds, seed=seed, backend="uring")
    bl.console.print()
    bl.table(
        f"(5) crash recovery: {rounds} writer processes killed with SIGKILL (seed {seed})",
        ["acknowledged", "recovered", "lost", "wrong", "unacked found", "kills mid-write"],
        [[res.acknowledged, res.recovered, res.lost, res.wrong, res.unacknowledged_found,
          res.kills_while_writing]],
    )  # fmt: skip
    return res.to_dict()


# ---------------------------------------------------------------- main


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="A smoke run: small sizes, numbers indicative.")
@click.option("--parts", default="1,3,4,5", show_default=True, help="Parts (1 includes 2).")
@click.option("--block-size", default=None, help="Object size for (3)/(4) [16M; quick 4M].")
@click.option("--reps", default=None, type=int, help="Alternating repetitions [5; quick 3].")
@click.option("--crash-rounds", default=None, type=int, help="(5) rounds [10; quick 3].")
@click.option("--seed", default=None, type=int, help="(5) kill-time seed [random].")
@click.option("--dir", "directory", default=DEFAULT_DIR, show_default=True, help="Scratch dir.")
@click.option("--json", "json_path", default=None, help="Write the results as JSON here.")
def main(
    quick: bool,
    parts: str,
    block_size: str | None,
    reps: int | None,
    crash_rounds: int | None,
    seed: int | None,
    directory: str,
    json_path: str | None,
) -> None:
    """The KV layer: index size and lookups, get bandwidth, cold reload vs fio, crashes."""
    todo = {p.strip() for p in parts.split(",") if p.strip()}
    block = chm.parse_size(block_size or ("4M" if quick else "16M"))
    n_reps = reps if reps is not None else (3 if quick else 5)
    rounds = crash_rounds if crash_rounds is not None else (3 if quick else 10)
    kill_seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    Path(directory).mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="run-", dir=directory))
    results: dict[str, Any] = {"benchmark": "kv_bench", "env": bl.environment()}
    verdicts = bl.Verdicts("kv_bench", quick=quick)

    def count(x: float) -> str:
        return f"{x:,.0f}"

    def rate(x: float) -> str:
        return f"{x:,.0f} keys/s"

    try:
        if "1" in todo or "2" in todo:
            r = part_index(n_reps, 0.3 if quick else 1.0)
            results["index"] = r
            verdicts.check(
                f"index bytes per entry at 10 TiB of 16 MiB blocks "
                f"({r['index_bytes'] / 1e6:.1f} MB in all)",
                r["bytes_per_entry"],
                TARGET_BYTES_PER_ENTRY,
                higher=False,
                fmt=lambda x: f"{x:.1f} B",
            )
            for name, s in r["lookups"].items():
                verdicts.check(
                    f"Index.find of 32-key batches, {name}", s["median"], TARGET_LOOKUPS,
                    fmt=rate, speed=True,
                )  # fmt: skip
            small: dict[str, Any] = {"dram": "24M", "slot_size": "1M"}
            with Store.open(
                base / "prefix", capacity="256M", backend="pread", **small,
                device_options={"wbuf": "4M"},
            ) as st:  # fmt: skip
                pr = store_prefix_rate(st, 0.3 if quick else 1.0)
            results["store_prefix_keys_per_s"] = pr
            bl.console.print(
                f"  Store.prefix_len of 32 engine hashes (namespace digest per key included): "
                f"{bl.fmt_rate(pr)} keys (no target)"
            )
        if "3" in todo:
            r = part_get(base, block, 12 if quick else 24, n_reps)
            results["get"] = r
            verdicts.check(
                "Store.get into numpy buffers / raw prefetch-wait-copy", r["ratio"],
                TARGET_GET_RATIO, speed=True,
            )  # fmt: skip
        if "4" in todo:
            if shutil.which("fio") is None:
                bl.console.print("(4) skipped: fio is not installed (apt-get install fio)")
                if not quick:  # a full run needs the comparison; a smoke run goes on without
                    verdicts.check("cold multi-turn reload / fio (fio missing)", float("nan"),
                                   TARGET_RELOAD_RATIO)  # fmt: skip
            else:
                r = part_reload(
                    base,
                    block,
                    users=2 if quick else 4,
                    turns=3 if quick else 4,
                    prefix=8 if quick else 12,
                    growth=4,
                    reps=n_reps,
                )
                results["reload"] = r
                verdicts.check(
                    "cold multi-turn reload through the connector / fio sequential read",
                    r["ratio"], TARGET_RELOAD_RATIO, speed=True,
                )  # fmt: skip
        if "5" in todo:
            r = part_crash(base, rounds, kill_seed)
            results["crash"] = r
            verdicts.check(
                f"crash recovery: acknowledged blocks lost (of {r['acknowledged']}, "
                f"{r['recovered']} recovered)",
                r["lost"] if r["acknowledged"] else float("nan"), 0, higher=False, fmt=count,
            )  # fmt: skip
            verdicts.check("crash recovery: blocks with wrong bytes", r["wrong"], 0,
                           higher=False, fmt=count)  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
    results["verdicts"] = verdicts.to_dict()
    results["env"]["loadavg_at_end"] = bl.loadavg()
    bl.write_json(json_path, results)
    sys.exit(verdicts.finish())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
