"""Storage-node processes for tests and benchmarks: ``chm-emu serve`` daemons
with ``--listen`` and ``--master`` (:mod:`chm.daemon.node`), their store in a
directory.

    with NodeProcess(redis_url, "n1", tmp / "n1", secret_file) as node:
        node.info["control"], node.info["data"]   # from its start log line
        node.info["socket"]                       # its Unix socket (chm.connect, stats)
        node.kill()                               # SIGKILL
        node.start()                              # a restart: same store, a new epoch

``options`` are node settings as flags (``--capacity``, ``--dram``,
``--slot-size``, ``--wbuf``, ``--resident``, ``--backend``, ``--ssd-write-bw``,
``--write-area``, ``--lease``, ``--flush-interval``), written with the rest
into the daemon's TOML settings (``node.toml`` in the directory).
``prefix`` runs the node inside a network namespace (``["ip", "netns",
"exec", NAME]``); ``host`` is the address it listens on there.

:func:`measure` is the worker's side of ``tools/bench/remote_bench.py``
(``python -m chm.testing.remote measure URL HOST SECRET_FILE BLOCKS
BLOCK_BYTES REPS SECONDS [NODE_SOCKET]`` prints its JSON).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chm.errors import ChmError, InvalidArgument

__all__ = ["NodeProcess", "block", "worker", "write_secret"]

# node flag -> (table, setting) of chm-emu serve's TOML file
_SETTINGS = {
    "--capacity": ("device", "capacity"),
    "--dram": ("device", "dram"),
    "--slot-size": ("device", "slot_size"),
    "--wbuf": ("device", "wbuf"),
    "--resident": ("device", "resident"),
    "--backend": ("device", "backend"),
    "--ssd-write-bw": ("device", "ssd_write_bw_bps"),  # bytes/s the modeled SSD writes
    "--write-area": ("", "area_bytes"),
    "--lease": ("", "lease"),
    "--flush-interval": ("", "flush_interval"),
}


def write_secret(path: str | os.PathLike[str]) -> bytes:
    """Writes a fresh random secret (mode 0600) and returns it."""
    secret = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    return secret


def _toml(v: Any) -> str:
    return json.dumps(v)  # strings, numbers and lists of strings are TOML as JSON writes them


class NodeProcess:
    """One node daemon process (see the module docstring)."""

    def __init__(
        self,
        master_url: str,
        name: str,
        directory: str | os.PathLike[str],
        secret_file: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
        options: Sequence[str] = (),
        timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        top: dict[str, Any] = {
            "socket": str(self.dir / "chm.sock"),
            "journal": str(self.dir / "kv.img.kvjournal"),
            "force": ["filesystem"],  # the test's own directory, whatever it is on
            "listen": f"{host}:0",
            "secret_file": os.fspath(secret_file),
            "master": master_url,
            "node_name": name,
            "flush_interval": 0.2,
            "log_level": "info",
        }
        dev: dict[str, Any] = {
            "targets": [str(self.dir / "kv.img")],
            "create": True,
            "capacity": "256M",
            "dram": "64M",
            "slot_size": "1M",
            "wbuf": "4M",
            "backend": "pread",
            "mode": "prefetch",
            "pool": "memfd",
        }
        opts = list(options)
        if len(opts) % 2:
            raise InvalidArgument(None, f"NodeProcess options: flag value pairs, not {opts}")
        for flag, value in zip(opts[::2], opts[1::2], strict=True):
            if flag not in _SETTINGS:
                raise InvalidArgument(
                    None, f"NodeProcess: unknown option {flag}; known: {', '.join(_SETTINGS)}"
                )
            table, key = _SETTINGS[flag]
            if key == "resident" and value in ("0", ""):
                continue
            num = key in ("lease", "flush_interval", "area_bytes", "ssd_write_bw_bps")
            v: Any = float(value) if num else value
            if key in ("area_bytes", "ssd_write_bw_bps"):
                v = int(v)
            (dev if table else top)[key] = v
        dev["object_size"] = dev["slot_size"]  # the block size: whole blocks in the write buffer
        lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
        lines += ["", "[device]"] + [f"{k} = {_toml(v)}" for k, v in dev.items()]
        self.config = self.dir / "node.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.argv = [
            *prefix,
            sys.executable,
            "-m",
            "chm_emu.cli",
            "serve",
            "--config",
            str(self.config),
        ]
        self.log_path = self.dir / "node.log"
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    def start(self) -> NodeProcess:
        """Starts the node and waits for its start log line (it serves then)."""
        try:
            offset = self.log_path.stat().st_size  # this run's lines start here
        except OSError:
            offset = 0
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf
            )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for line in self.log()[offset:].splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("event") == "start" and ev.get("node"):
                    n = ev["node"]
                    self.info = {
                        "node": n["id"],
                        "epoch": n["epoch"],
                        "control": n["control"],
                        "data": n["data"],
                        "pid": ev["pid"],
                        "socket": ev["socket"],
                    }
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        tail = self.log()[offset:][-3000:]
        raise ChmError(None, f"node {self.name} not ready: {tail}")

    @property
    def control(self) -> tuple[str, int]:
        host, _, port = str(self.info["control"]).rpartition(":")
        return host.strip("[]"), int(port)

    def kill(self) -> None:
        """SIGKILL, then reaps it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        """SIGTERM (a clean stop: the lease ends), SIGKILL after 10 s."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> NodeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def measure(
    url: str,
    host: str,
    secret: bytes,
    *,
    blocks: int,
    block_bytes: int,
    reps: int,
    lookup_seconds: float,
    timeout: float = 30.0,
    local_socket: str | None = None,
) -> dict[str, Any]:
    """A worker's side of ``tools/bench/remote_bench.py`` (run on the worker host).

    Saves ``blocks`` blocks of ``block_bytes`` through the node (skipped
    ones again until stored), then, after one untimed warm-up round,
    runs ``reps`` rounds (the order rotating round by round) of: a prefix load
    of all of them through :meth:`RemoteTier.load` (Master lookup, stage,
    batched engine reads, release, checksum, copy out); the Transfer
    Engine's own batched read of the same staged bytes from the same node
    into the same buffer (no lookup, no checksum, no copy); and, with
    ``local_socket`` (the node daemon's Unix socket), the same prefix load
    through the daemon as a client on the node's own host would make it
    (``RemoteStore.load_prefix``: zero-copy pool, checksum, copy). Then counts
    32-key Master lookups for ``lookup_seconds``. Returns seconds per run
    of each, the hits of every load, and the lookup rate.
    """
    import time

    import numpy as np

    from chm.kv.keys import Namespace
    from chm.kv.store import PutStatus
    from chm.remote.master import RedisMaster
    from chm.remote.node import RemoteTier, _pairs
    from chm.remote.protocol import Op
    from chm.remote.transfer import OK, Engine

    engine = Engine.get(host)
    master = RedisMaster(url, lease=3.0, timeout=2.0)
    tier = RemoteTier(
        master, engine, secret, buffer=2 * blocks * block_bytes + (1 << 20), timeout=timeout
    )
    rng = np.random.default_rng(11)
    keys = Namespace(model="remote-bench").keys(range(blocks))
    data = [rng.integers(0, 256, block_bytes, dtype=np.uint8) for _ in range(blocks)]
    todo = list(range(blocks))
    deadline = time.monotonic() + timeout
    while todo and time.monotonic() < deadline:
        st = tier.save("bench", keys[todo], [data[j] for j in todo])
        if PutStatus.ERROR in st:
            raise ChmError(None, f"remote_bench: the node failed a save: {st}")
        todo = [j for j, s in zip(todo, st, strict=True) if s == PutStatus.SKIPPED]
        if todo:
            time.sleep(0.05)  # the node's write buffer drains to its device
    if todo:
        raise ChmError(None, f"remote_bench: {len(todo)} blocks still skipped after {timeout} s")
    dsts = [np.zeros(block_bytes, np.uint8) for _ in range(blocks)]
    ents = master.lookup(keys)
    link = tier._link(ents[0].node, ents[0].epoch)
    chm_s: list[float] = []
    raw_s: list[float] = []
    hits: list[int] = []
    exact = True

    def chm_load() -> float:
        nonlocal exact
        t0 = time.perf_counter()
        n = tier.load(keys, dsts)
        took = time.perf_counter() - t0
        hits.append(n)
        exact &= all(np.array_equal(dsts[j], data[j]) for j in range(n))
        for d in dsts:
            d[:1] = 0  # the next load must write them again
        return took

    def raw_read() -> float:
        # staged through the node's daemon protocol, then only the engine's read is timed
        end = time.monotonic() + timeout
        pairs = _pairs([e.key for e in ents])
        ans = link.call(Op.KV_LOOKUP, [pairs, False], end)
        toks = [int(a[1]) for a in ans if a[0] == 0]
        try:
            res = link.call(Op.WAIT, [int(timeout * 1e9), toks], end + timeout, wait=timeout)
            if len(toks) != blocks or any(r[0] != 0 for r in res):
                raise ChmError(
                    None, f"remote_bench: staged {len(toks)} of {blocks} for the raw read"
                )
            t0 = time.perf_counter()
            status = engine.read(
                link.data,
                [tier.buf.addr + j * block_bytes for j in range(blocks)],
                [link.pool_addr + int(r[1]) for r in res],
                [int(r[2]) for r in res],
                timeout=timeout,
            )
            took = time.perf_counter() - t0
            if status != OK:
                raise ChmError(None, f"remote_bench: the raw read ended {status}")
            return took
        finally:
            done = [[*p, t, 0] for p, t in zip(pairs, toks, strict=False)]
            link.call(Op.KV_DONE, done, time.monotonic() + timeout)

    local_s: list[float] = []
    local = None
    if local_socket is not None:
        import chm

        local = chm.connect(local_socket)
    local_dsts = [np.zeros(block_bytes, np.uint8) for _ in range(blocks)]

    def local_load() -> float:
        # the same prefix load through the node's daemon over its Unix socket:
        # what a worker on the node's own host gets (zero-copy pool, verify, copy)
        nonlocal exact
        assert local is not None
        kv = local.kv(Namespace(model="remote-bench"))
        t0 = time.perf_counter()
        n = kv.load_prefix(range(blocks), local_dsts)
        took = time.perf_counter() - t0
        hits.append(n)
        exact &= all(np.array_equal(local_dsts[j], data[j]) for j in range(n))
        for d in local_dsts:
            d[:1] = 0
        return took

    # round 0 warms up (first reads: the node's admission retains blocks read
    # again) and is not timed; then the order rotates round by round
    runs = [("chm", chm_load), ("raw", raw_read)] + ([("local", local_load)] if local else [])
    for r in range(reps + 1):
        took: dict[str, float] = {}
        for name, fn in runs[r % len(runs) :] + runs[: r % len(runs)]:
            took[name] = fn()
        if r:
            chm_s.append(took["chm"])
            raw_s.append(took["raw"])
            if local is not None:
                local_s.append(took["local"])
    if local is not None:
        local.close()
    n_lookups = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < lookup_seconds:
        if len(master.lookup(keys[:32])) != min(32, blocks):
            hits.append(-1)
        n_lookups += 1
    lookups_s = n_lookups / (time.perf_counter() - t0)
    tier.close()
    master.close()
    return {
        "blocks": blocks,
        "block_bytes": block_bytes,
        "chm_s": chm_s,
        "raw_s": raw_s,
        "local_s": local_s,
        "hits": hits,
        "exact": exact,
        "lookups_per_s": lookups_s,
        "lookup_batch": min(32, blocks),
    }


def block(model: str, j: int, nbytes: int) -> Any:
    """Block ``j`` of ``model``: ``nbytes`` pseudo-random bytes, the same in every process."""
    import zlib

    import numpy as np

    rng = np.random.default_rng([zlib.crc32(model.encode()), j])
    return rng.integers(0, 256, nbytes, dtype=np.uint8)


def worker(url: str, host: str, secret: bytes, *, timeout: float = 3.0) -> None:
    """A worker process for tests (``python -m chm.testing.remote worker URL
    HOST SECRET_FILE [TIMEOUT]``): a :class:`RemoteTier` driven by JSON lines
    on stdin, one JSON answer per line on stdout. Blocks are :func:`block`
    of the request's model, keys ``Namespace(model=...)`` of their indices:

    - ``{"op": "save", "model", "blocks": [a, b], "bytes", "node"?}`` ->
      ``{"status": [PutStatus, ...]}``
    - ``{"op": "load", "model", "blocks": [a, b], "bytes", "timeout"?}`` ->
      ``{"loaded", "exact", "untouched", "seconds"}`` (``exact``: every loaded
      block byte-exact; ``untouched``: the rest left zero)
    - ``{"op": "hold", "model", "blocks": [a, b], "node"}`` -> ``{"held"}``:
      stages them on the node and keeps them (until the process ends)
    - ``{"op": "stats"}`` -> the tier's counters
    """
    import time

    import numpy as np

    from chm.kv.keys import Namespace
    from chm.remote.master import RedisMaster, key_bytes
    from chm.remote.node import RemoteTier, _pairs
    from chm.remote.protocol import Op
    from chm.remote.transfer import Engine

    tier = RemoteTier(
        RedisMaster(url, lease=1.0), Engine.get(host), secret, buffer=16 << 20, timeout=timeout
    )
    held: list[Any] = []
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        out: dict[str, Any]
        if op == "stats":
            out = dict(tier.stats)
        else:
            a, b = req["blocks"]
            keys = Namespace(model=req["model"]).keys(range(a, b))
            n = int(req.get("bytes", 0))
            if op == "save":
                st = tier.save(req["model"], keys, [block(req["model"], j, n) for j in range(a, b)],
                               node=req.get("node"))  # fmt: skip
                out = {"status": [int(x) for x in st]}
            elif op == "load":
                outs = [np.zeros(n, np.uint8) for _ in range(a, b)]
                t0 = time.monotonic()
                got = tier.load(keys, outs, timeout=req.get("timeout"))
                secs = time.monotonic() - t0
                exact = all(
                    np.array_equal(outs[i], block(req["model"], a + i, n)) for i in range(got)
                )
                out = {
                    "loaded": got,
                    "exact": exact,
                    "untouched": not any(o.any() for o in outs[got:]),
                    "seconds": secs,
                }
            elif op == "hold":
                link = tier._link(int(req["node"]))
                end = time.monotonic() + timeout
                ans = link.call(Op.KV_LOOKUP, [_pairs(key_bytes(keys)), False], end)
                toks = [x[1] for x in ans if x[0] == 0]
                res = link.call(Op.WAIT, [int(0.5e9), toks], end + 1, wait=0.5)
                held.append(link)
                out = {"held": sum(1 for r in res if r[0] == 0)}
            else:
                out = {"error": f"unknown op {op!r}"}
        print(json.dumps(out), flush=True)
    tier.close()


if __name__ == "__main__":
    # python -m chm.testing.remote measure URL HOST SECRET_FILE BLOCKS BLOCK_BYTES REPS SECONDS
    #     [NODE_SOCKET]
    # python -m chm.testing.remote worker URL HOST SECRET_FILE [TIMEOUT]
    from chm.remote.protocol import read_secret

    if len(sys.argv) in (5, 6) and sys.argv[1] == "worker":
        t = float(sys.argv[5]) if len(sys.argv) == 6 else 3.0
        worker(sys.argv[2], sys.argv[3], read_secret(sys.argv[4]), timeout=t)
        raise SystemExit(0)
    if len(sys.argv) not in (9, 10) or sys.argv[1] != "measure":
        raise SystemExit(__doc__)
    url_, host_, sf, nb, bb, rp, ls = sys.argv[2:9]
    result = measure(
        url_,
        host_,
        read_secret(sf),
        blocks=int(nb),
        block_bytes=int(bb),
        reps=int(rp),
        lookup_seconds=float(ls),
        local_socket=sys.argv[9] if len(sys.argv) == 10 else None,
    )
    print(json.dumps(result), flush=True)
