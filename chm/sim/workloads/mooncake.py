"""The Mooncake trace format: reading, validating and re-blocking.

A trace is JSON lines, one request each::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}

``timestamp`` is the arrival in milliseconds, the lengths are tokens, and
``hash_ids`` names the prompt's consecutive 512-token blocks (the last one may
be partial), so ``len(hash_ids) == ceil(input_length / 512)``. Equal ids mean
equal block contents after an equal prefix: a reusable prefix. An optional
``session_id`` (a string or an integer) groups a conversation's turns, in line
order; other keys are ignored.

The reader validates every line and raises :class:`TraceFormatError` naming
the source and line number at the first bad one; it never skips a line.
:func:`reblock` cuts a prompt into serving blocks (128 tokens by default) and
names each full one by a key chained over the trace ids it overlaps
(:mod:`chm.sim.workloads.keys`). A partial trace block has a different id from the
full block it later grows into, so serving blocks inside it are not reused by
the next turn: the trace does not say which of its tokens are shared.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from chm.sim.workloads.keys import chain_key, root_key
from chm.sim.workloads.records import Request

__all__ = [
    "TRACE_BLOCK_TOKENS",
    "TraceFormatError",
    "TraceRecord",
    "parse_mooncake_line",
    "read_mooncake",
    "reblock",
    "trace_requests",
]

TRACE_BLOCK_TOKENS = 512
_ID_LIMIT = 2**64  # ids are hashed as unsigned 64-bit integers


class TraceFormatError(ValueError):
    """A trace line that is not a valid Mooncake record.

    ``source`` names the file (or ``"<lines>"``), ``lineno`` is 1-based and
    ``reason`` says what is wrong with that line.
    """

    def __init__(self, source: str, lineno: int, reason: str) -> None:
        super().__init__(f"{source} line {lineno}: {reason}")
        self.source = source
        self.lineno = lineno
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One validated trace line (``lineno`` is 1-based)."""

    lineno: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session_id: str | None = None


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number in JSON")


def parse_mooncake_line(
    text: str,
    lineno: int,
    *,
    source: str = "<lines>",
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
) -> TraceRecord:
    """Validates one trace line; raises TraceFormatError naming ``lineno``."""

    def bad(reason: str) -> TraceFormatError:
        return TraceFormatError(source, lineno, reason)

    if not text.strip():
        raise bad("empty line (every line must be a JSON object)")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise bad(f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise bad(f"expected a JSON object, got {type(obj).__name__}")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise bad(f"missing key {key!r}")
    ts = obj["timestamp"]
    if not (_is_int(ts) or isinstance(ts, float)) or ts < 0:
        raise bad(f"timestamp must be a non-negative number of milliseconds, got {ts!r}")
    n_in = obj["input_length"]
    if not _is_int(n_in) or n_in < 1:
        raise bad(f"input_length must be a positive integer, got {n_in!r}")
    n_out = obj["output_length"]
    if not _is_int(n_out) or n_out < 0:
        raise bad(f"output_length must be a non-negative integer, got {n_out!r}")
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise bad(f"hash_ids must be a list of integers, got {type(ids).__name__}")
    for i, h in enumerate(ids):
        if not _is_int(h) or not 0 <= h < _ID_LIMIT:
            raise bad(f"hash_ids[{i}] must be an integer in [0, 2**64), got {h!r}")
    want = -(-n_in // trace_block_tokens)
    if len(ids) != want:
        raise bad(
            f"input_length {n_in} needs {want} hash ids of {trace_block_tokens} tokens, "
            f"got {len(ids)}"
        )
    sid = obj.get("session_id")
    if sid is not None and (isinstance(sid, bool) or not isinstance(sid, (str, int))):
        raise bad(f"session_id must be a string or an integer, got {sid!r}")
    return TraceRecord(
        lineno, float(ts), n_in, n_out, tuple(ids), None if sid is None else str(sid)
    )


def read_mooncake(
    source: str | os.PathLike[str] | Iterable[str],
    *,
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
) -> Iterator[TraceRecord]:
    """Yields every record of a trace file (a path) or of an iterable of lines.

    A path ending in ``.gz`` is read through gzip. Raises TraceFormatError
    at the first malformed line, at a line that is not UTF-8, and where a
    timestamp goes backwards; nothing is skipped.
    """
    if trace_block_tokens < 1:
        raise ValueError(f"trace_block_tokens must be >= 1, got {trace_block_tokens}")
    if isinstance(source, (str, os.PathLike)):
        yield from _read_path(os.fspath(source), trace_block_tokens)
        return
    yield from _read_lines(enumerate(source, start=1), "<lines>", trace_block_tokens)


def _read_path(path: str, trace_block_tokens: int) -> Iterator[TraceRecord]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:

        def decoded() -> Iterator[tuple[int, str]]:
            for lineno, raw in enumerate(f, start=1):
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TraceFormatError(path, lineno, f"not UTF-8: {exc.reason}") from None

        yield from _read_lines(decoded(), path, trace_block_tokens)


def _read_lines(
    lines: Iterable[tuple[int, str]], source: str, trace_block_tokens: int
) -> Iterator[TraceRecord]:
    last_ts = -math.inf
    for lineno, text in lines:
        rec = parse_mooncake_line(
            text, lineno, source=source, trace_block_tokens=trace_block_tokens
        )
        if rec.timestamp_ms < last_ts:
            raise TraceFormatError(
                source,
                lineno,
                f"timestamp {rec.timestamp_ms:g} ms is earlier than the previous "
                f"line's {last_ts:g} ms (a trace is in arrival order)",
            )
        last_ts = rec.timestamp_ms
        yield rec


def reblock(
    input_length: int,
    hash_ids: tuple[int, ...] | list[int],
    *,
    block_tokens: int = 128,
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
    namespace: str = "mooncake",
) -> tuple[bytes, ...]:
    """Keys of the prompt's full serving blocks of ``block_tokens`` tokens.

    Serving block k holds tokens [k*B, (k+1)*B); its content is named by the
    ids of the trace blocks those tokens fall in, and its key chains that
    with the previous block's key. Integer arithmetic throughout; any
    positive block sizes work (a serving block may span trace blocks).
    """
    if block_tokens < 1 or trace_block_tokens < 1:
        raise ValueError(
            f"block sizes must be >= 1 token, got block_tokens={block_tokens}, "
            f"trace_block_tokens={trace_block_tokens}"
        )
    if len(hash_ids) != -(-input_length // trace_block_tokens):
        raise ValueError(
            f"input_length {input_length} needs {-(-input_length // trace_block_tokens)} "
            f"hash ids of {trace_block_tokens} tokens, got {len(hash_ids)}"
        )
    keys: list[bytes] = []
    prev = root_key(namespace)
    for k in range(input_length // block_tokens):
        start = k * block_tokens
        first = start // trace_block_tokens
        last = (start + block_tokens - 1) // trace_block_tokens
        prev = chain_key(prev, start, tuple(hash_ids[first : last + 1]))
        keys.append(prev)
    return tuple(keys)


def trace_requests(
    records: Iterable[TraceRecord],
    *,
    block_tokens: int = 128,
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
    namespace: str = "mooncake",
    infer_sessions: bool = False,
) -> list[Request]:
    """The trace's records as Requests (arrival in seconds from the first one).

    Records with a ``session_id`` get sessions numbered in order of first
    appearance and turns counted in line order. For records without one,
    with ``infer_sessions`` a request continues the session of the latest
    earlier request whose full trace blocks are all a proper prefix of its
    own (the previous turn's prompt, as multi-turn chat appends to it), and
    gets that turn + 1; otherwise it opens a new session at turn 0. This is
    a heuristic, off by default: when a request's whole blocks are only a
    shared prefix (a system prompt), the next conversation that opens with
    that prefix is taken for its next turn, and where two sessions' prompts
    differ only inside a partial trace block a later turn goes to the latest
    of them. Without it, ``session`` and ``turn`` are None. Trace arrivals are open-loop
    timestamps, so ``think_s`` stays 0.
    """
    out: list[Request] = []
    t0: float | None = None
    # chained key of a request's full trace blocks -> (session, turn)
    ends: dict[bytes, tuple[int, int]] = {}
    n_sessions = 0
    named: dict[str, int] = {}
    turns: dict[int, int] = {}
    trace_root = root_key(namespace + "/trace-blocks")
    for i, rec in enumerate(records):
        if t0 is None:
            t0 = rec.timestamp_ms
        keys = reblock(
            rec.input_length,
            rec.hash_ids,
            block_tokens=block_tokens,
            trace_block_tokens=trace_block_tokens,
            namespace=namespace,
        )
        session: int | None = None
        turn: int | None = None
        if rec.session_id is not None:
            if rec.session_id not in named:
                named[rec.session_id] = n_sessions
                n_sessions += 1
            session = named[rec.session_id]
            turn = turns.get(session, -1) + 1
            turns[session] = turn
        elif infer_sessions:
            n_full = rec.input_length // trace_block_tokens
            chain = [trace_root]
            for j in range(n_full):
                chain.append(chain_key(chain[-1], j, (rec.hash_ids[j],)))
            found: tuple[int, int] | None = None
            for n in range(n_full - 1, 0, -1):  # proper, non-empty prefixes, longest first
                found = ends.get(chain[n])
                if found is not None:
                    break
            if found is None:
                session, turn = n_sessions, 0
                n_sessions += 1
            else:
                session, turn = found[0], found[1] + 1
            if n_full:
                ends[chain[n_full]] = (session, turn)
        out.append(
            Request(
                index=i,
                arrival_s=(rec.timestamp_ms - t0) / 1000.0,
                input_tokens=rec.input_length,
                output_tokens=rec.output_length,
                block_tokens=block_tokens,
                block_keys=keys,
                session=session,
                turn=turn,
            )
        )
    return out
