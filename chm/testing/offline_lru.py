"""An offline LRU simulation of a trace, independent of any cache under test.

It uses LRU's stack property with a Fenwick tree over access times (Bennett
and Kruskal): a block is held at the start of a request iff it was accessed
before and the number of distinct blocks last accessed since then is below
the capacity in blocks. Every block of a request is one access, in key
order, whether it hit or not; a request's hits are its leading held blocks.
No eviction list, no cache: the answer comes from access times alone, so it
checks the caches of :mod:`chm.sim.replay` (the baselines' LRU tiers, the
CXL-HM tier on a :class:`chm.kv.Store`) without sharing their code.

    from chm.testing.offline_lru import offline_lru_hits
    hits = offline_lru_hits(requests, capacity_blocks)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from chm.sim.workloads import (
    ChatWorkload,
    read_mooncake,
    synthetic_trace,
    trace_requests,
    write_mooncake,
)
from chm.sim.workloads.records import Request

__all__ = ["Fenwick", "chat_trace", "offline_lru_hits", "unbounded_hit_rate"]


def chat_trace(directory: Path) -> list[Request]:
    """The trace both LRU checks replay: 24 users x 6 turns of chat with a
    2,048-token system prompt (seed 13), written in the Mooncake format to
    ``directory/chat.jsonl``, read back and re-blocked to 128 tokens."""
    wl = ChatWorkload(
        users=24,
        turns=6,
        system_prompt_tokens=2048,
        user_tokens=(4000, 8000),
        output_tokens=(200, 1000),
        seed=13,
    )
    path = Path(directory) / "chat.jsonl"
    write_mooncake(path, synthetic_trace(wl))
    return trace_requests(read_mooncake(path), block_tokens=128)


class Fenwick:
    """Prefix sums over ``n`` positions with point updates, O(log n) each."""

    def __init__(self, n: int) -> None:
        self.t = [0] * (n + 1)

    def add(self, i: int, v: int) -> None:
        i += 1
        while i < len(self.t):
            self.t[i] += v
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of positions [0, i)."""
        s = 0
        while i > 0:
            s += self.t[i]
            i -= i & -i
        return s


def offline_lru_hits(requests: Sequence[Request], capacity: int) -> list[int]:
    """Per request, its leading blocks an LRU of ``capacity`` blocks holds."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0 blocks, got {capacity}")
    total = sum(len(r.block_keys) for r in requests)
    tree = Fenwick(total)
    last: dict[bytes, int] = {}
    now = 0
    hits = []
    for r in requests:
        n = 0
        for k in r.block_keys:
            p = last.get(k)
            if p is None or tree.prefix(now) - tree.prefix(p + 1) >= capacity:
                break
            n += 1
        hits.append(n)
        for k in r.block_keys:
            p = last.get(k)
            if p is not None:
                tree.add(p, -1)
            tree.add(now, 1)
            last[k] = now
            now += 1
    return hits


def unbounded_hit_rate(requests: Sequence[Request]) -> float:
    """The block hit rate of a cache that never evicts (every reuse hits)."""
    seen: set[bytes] = set()
    hits = 0
    for r in requests:
        for k in r.block_keys:
            if k not in seen:
                break
            hits += 1
        seen.update(r.block_keys)
    return hits / sum(len(r.block_keys) for r in requests)
