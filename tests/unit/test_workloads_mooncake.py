"""chm.sim.workloads.mooncake: the trace reader, its errors, and re-blocking."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chm.sim.workloads import (
    TraceFormatError,
    chain_key,
    parse_mooncake_line,
    read_mooncake,
    reblock,
    root_key,
    trace_requests,
)

DATA = Path(__file__).resolve().parent.parent / "data"
SMALL = DATA / "mooncake_small.jsonl"


def test_reads_every_line_of_the_fixture() -> None:
    recs = list(read_mooncake(SMALL))
    assert [r.lineno for r in recs] == list(range(1, 9))
    assert recs[0].timestamp_ms == 0.0
    assert recs[4].timestamp_ms == 3000.5
    assert recs[2].input_length == 1700
    assert recs[2].output_length == 30
    assert recs[2].hash_ids == (0, 1, 3, 4)
    assert recs[5].output_length == 0


def test_requests_from_the_fixture() -> None:
    reqs = trace_requests(read_mooncake(SMALL), infer_sessions=True)
    assert [r.index for r in reqs] == list(range(8))
    assert [r.arrival_s for r in reqs] == [0.0, 0.5, 2.0, 2.6, 3.0005, 3.5, 4.0, 4.0]
    # 128-token serving blocks: input // 128 full blocks each
    assert [len(r.block_keys) for r in reqs] == [8, 10, 13, 12, 16, 4, 4, 8]
    assert all(r.block_tokens == 128 for r in reqs)
    # hand-inferred conversations: A = 0, B = 1, C = 2, D = 3
    assert [r.session for r in reqs] == [0, 1, 0, 1, 0, 2, 3, 3]
    assert [r.turn for r in reqs] == [0, 0, 1, 1, 2, 0, 0, 1]
    # every prompt opens with trace block 0 except D's: 4 shared serving blocks
    first4 = reqs[0].block_keys[:4]
    assert all(r.block_keys[:4] == first4 for r in reqs[:6])
    assert reqs[6].block_keys[0] != first4[0]
    # A's turn 1 reuses turn 0's two full trace blocks (ids 0, 1) = 8 serving blocks
    assert reqs[2].block_keys[:8] == reqs[0].block_keys[:8]
    # D's turn 1 extends D's turn 0 by one trace block
    assert reqs[7].block_keys[:4] == reqs[6].block_keys


def test_sessions_are_not_inferred_by_default() -> None:
    reqs = trace_requests(read_mooncake(SMALL))
    assert all(r.session is None and r.turn is None for r in reqs)


def test_session_inference_merges_conversations_after_a_bare_shared_prefix() -> None:
    # the documented limit: request 0's whole blocks are only the shared
    # prefix [0], so request 1 (another conversation opening with [0]) is
    # taken for request 0's next turn
    lines = [
        json.dumps({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, 1]}),
        json.dumps(
            {"timestamp": 1, "input_length": 1100, "output_length": 1, "hash_ids": [0, 2, 3]}
        ),
    ]
    reqs = trace_requests(read_mooncake(lines), infer_sessions=True)
    assert [(r.session, r.turn) for r in reqs] == [(0, 0), (0, 1)]


def test_session_ids_group_turns() -> None:
    sids: list[dict[str, object]] = [
        {"session_id": "x"},
        {"session_id": 7},
        {"session_id": "x"},
        {},
        {"session_id": "7"},
    ]
    lines = [
        json.dumps({"timestamp": t, "input_length": 10, "output_length": 1, "hash_ids": [t]} | s)
        for t, s in enumerate(sids)
    ]
    reqs = trace_requests(read_mooncake(lines), infer_sessions=True)
    # "x" -> 0, 7 -> 1, the line without one is inferred as a new session 2,
    # and "7" is the same session as 7 (ids are compared as strings)
    assert [r.session for r in reqs] == [0, 1, 0, 2, 1]
    assert [r.turn for r in reqs] == [0, 0, 1, 0, 1]


def test_reblock_128_by_hand() -> None:
    ids = (7, 8, 9)
    keys = reblock(1300, ids, block_tokens=128)
    assert len(keys) == 10  # 1300 // 128
    prev = root_key("mooncake")
    expected = []
    for k in range(10):
        prev = chain_key(prev, 128 * k, (ids[k // 4],))  # four 128-token blocks per trace block
        expected.append(prev)
    assert keys == tuple(expected)


def test_reblock_blocks_that_span_trace_blocks() -> None:
    # 384-token blocks: [0,384) in id 7; [384,768) spans 7 and 8; [768,1152) spans 8 and 9
    keys = reblock(1300, [7, 8, 9], block_tokens=384)
    r = root_key("mooncake")
    k0 = chain_key(r, 0, (7,))
    k1 = chain_key(k0, 384, (7, 8))
    k2 = chain_key(k1, 768, (8, 9))
    assert keys == (k0, k1, k2)
    # a block larger than a trace block: [0, 1024) covers ids 7 and 8; 1300 // 1024 = 1
    assert reblock(1300, [7, 8, 9], block_tokens=1024) == (chain_key(r, 0, (7, 8)),)
    # exactly the trace's blocks: the partial third block has no key
    assert len(reblock(1300, [7, 8, 9], block_tokens=512)) == 2
    assert reblock(127, [7], block_tokens=128) == ()


def test_reblock_keys_depend_on_the_whole_prefix() -> None:
    a = reblock(2048, [1, 2, 3, 4])
    b = reblock(2048, [1, 2, 5, 4])
    assert a[:8] == b[:8]  # equal first two trace blocks
    assert all(x != y for x, y in zip(a[8:], b[8:], strict=True))  # every later block differs
    assert len(set(a)) == 16
    assert reblock(2048, [1, 2, 3, 4], namespace="other")[0] != a[0]


def test_reblock_refuses_inconsistent_input() -> None:
    with pytest.raises(ValueError, match="needs 3 hash ids"):
        reblock(1300, [1, 2])
    with pytest.raises(ValueError, match="block_tokens=0"):
        reblock(100, [1], block_tokens=0)


GOOD: dict[str, object] = {
    "timestamp": 5,
    "input_length": 600,
    "output_length": 3,
    "hash_ids": [1, 2],
}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("", "empty line"),
        ("   ", "empty line"),
        ("{", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "hash_ids"}), "missing key 'hash_ids'"),
        (json.dumps(GOOD | {"timestamp": -1}), "timestamp must be"),
        (json.dumps(GOOD | {"timestamp": "5"}), "timestamp must be"),
        (json.dumps(GOOD | {"input_length": 0}), "input_length must be a positive integer"),
        (json.dumps(GOOD | {"input_length": 600.0}), "input_length must be a positive integer"),
        (json.dumps(GOOD | {"input_length": True}), "input_length must be a positive integer"),
        (json.dumps(GOOD | {"output_length": -3}), "output_length must be"),
        (json.dumps(GOOD | {"hash_ids": "1,2"}), "hash_ids must be a list"),
        (json.dumps(GOOD | {"hash_ids": [1, -2]}), r"hash_ids\[1\] must be an integer"),
        (json.dumps(GOOD | {"hash_ids": [1, 2**64]}), r"hash_ids\[1\] must be an integer"),
        (json.dumps(GOOD | {"hash_ids": [1, False]}), r"hash_ids\[1\] must be an integer"),
        (json.dumps(GOOD | {"hash_ids": [1]}), "input_length 600 needs 2 hash ids"),
        (json.dumps(GOOD | {"hash_ids": [1, 2, 3]}), "input_length 600 needs 2 hash ids"),
        (json.dumps(GOOD | {"session_id": [1]}), "session_id must be"),
        ('{"timestamp": NaN, "input_length": 1, "output_length": 0, "hash_ids": [1]}', "NaN"),
        (
            '{"timestamp": 1, "timestamp": 2, "input_length": 1, "output_length": 0, '
            '"hash_ids": [1]}',
            "duplicate key 'timestamp'",
        ),
    ],
)
def test_malformed_line_names_its_number(line: str, reason: str) -> None:
    lines = [json.dumps(GOOD), json.dumps(GOOD | {"timestamp": 6}), line, json.dumps(GOOD)]
    with pytest.raises(TraceFormatError, match=reason) as info:
        list(read_mooncake(lines))
    assert info.value.lineno == 3
    assert str(info.value).startswith("<lines> line 3: ")


def test_a_file_error_names_the_path_and_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    good = SMALL.read_bytes().splitlines(keepends=True)
    p.write_bytes(b"".join(good[:5]) + b'{"timestamp": 1}\n' + b"".join(good[5:]))
    with pytest.raises(TraceFormatError, match="missing key 'input_length'") as info:
        list(read_mooncake(p))
    assert info.value.lineno == 6
    assert info.value.source == str(p)
    assert str(info.value).startswith(f"{p} line 6: ")


def test_non_utf8_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceFormatError, match="line 2: not UTF-8"):
        list(read_mooncake(p))


def test_timestamps_going_backwards_are_refused() -> None:
    lines = [json.dumps(GOOD | {"timestamp": t}) for t in (1, 2, 2, 1.5)]
    with pytest.raises(TraceFormatError, match=r"line 4: timestamp 1\.5 ms is earlier") as info:
        list(read_mooncake(lines))
    assert info.value.lineno == 4


def test_lines_before_an_error_were_yielded_none_dropped() -> None:
    lines = [json.dumps(GOOD), json.dumps(GOOD), "oops", json.dumps(GOOD)]
    seen: list[object] = []
    with pytest.raises(TraceFormatError):
        seen.extend(read_mooncake(lines))
    assert len(seen) == 2


def test_parse_line_accepts_extra_keys_and_other_block_sizes() -> None:
    text = json.dumps(GOOD | {"input_length": 1000, "hash_ids": [1], "note": "x"})
    rec = parse_mooncake_line(text, 9, trace_block_tokens=1024)
    assert rec.lineno == 9
    assert rec.hash_ids == (1,)
    with pytest.raises(TraceFormatError, match="line 9: input_length 1000 needs 2"):
        parse_mooncake_line(text, 9)


@given(
    data=st.data(),
    trace_block=st.sampled_from([64, 128, 512, 1000]),
    block=st.integers(1, 700),
)
def test_reblock_properties(data: st.DataObject, trace_block: int, block: int) -> None:
    # a conversation that grows: a later prompt keeps the earlier one's whole
    # trace blocks, so the serving blocks inside them keep their keys
    n1 = data.draw(st.integers(1, 4000), label="n1")
    n2 = data.draw(st.integers(n1, 6000), label="n2")
    ids2 = data.draw(
        st.lists(
            st.integers(0, 2**64 - 1),
            min_size=-(-n2 // trace_block),
            max_size=-(-n2 // trace_block),
        ),
        label="ids2",
    )
    whole1 = n1 // trace_block
    tail = data.draw(st.integers(0, 2**64 - 1), label="partial id")
    ids1 = ids2[:whole1] + ([tail] if n1 % trace_block else [])
    k1 = reblock(n1, ids1, block_tokens=block, trace_block_tokens=trace_block)
    k2 = reblock(n2, ids2, block_tokens=block, trace_block_tokens=trace_block)
    assert len(k1) == n1 // block
    assert len(k2) == n2 // block
    shared = whole1 * trace_block // block  # serving blocks wholly inside the kept trace blocks
    assert k1[:shared] == k2[:shared]
    assert all(len(k) == 16 for k in k2)
    assert len(set(k2)) == len(k2)


def test_gzipped_trace(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl.gz"
    with gzip.open(p, "wb") as f:
        f.write(SMALL.read_bytes() + b"[]\n")
    with pytest.raises(TraceFormatError, match="line 9: expected a JSON object") as info:
        list(read_mooncake(p))
    assert info.value.source == str(p)
    good = tmp_path / "g.jsonl.gz"
    with gzip.open(good, "wb") as f:
        f.write(SMALL.read_bytes())
    assert list(read_mooncake(good)) == list(read_mooncake(SMALL))
