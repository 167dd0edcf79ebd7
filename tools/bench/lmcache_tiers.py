#!/usr/bin/env python3
"""LMCache's disk tier vs chm, on one cold multi-turn workload, side by side.

Workload: users x turns; each turn adds ``--growth`` chunks of ``--chunk``
bytes (LMCache chunks of 256 tokens; the KV shape is scaled to the chunk
size) to the user's history. Every system first stores all turns through
LMCache's engine (``LMCacheEngine.store``), then, per round, reloads each
user's history as it was before each turn (``LMCacheEngine.retrieve``),
checking the KV byte for byte. Before every retrieve the page cache of the
tier's files is dropped (``posix_fadvise(DONTNEED)``), so every load is cold.
The rounds alternate the systems' order; figures are medians over rounds.

Systems, each given the same DRAM budget ``--budget``:

- LMCache ``local_disk``: LMCache's disk backend; its CPU pool (the budget)
  holds the chunks being retrieved;
- LMCache + chm (prefetch): the chm storage plugin; chm's device DRAM is the
  budget (staging window + write buffer) and LMCache's CPU pool the same
  budget, used only to hold the chunks being retrieved (``local_cpu: false``);
- LMCache + chm (lru): the same plugin on a device in lru mode (the
  transparent DRAM cache of a commercial CXL-HM, the paper's baseline): the
  budget is its cache, loads read through it and prefetch nothing. Only the
  host page cache is dropped before a retrieve, not the device's DRAM: the
  lru cache holds what earlier loads and stores left there, as a device's
  would, so its row depends on how much of a round's histories fit the budget;
- fio: one sequential O_DIRECT read of as many bytes as a round retrieves,
  at the chunk size, ``iodepth`` = the staging window's slots.

Printed: retrieve bandwidth per system, as bytes retrieved over the time
spent in the storage tier (LMCache's ``StorageManager.batched_get``: lookups,
buffer allocation and the backend's reads; the targets apply to it) and over
the whole ``LMCacheEngine.retrieve`` (which adds the copy out to the serving
engine's memory, a CPU memcpy here), per-turn p50 / p99 load latency of the
whole retrieve, the ratios, and then a history
larger than the budget: LMCache ``local_disk`` in a child process with a
deadline (LMCache's CPU allocator waits for space that only the retrieve
itself could free), chm (retrieves the prefix that fits, the rest is
recomputed). Targets: chm(prefetch) >= 1.5x local_disk and >= 0.8x fio;
the chm retrieve of the oversized history returns within the deadline.

    python tools/bench/lmcache_tiers.py --quick
    python tools/bench/lmcache_tiers.py --json results/lmcache_tiers.json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

if __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import _benchlib as bl

TARGET_VS_DISK = 1.5
TARGET_VS_FIO = 0.8
CHUNK_TOKENS = 256
DEFAULT_DIR = "/var/tmp/chm-bench-lmcache"
SYSTEMS = ("local_disk", "chm", "chm_lru")
LABEL = {"local_disk": "local_disk", "chm": "chm(prefetch)", "chm_lru": "chm(lru)"}


def parse_size(text: str) -> int:
    from chm.sizes import parse_size as parse

    return int(parse(text))


# ---------------------------------------------------------------- LMCache side


def lmcache_modules() -> Any:
    """LMCache's modules (ImportError with the install hint when missing)."""
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    try:
        import torch
        from lmcache.v1.cache_engine import LMCacheEngineBuilder
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.gpu_connector import GPUConnectorInterface
        from lmcache.v1.metadata import LMCacheMetadata
    except ImportError as exc:
        raise SystemExit(
            f"lmcache_tiers: LMCache is not installed ({exc}): make integrations"
        ) from None
    # one intra-op thread: on a small shared machine torch's thread pool turns an
    # 8 MiB copy from ~8 GiB/s into < 1 GiB/s, for every system alike
    torch.set_num_threads(1)
    return torch, LMCacheEngineBuilder, LMCacheEngineConfig, GPUConnectorInterface, LMCacheMetadata


class Workload:
    """Token ids and KV of every user's full history (deterministic)."""

    def __init__(self, users: int, turns: int, growth: int, chunk: int) -> None:
        torch = lmcache_modules()[0]
        self.users, self.turns, self.growth, self.chunk = users, turns, growth, chunk
        # KV shape (layers, 2, tokens, heads, head_dim) in bf16 with chunk bytes per 256 tokens
        per_token = chunk // CHUNK_TOKENS
        self.layers, self.heads = 8, 8
        self.head_dim = per_token // (2 * self.layers * self.heads * 2)
        if self.head_dim < 1 or 2 * self.layers * self.heads * self.head_dim * 2 != per_token:
            raise click.BadParameter(f"--chunk {chunk}: must be a multiple of 64 KiB")
        n = turns * growth * CHUNK_TOKENS
        self.tokens, self.kv = [], []
        for u in range(users):
            g = torch.Generator().manual_seed(7 + u)
            t = torch.randint(0, 32000, (n,), generator=g)
            t[0] = u
            self.tokens.append(t)
            self.kv.append(self.paged(turns * growth))
            self.kv[-1].view(torch.int16).random_(-32768, 32767, generator=g)

    def paged(self, chunks: int) -> Any:
        """KV memory paged by chunk: [chunk, 2, layers, tokens, hidden] (as engines page it)."""
        torch = lmcache_modules()[0]
        hidden = self.heads * self.head_dim
        return torch.empty(chunks, 2, self.layers, CHUNK_TOKENS, hidden, dtype=torch.bfloat16)

    def history(self, user: int, turns: int) -> int:
        return turns * self.growth * CHUNK_TOKENS


def make_connector(w: Workload) -> Any:
    torch, _, _, GPUConnectorInterface, _ = lmcache_modules()

    class CpuKV(GPUConnectorInterface):  # type: ignore[misc, valid-type]
        """The serving engine's KV memory (a CPU tensor passed as ``kv=``)."""

        def get_shape(self, num_tokens: int) -> Any:
            return torch.Size([2, w.layers, num_tokens, w.heads * w.head_dim])

        def from_gpu(self, o: Any, start: int, end: int, **kw: Any) -> None:
            o.tensor.copy_(kw["kv"][start // CHUNK_TOKENS])

        def to_gpu(self, o: Any, start: int, end: int, **kw: Any) -> None:
            kw["kv"][start // CHUNK_TOKENS].copy_(o.tensor)

        def batched_from_gpu(self, objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
            for o, s, e in zip(objs, starts, ends, strict=True):
                self.from_gpu(o, s, e, **kw)

        def batched_to_gpu(
            self, objs: Any = None, starts: Any = None, ends: Any = None, **kw: Any
        ) -> None:
            for o, s, e in zip(objs, starts, ends, strict=True):
                self.to_gpu(o, s, e, **kw)

    return CpuKV()


def engine_config(system: str, w: Workload, d: Path, budget: int, slots: int) -> Any:
    _, _, LMCacheEngineConfig, _, _ = lmcache_modules()
    common: dict[str, Any] = {
        "chunk_size": CHUNK_TOKENS,
        "local_cpu": False,
        "max_local_cpu_size": budget / bl.GiB,
    }
    if system == "local_disk":
        return LMCacheEngineConfig.from_defaults(
            **common,
            local_disk=str(d / "local_disk") + "/",
            max_local_disk_size=4 * w.users * w.turns * w.growth * w.chunk / bl.GiB + 1,
        )
    wbuf = budget - slots * w.chunk
    return LMCacheEngineConfig.from_defaults(
        **common,
        storage_plugins=["chm"],
        extra_config={
            "storage_plugin.chm.module_path": "chm.integrations.lmcache",
            "storage_plugin.chm.class_name": "ChmStorageBackend",
            "chm.path": str(d / "chm"),
            "chm.capacity": f"{max(1, 4 * w.users * w.turns * w.growth * w.chunk // bl.GiB + 1)}G",
            "chm.dram": str(budget),
            "chm.wbuf": str(wbuf),
            "chm.slot_size": str(w.chunk),
            "chm.flush_interval_s": 3600.0,
            "chm.mode": "lru" if system == "chm_lru" else "prefetch",
        },
    )


_names = iter(range(1 << 30))


class Engine:
    """One LMCache engine over one tier."""

    def __init__(self, system: str, w: Workload, d: Path, budget: int, slots: int) -> None:
        torch, Builder, _, _, LMCacheMetadata = lmcache_modules()
        self.system, self.w, self.dir = system, w, d
        self.name = f"bench-{system}-{os.getpid()}-{next(_names)}"
        meta = LMCacheMetadata(
            model_name="bench/model", world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=torch.bfloat16,
            kv_shape=(w.layers, 2, CHUNK_TOKENS, w.heads, w.head_dim),
        )  # fmt: skip
        self.engine = Builder.get_or_create(
            self.name, engine_config(system, w, d, budget, slots), meta, make_connector(w),
            lambda *a: None, lambda *a: None,
        )  # fmt: skip
        self.engine.post_init()
        sm = self.engine.storage_manager
        self.backend = sm.storage_backends["LocalDiskBackend" if system == "local_disk" else "chm"]
        # time spent in the storage tier: LMCache's StorageManager.batched_get (lookups,
        # buffer allocation, the backend's reads), without the copy out to "GPU" memory
        self.tier_s = 0.0
        batched_get = sm.batched_get

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return batched_get(*args, **kwargs)
            finally:
                self.tier_s += time.perf_counter() - t0

        sm.batched_get = timed

    def settle(self) -> None:
        """Waits until the stores in flight are on the tier (and, for chm, flushed)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.system == "local_disk":
                busy = bool(self.backend.disk_worker.put_tasks)
            else:
                busy = bool(self.backend._inflight)
            if not busy:
                break
            time.sleep(0.002)
        if self.system != "local_disk":
            self.backend.flush()
        else:
            os.sync()

    def store_all(self) -> None:
        torch = lmcache_modules()[0]
        w = self.w
        for turn in range(1, w.turns + 1):
            for u in range(w.users):
                n = w.history(u, turn)
                mask = torch.zeros(n, dtype=torch.bool)
                mask[w.history(u, turn - 1) :] = True
                self.engine.store(w.tokens[u][:n], mask=mask, kv=w.kv[u])
                self.settle()

    def files(self) -> Iterator[Path]:
        root = self.dir / ("local_disk" if self.system == "local_disk" else "chm")
        yield from (p for p in root.rglob("*") if p.is_file())

    def drop_cache(self) -> None:
        for p in self.files():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def retrieve(self, user: int, turns: int, out: Any) -> tuple[float, float, int, bool]:
        """One cold retrieve: seconds in the engine, seconds in the tier, tokens hit, exact."""
        torch = lmcache_modules()[0]
        w = self.w
        n = w.history(user, turns)
        self.drop_cache()
        self.tier_s = 0.0
        t0 = time.perf_counter()
        hit = int(self.engine.retrieve(w.tokens[user][:n], kv=out).sum())
        dt = time.perf_counter() - t0
        c = hit // CHUNK_TOKENS
        exact = torch.equal(out[:c].view(torch.int16), w.kv[user][:c].view(torch.int16))
        return dt, self.tier_s, hit, exact

    def close(self) -> None:
        Builder = lmcache_modules()[1]
        Builder.destroy(self.name)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else float("nan")


# ---------------------------------------------------------------- oversized history


def oversized(
    system: str, d: str, budget: int, chunk: int, chunks: int, deadline: float
) -> dict[str, Any]:
    """A child process stores one history of ``chunks`` chunks, then retrieves
    it; the deadline runs from the retrieve's start (the child's imports and
    stores on a busy machine take what they take, up to 10 minutes)."""
    cmd = [sys.executable, __file__, "--child", system, "--dir", d, "--budget", str(budget),
           "--chunk", str(chunk), "--child-chunks", str(chunks)]  # fmt: skip
    env = dict(os.environ, PYTHONHASHSEED="0", LMCACHE_TRACK_USAGE="false")
    errf = tempfile.TemporaryFile("w+")  # noqa: SIM115 - LMCache logs a lot: a pipe would fill
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True, env=env)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert p.stdout is not None
        for ln in p.stdout:
            lines.append(ln)
            if ln.startswith("stored"):
                ready.set()
        ready.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        ready.wait(600)
        t.join(deadline)
        if t.is_alive():
            return {"system": system, "returned": False, "deadline_s": deadline}
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        errf.seek(0)
        err = errf.read()
        errf.close()
    last = [ln for ln in lines if ln.startswith("{")]
    if p.returncode != 0 or not last:
        raise RuntimeError(f"{system} child failed ({p.returncode}): {err[-2000:]}")
    r: dict[str, Any] = json.loads(last[-1])
    return r


def child(system: str, d: Path, budget: int, chunk: int, chunks: int) -> None:
    """One user's turns of 2 chunks each until the history is ``chunks`` long, then a reload."""
    torch = lmcache_modules()[0]
    w = Workload(1, chunks // 2, 2, chunk)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    e = Engine(system, w, d, budget, max(2, (budget - 3 * chunk) // chunk))
    e.store_all()
    print(f"stored {w.history(0, w.turns)} tokens", flush=True)
    out = torch.zeros_like(w.kv[0])
    dt, _, hit, exact = e.retrieve(0, w.turns, out)
    print(json.dumps({"system": system, "returned": True, "seconds": dt, "hit_tokens": hit,
                      "tokens": w.history(0, w.turns), "exact": exact}), flush=True)  # fmt: skip
    os._exit(0)


# ---------------------------------------------------------------- main


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--quick", is_flag=True, help="A smoke run: small sizes, numbers indicative.")
@click.option("--users", default=None, type=int, help="Users [4; quick 2].")
@click.option("--turns", default=None, type=int, help="Turns per user [4; quick 3].")
@click.option("--growth", default=2, show_default=True, help="Chunks added per turn.")
@click.option("--chunk", "chunk_text", default=None, help="Chunk bytes, 4M..16M [8M; quick 4M].")
@click.option("--budget", "budget_text", default=None, help="DRAM per tier [64M; quick 32M].")
@click.option("--rounds", default=None, type=int, help="Alternating rounds [3; quick 2].")
@click.option("--deadline", default=30.0, show_default=True, help="Oversized-history deadline, s.")
@click.option("--dir", "directory", default=DEFAULT_DIR, show_default=True, help="Scratch dir.")
@click.option("--json", "json_path", default=None, help="Write the results as JSON here.")
@click.option("--child", default=None, hidden=True)
@click.option("--child-chunks", default=0, type=int, hidden=True)
def main(
    quick: bool, users: int | None, turns: int | None, growth: int, chunk_text: str | None,
    budget_text: str | None, rounds: int | None, deadline: float, directory: str,
    json_path: str | None, child: str | None, child_chunks: int,
) -> None:  # fmt: skip
    """Retrieve bandwidth and per-turn latency: LMCache local_disk vs LMCache + chm vs fio."""
    chunk = parse_size(chunk_text or ("4M" if quick else "8M"))
    budget = parse_size(budget_text or ("32M" if quick else "64M"))
    if child is not None:
        globals()["child"](child, Path(directory), budget, chunk, child_chunks)
        return
    users = users or (2 if quick else 4)
    turns = turns or (3 if quick else 4)
    rounds = rounds or (2 if quick else 3)
    if not 4 * bl.MiB <= chunk <= 16 * bl.MiB:
        raise click.BadParameter(f"--chunk {chunk}: 4..16 MiB")
    largest = (turns - 1) * growth * chunk
    if largest + 2 * chunk > budget:
        raise click.BadParameter(
            f"a reloaded history ({largest >> 20} MiB) must fit the budget with two chunks "
            f"to spare ({budget >> 20} MiB): raise --budget or lower --turns/--growth"
        )
    # chm: a write buffer for one turn's chunks (and their metadata), the rest stages reads
    slots = (budget - (growth + 1) * chunk) // chunk
    if slots < 2:
        raise click.BadParameter(f"--budget {budget >> 20} MiB: too small for chm's window")
    root = Path(directory)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    w = Workload(users, turns, growth, chunk)
    verdicts = bl.Verdicts("lmcache_tiers")
    bl.console.print(
        f"workload: {users} users x {turns} turns, +{growth} chunks of {chunk >> 20} MiB a turn; "
        f"DRAM budget {budget >> 20} MiB per tier (chm: {slots} staging slots + "
        f"{(budget - slots * chunk) >> 20} MiB write buffer); {rounds} rounds"
    )
    engines = {}
    for s in SYSTEMS:
        t0 = time.perf_counter()
        engines[s] = Engine(s, w, root / s, budget, slots)
        engines[s].store_all()
        bl.console.print(f"stored through {s} in {time.perf_counter() - t0:.1f} s")
    per_round = sum(w.history(u, t) for u in range(users) for t in range(1, turns)) * (
        chunk // CHUNK_TOKENS
    )
    fio_file = root / "fio.img"
    bl.ensure_filled_file(fio_file, per_round, quiet=True)

    bw = {s: bl.Series(s, "B/s") for s in [*SYSTEMS, "fio"]}
    tier_bw = {s: bl.Series(s, "B/s") for s in SYSTEMS}
    lat: dict[str, dict[int, list[float]]] = {s: {} for s in SYSTEMS}
    wrong = {s: 0 for s in SYSTEMS}
    torch = lmcache_modules()[0]
    out = torch.zeros_like(w.kv[0])
    for r in range(rounds):
        for s in bl.rotate([*SYSTEMS, "fio"], r):
            if s == "fio":
                f = bl.fio_read(fio_file, per_round, bs=chunk, iodepth=slots)
                bw["fio"].add(f["bw_bps"])
                continue
            busy, in_tier, nbytes = 0.0, 0.0, 0
            for t in range(1, turns):
                for u in range(users):
                    dt, dt_tier, hit, exact = engines[s].retrieve(u, t, out)
                    want = w.history(u, t)
                    wrong[s] += int(hit != want or not exact)
                    busy += dt
                    in_tier += dt_tier
                    nbytes += hit * (chunk // CHUNK_TOKENS)
                    lat[s].setdefault(t, []).append(dt)
            bw[s].add(nbytes / busy)
            tier_bw[s].add(nbytes / in_tier)
    for e in engines.values():
        e.close()

    bl.console.print()

    def span(series: bl.Series) -> str:
        lo, hi = bl.spread(series.values)
        return f"{bl.fmt_bw(lo)} .. {bl.fmt_bw(hi)}"

    rows: list[list[Any]] = [
        ["LMCache local_disk", bl.fmt_bw(tier_bw["local_disk"].median),
         bl.fmt_bw(bw["local_disk"].median), span(tier_bw["local_disk"]), wrong["local_disk"]],
        ["LMCache + chm (prefetch)", bl.fmt_bw(tier_bw["chm"].median), bl.fmt_bw(bw["chm"].median),
         span(tier_bw["chm"]), wrong["chm"]],
        ["LMCache + chm (lru)", bl.fmt_bw(tier_bw["chm_lru"].median),
         bl.fmt_bw(bw["chm_lru"].median), span(tier_bw["chm_lru"]), wrong["chm_lru"]],
        ["fio sequential read", bl.fmt_bw(bw["fio"].median), "", span(bw["fio"]), ""],
    ]  # fmt: skip
    bl.table(
        f"cold retrieve bandwidth, median of {rounds} rounds ({per_round >> 20} MiB a round)",
        ["system", "tier", "engine retrieve", "tier min .. max", "wrong or partial loads"],
        rows,
    )
    bl.console.print(
        "tier: bytes / time in LMCache's StorageManager.batched_get (lookups, buffers, reads); "
        "engine retrieve: bytes / time in LMCacheEngine.retrieve (adds the copy out to the "
        "serving engine's memory, a CPU memcpy here)"
    )
    trows = []
    for t in range(1, turns):
        row = [f"history of {t * growth} chunks ({t * growth * chunk >> 20} MiB)"]
        for s in SYSTEMS:
            xs = lat[s][t]
            row += [f"{pct(xs, 0.5) * 1e3:.1f}", f"{pct(xs, 0.99) * 1e3:.1f}"]
        trows.append(row)
    bl.table(
        "per-turn load latency, ms (all users and rounds)",
        ["reload before turn"] + [h for s in SYSTEMS for h in (f"{LABEL[s]} p50", "p99")],
        trows,
    )
    vs_disk = bl.ratio(tier_bw["chm"].median, tier_bw["local_disk"].median)
    vs_fio = bl.ratio(tier_bw["chm"].median, bw["fio"].median)
    bl.console.print(
        f"tier: chm(prefetch) / local_disk = {bl.fmt_ratio(vs_disk)}; chm(prefetch) / fio = "
        f"{bl.fmt_ratio(vs_fio)}; local_disk / fio = "
        f"{bl.fmt_ratio(bl.ratio(tier_bw['local_disk'].median, bw['fio'].median))}; "
        f"chm(lru) / local_disk = "
        f"{bl.fmt_ratio(bl.ratio(tier_bw['chm_lru'].median, tier_bw['local_disk'].median))}; "
        f"chm(prefetch) / chm(lru) = "
        f"{bl.fmt_ratio(bl.ratio(tier_bw['chm'].median, tier_bw['chm_lru'].median))}"
    )
    e_disk = bl.ratio(bw["chm"].median, bw["local_disk"].median)
    e_fio = bl.ratio(bw["chm"].median, bw["fio"].median)
    bl.console.print(
        f"engine retrieve: chm(prefetch) / local_disk = {bl.fmt_ratio(e_disk)}; "
        f"chm(prefetch) / fio = {bl.fmt_ratio(e_fio)}"
    )

    # a history larger than the budget
    big = 2 * (budget // chunk // 2 + 1)
    bl.console.print()
    bl.console.print(
        f"a history of {big} chunks ({big * chunk >> 20} MiB) > the {budget >> 20} MiB budget "
        f"(deadline {deadline:.0f} s each):"
    )
    over: dict[str, dict[str, Any]] = {}
    for s in SYSTEMS:
        res = oversized(s, str(root / f"big-{s}"), budget, chunk, big, deadline)
        over[s] = res
        if res["returned"]:
            how = "byte-exact" if res["exact"] else "WRONG BYTES"
            bl.console.print(
                f"  {s}: returned in {res['seconds']:.2f} s with {res['hit_tokens']} of "
                f"{res['tokens']} tokens ({how}); the rest is recomputed"
            )
        else:
            bl.console.print(f"  {s}: no answer after {deadline:.0f} s (stalled; killed)")
    chm_ok = over["chm"]["returned"] and over["chm"]["exact"] and over["chm"]["hit_tokens"] > 0
    shutil.rmtree(root, ignore_errors=True)

    verdicts.check(
        "tier: chm(prefetch) / local_disk cold retrieve bandwidth", vs_disk, TARGET_VS_DISK
    )
    verdicts.check("tier: chm(prefetch) / fio sequential read", vs_fio, TARGET_VS_FIO)
    verdicts.check(
        "wrong or partial chm loads (both modes)",
        wrong["chm"] + wrong["chm_lru"],
        0,
        higher=False,
        fmt=str,
    )
    verdicts.check("chm returns an oversized history in time", float(chm_ok), 1.0, fmt=str)
    bl.write_json(json_path, {
        "environment": bl.environment(),
        "engine_bandwidth": {k: v.to_dict() for k, v in bw.items()},
        "tier_bandwidth": {k: v.to_dict() for k, v in tier_bw.items()},
        "latency_s": {s: {str(t): xs for t, xs in d.items()} for s, d in lat.items()},
        "wrong": wrong, "oversized": over, "verdicts": verdicts.to_dict(),
    })  # fmt: skip
    raise SystemExit(verdicts.finish())


if __name__ == "__main__":
    main()
