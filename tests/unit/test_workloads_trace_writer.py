"""chm.sim.workloads.mooncake_write: synthetic workloads written as Mooncake traces."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from chm.sim.workloads import (
    ChatWorkload,
    TraceRecord,
    generate_chat,
    read_mooncake,
    synthetic_trace,
    trace_requests,
    write_mooncake,
)

WL = ChatWorkload(users=5, turns=4, system_prompt_tokens=1024, seed=9)


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    recs = synthetic_trace(WL)
    path = tmp_path / "t.jsonl"
    assert write_mooncake(path, recs) == 20
    back = list(read_mooncake(path))
    assert back == recs
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first) == ["timestamp", "input_length", "output_length", "hash_ids", "session_id"]


def test_records_follow_the_workload() -> None:
    reqs = generate_chat(WL)
    recs = synthetic_trace(WL)
    assert [r.input_length for r in recs] == [r.input_tokens for r in reqs]
    assert [r.output_length for r in recs] == [r.output_tokens for r in reqs]
    assert [r.timestamp_ms for r in recs] == [round(r.arrival_s * 1000, 3) for r in reqs]
    assert [r.session_id for r in recs] == [str(r.session) for r in reqs]
    # the system prompt is two whole trace blocks, ids 0 and 1, in every prompt
    assert all(r.hash_ids[:2] == (0, 1) for r in recs)
    for r in recs:
        assert len(r.hash_ids) == -(-r.input_length // 512)


def test_replayed_trace_shares_exactly_the_workloads_prefixes() -> None:
    # at 512-token blocks the trace's keys and the workload's keys must name
    # the same blocks: a one-to-one correspondence over every request
    synth = generate_chat(ChatWorkload(**{**WL.__dict__, "block_tokens": 512}))
    replayed = trace_requests(synthetic_trace(WL), block_tokens=512)
    pairs = {
        (a, b)
        for s, t in zip(synth, replayed, strict=True)
        for a, b in zip(s.block_keys, t.block_keys, strict=True)
    }
    assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs})
    # sessions and turns come back from session_id
    assert [(r.session, r.turn) for r in replayed] == [(r.session, r.turn) for r in synth]


def test_partial_blocks_are_not_shared_by_the_next_turn() -> None:
    recs = synthetic_trace(WL)
    by_session: dict[str | None, list[TraceRecord]] = {}
    for r in recs:
        by_session.setdefault(r.session_id, []).append(r)
    partials = 0
    for turns in by_session.values():
        for a, b in itertools.pairwise(turns):
            whole = a.input_length // 512
            assert b.hash_ids[:whole] == a.hash_ids[:whole]  # every whole block is reused
            if a.input_length % 512:
                partials += 1
                assert a.hash_ids[-1] not in b.hash_ids  # the partial one is not
    assert partials > 10


@pytest.mark.parametrize("bt", [0, -1])
def test_bad_trace_block_size(bt: int) -> None:
    with pytest.raises(ValueError, match="block_tokens must be an integer >= 1"):
        synthetic_trace(WL, trace_block_tokens=bt)
