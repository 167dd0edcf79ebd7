"""Serving workloads for replays: synthetic multi-turn chat and Mooncake traces.

Every source yields the same record, :class:`Request`: one prefill request
whose prompt is cut into serving blocks of ``block_tokens`` tokens, each full
block named by a 16-byte key that is a function of the prompt's prefix up to
and including that block (:mod:`chm.sim.workloads.keys`), so requests that share
a prefix share the keys of its blocks.
"""

from __future__ import annotations

from chm.sim.workloads.keys import KEY_BYTES, chain_key, root_key
from chm.sim.workloads.mooncake import (
    TRACE_BLOCK_TOKENS,
    TraceFormatError,
    TraceRecord,
    parse_mooncake_line,
    read_mooncake,
    reblock,
    trace_requests,
)
from chm.sim.workloads.mooncake_write import format_mooncake_line, synthetic_trace, write_mooncake
from chm.sim.workloads.records import Request
from chm.sim.workloads.synthetic import ChatWorkload, generate_chat, schedule_closed_loop

__all__ = [
    "KEY_BYTES",
    "TRACE_BLOCK_TOKENS",
    "ChatWorkload",
    "Request",
    "TraceFormatError",
    "TraceRecord",
    "chain_key",
    "format_mooncake_line",
    "generate_chat",
    "parse_mooncake_line",
    "read_mooncake",
    "reblock",
    "root_key",
    "schedule_closed_loop",
    "synthetic_trace",
    "trace_requests",
    "write_mooncake",
]
