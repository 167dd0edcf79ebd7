"""Writing workloads in the Mooncake trace format.

:func:`synthetic_trace` renders a synthetic chat workload as trace records:
its prompts cut into 512-token blocks, each distinct whole block numbered in
order of first appearance, each partial last block given an id of its own
(as Mooncake's traces do: a block's id names its exact tokens), arrivals in
milliseconds and each conversation's ``session_id``. So a replay of the
trace sees the same prefix sharing, at trace-block granularity, as the
workload itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable

from chm.sim.workloads.mooncake import TRACE_BLOCK_TOKENS, TraceRecord
from chm.sim.workloads.synthetic import ChatWorkload, generate_chat

__all__ = ["format_mooncake_line", "synthetic_trace", "write_mooncake"]


def synthetic_trace(
    wl: ChatWorkload, *, trace_block_tokens: int = TRACE_BLOCK_TOKENS
) -> list[TraceRecord]:
    """The workload's requests as Mooncake records, in arrival order."""
    reqs = generate_chat(dataclasses.replace(wl, block_tokens=trace_block_tokens))
    ids: dict[bytes, int] = {}
    fresh = 0
    out: list[TraceRecord] = []
    for lineno, r in enumerate(reqs, start=1):
        hash_ids: list[int] = []
        for k in r.block_keys:
            if k not in ids:
                ids[k] = fresh
                fresh += 1
            hash_ids.append(ids[k])
        if r.input_tokens % trace_block_tokens:
            hash_ids.append(fresh)  # this request's partial block: its own tokens
            fresh += 1
        out.append(
            TraceRecord(
                lineno=lineno,
                timestamp_ms=round(r.arrival_s * 1000.0, 3),
                input_length=r.input_tokens,
                output_length=r.output_tokens,
                hash_ids=tuple(hash_ids),
                session_id=None if r.session is None else str(r.session),
            )
        )
    return out


def format_mooncake_line(rec: TraceRecord) -> str:
    """One record as a JSON line (no newline); ``session_id`` only if set."""
    ts: float | int = int(rec.timestamp_ms) if rec.timestamp_ms.is_integer() else rec.timestamp_ms
    obj: dict[str, object] = {
        "timestamp": ts,
        "input_length": rec.input_length,
        "output_length": rec.output_length,
        "hash_ids": list(rec.hash_ids),
    }
    if rec.session_id is not None:
        obj["session_id"] = rec.session_id
    return json.dumps(obj)


def write_mooncake(path: str | os.PathLike[str], records: Iterable[TraceRecord]) -> int:
    """Writes the records as a trace file; returns the number of lines."""
    n = 0
    with open(path, "w") as f:
        for rec in records:
            f.write(format_mooncake_line(rec) + "\n")
            n += 1
    return n
