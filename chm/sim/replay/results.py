"""Per-request replay results, their per-turn summary, and JSON/CSV output."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RequestResult", "TurnSummary", "per_turn", "write_csv", "write_json"]


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one request found, loaded and cost in one system.

    Hits are prefix hits in blocks: ``gpu_hit_blocks`` from HBM (G1), then
    ``tier_hit_blocks`` from the tier; ``*_bytes`` are the KV bytes of those
    blocks (G1's are reused in place, the tier's are loaded).
    """

    system: str
    index: int
    session: int | None
    turn: int | None
    worker: int
    arrival_s: float
    input_tokens: int
    blocks: int
    gpu_hit_blocks: int
    tier_hit_blocks: int
    block_tokens: int
    gpu_bytes: int
    tier_name: str
    tier_bytes: int
    compute_s: float
    load_s: float

    @property
    def cached_tokens(self) -> int:
        return (self.gpu_hit_blocks + self.tier_hit_blocks) * self.block_tokens

    @property
    def hit_rate(self) -> float:
        """Prefix hit rate: cached tokens / prompt tokens."""
        return self.cached_tokens / self.input_tokens

    @property
    def ttft_s(self) -> float:
        """Modeled time to first token: compute + load."""
        return self.compute_s + self.load_s

    def row(self) -> dict[str, Any]:
        """The fields and derived values as one flat record."""
        d = dataclasses.asdict(self)
        d.update(cached_tokens=self.cached_tokens, hit_rate=self.hit_rate, ttft_s=self.ttft_s)
        return d


@dataclass(frozen=True, slots=True)
class TurnSummary:
    """All requests of one turn (``turn`` None: requests without a turn)."""

    system: str
    turn: int | None
    requests: int
    input_tokens: int
    cached_tokens: int
    gpu_bytes: int
    tier_bytes: int
    mean_ttft_s: float

    @property
    def hit_rate(self) -> float:
        """Cached tokens / prompt tokens over the turn's requests."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    def row(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hit_rate"] = self.hit_rate
        return d


def per_turn(results: Iterable[RequestResult]) -> list[TurnSummary]:
    """One summary per (system, turn): systems in order of first appearance,
    turns in order, requests without a turn last."""
    groups: dict[str, dict[int | None, list[RequestResult]]] = {}
    for r in results:
        groups.setdefault(r.system, {}).setdefault(r.turn, []).append(r)
    out = []
    for system, turns in groups.items():
        for turn in sorted(turns, key=lambda t: (t is None, t or 0)):
            rs = turns[turn]
            out.append(
                TurnSummary(
                    system=system,
                    turn=turn,
                    requests=len(rs),
                    input_tokens=sum(r.input_tokens for r in rs),
                    cached_tokens=sum(r.cached_tokens for r in rs),
                    gpu_bytes=sum(r.gpu_bytes for r in rs),
                    tier_bytes=sum(r.tier_bytes for r in rs),
                    mean_ttft_s=sum(r.ttft_s for r in rs) / len(rs),
                )
            )
    return out


def write_json(path: str | os.PathLike[str], document: dict[str, Any]) -> None:
    """Writes ``document`` as indented JSON."""
    with open(path, "w") as f:
        json.dump(document, f, indent=2, sort_keys=False)
        f.write("\n")


def write_csv(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]]) -> None:
    """Writes flat records as CSV, columns in the first record's order."""
    if not rows:
        raise ValueError(f"no rows to write to {os.fspath(path)}")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
