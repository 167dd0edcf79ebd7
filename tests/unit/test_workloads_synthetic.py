"""chm.sim.workloads.synthetic: the multi-turn chat generator and the closed loop."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from chm.sim.workloads import ChatWorkload, Request, generate_chat, schedule_closed_loop


def _by_session(reqs: list[Request]) -> dict[int, list[Request]]:
    out: dict[int, list[Request]] = {}
    for r in reqs:
        assert r.session is not None
        out.setdefault(r.session, []).append(r)
    return out


def test_same_seed_same_workload_other_seed_other_workload() -> None:
    wl = ChatWorkload(users=5, turns=4, seed=11)
    assert generate_chat(wl) == generate_chat(ChatWorkload(users=5, turns=4, seed=11))
    other = generate_chat(dataclasses.replace(wl, seed=12))
    assert [r.input_tokens for r in other] != [r.input_tokens for r in generate_chat(wl)]


def test_a_session_does_not_change_when_users_grow() -> None:
    small = _by_session(generate_chat(ChatWorkload(users=2, turns=3, seed=3)))
    big = _by_session(generate_chat(ChatWorkload(users=6, turns=3, seed=3)))
    for s in (0, 1):
        strip = [dataclasses.replace(r, index=0, arrival_s=0.0) for r in small[s]]
        assert strip == [dataclasses.replace(r, index=0, arrival_s=0.0) for r in big[s]]


def test_prompts_grow_by_answer_and_message_and_share_prefixes() -> None:
    wl = ChatWorkload(
        users=3, turns=5, system_prompt_tokens=1000, user_tokens=(10, 300), output_tokens=(0, 90)
    )
    reqs = generate_chat(wl)
    assert len(reqs) == 15
    sessions = _by_session(reqs)
    for turns in sessions.values():
        assert [r.turn for r in turns] == list(range(5))
        assert 1000 + 10 <= turns[0].input_tokens <= 1000 + 300
        for a, b in itertools.pairwise(turns):
            grown = b.input_tokens - a.input_tokens - a.output_tokens
            assert 10 <= grown <= 300
            assert 0 <= a.output_tokens <= 90
            assert b.block_keys[: len(a.block_keys)] == a.block_keys
        for r in turns:
            assert len(r.block_keys) == r.input_tokens // 128
            assert r.cached_tokens_max == len(r.block_keys) * 128
    # 1000 // 128 = 7 blocks lie wholly in the system prompt: shared by all users
    firsts = [s[0].block_keys for s in sessions.values()]
    assert len({k[:7] for k in firsts}) == 1
    # block 7 holds user tokens (it straddles the prompt's end): one per user
    assert len({k[7] for k in firsts}) == 3


def test_poisson_arrivals_follow_think_times() -> None:
    wl = ChatWorkload(users=4, turns=3, think_time_s=2.0, session_rate_per_s=0.5, seed=5)
    reqs = generate_chat(wl)
    assert [r.index for r in reqs] == list(range(12))
    assert [r.arrival_s for r in reqs] == sorted(r.arrival_s for r in reqs)
    assert reqs[0].arrival_s == 0.0
    for turns in _by_session(reqs).values():
        assert turns[0].think_s == 0.0
        for a, b in itertools.pairwise(turns):
            assert b.arrival_s - a.arrival_s == pytest.approx(b.think_s)
            assert b.think_s > 0


def test_zero_think_time() -> None:
    reqs = generate_chat(ChatWorkload(users=2, turns=3, think_time_s=0.0, seed=1))
    assert all(r.think_s == 0.0 for r in reqs)


def test_closed_loop_by_hand() -> None:
    # 3 sessions x 2 turns, 2 at a time, no think time, each request takes 1 s:
    # s0 and s1 arrive at 0 and 1 (turn 1 after turn 0 completes); both are
    # done at 2, so s2 starts at 2 and its turn 1 arrives at 3.
    wl = ChatWorkload(users=3, turns=2, think_time_s=0.0, arrival="closed", concurrency=2)
    calls: list[int] = []

    def service(r: Request) -> float:
        calls.append(r.index)
        return 1.0

    reqs = schedule_closed_loop(generate_chat(wl), 2, service)
    assert [(r.session, r.turn, r.arrival_s) for r in reqs] == [
        (0, 0, 0.0),
        (1, 0, 0.0),
        (0, 1, 1.0),
        (1, 1, 1.0),
        (2, 0, 2.0),
        (2, 1, 3.0),
    ]
    assert calls == list(range(6))  # once each, in arrival order


def test_closed_loop_adds_think_time_after_completion() -> None:
    base = [
        Request(0, 0.0, 10, 1, 128, (), session=0, turn=0),
        Request(1, 0.0, 10, 1, 128, (), session=0, turn=1, think_s=2.5),
    ]
    reqs = schedule_closed_loop(base, 1, lambda r: 0.5)
    assert [r.arrival_s for r in reqs] == [0.0, 3.0]


def test_closed_loop_generation_keeps_concurrency() -> None:
    wl = ChatWorkload(users=6, turns=3, arrival="closed", concurrency=2, seed=2)
    reqs = generate_chat(wl)
    assert len(reqs) == 18
    # with zero service time a session's turns are its think times apart
    sessions = _by_session(reqs)
    for turns in sessions.values():
        for a, b in itertools.pairwise(turns):
            assert b.arrival_s - a.arrival_s == pytest.approx(b.think_s)
    # a session starts when an earlier one has finished: at most 2 overlap
    spans = sorted((t[0].arrival_s, t[-1].arrival_s) for t in sessions.values())
    for start, _ in spans:
        assert sum(1 for s, e in spans if s <= start < e) <= 2


def test_closed_loop_refuses_bad_input() -> None:
    r = Request(0, 0.0, 10, 1, 128, ())
    with pytest.raises(ValueError, match="request 0 has no session/turn"):
        schedule_closed_loop([r], 1, lambda _r: 0.0)
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1, got 0"):
        schedule_closed_loop([], 0, lambda _r: 0.0)
    good = dataclasses.replace(r, session=0, turn=0)
    with pytest.raises(ValueError, match=r"service_s gave -1\.0 for request 0"):
        schedule_closed_loop([good], 1, lambda _r: -1.0)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("users", 0, "users must be an integer >= 1"),
        ("turns", 1.5, "turns must be an integer >= 1"),
        ("block_tokens", True, "block_tokens must be an integer >= 1"),
        ("system_prompt_tokens", -1, "system_prompt_tokens must be an integer >= 0"),
        ("user_tokens", (5, 4), "user_tokens must be a"),
        ("user_tokens", (0, 4), "user_tokens must be a"),
        ("output_tokens", [1, 2], "output_tokens must be a"),
        ("think_time_s", -1.0, "think_time_s must be >= 0"),
        ("think_time_s", float("nan"), "think_time_s must be a finite number"),
        ("session_rate_per_s", 0, "session_rate_per_s must be > 0"),
        ("arrival", "bursty", "arrival must be 'poisson' or 'closed'"),
        ("seed", -1, "seed must be an integer >= 0"),
    ],
)
def test_bad_parameters_name_the_field(field: str, value: Any, match: str) -> None:
    with pytest.raises(ValueError, match=f"ChatWorkload.{match}"):
        ChatWorkload(**{field: value})


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"input_tokens": 0}, "needs input_tokens >= 1"),
        ({"output_tokens": -1}, "needs input_tokens >= 1, output_tokens >= 0"),
        ({"block_tokens": 0}, "needs .* and block_tokens >= 1"),
        ({"block_keys": (b"k",)}, "300 tokens in 128-token blocks make 2 full blocks, got 1 keys"),
        ({"think_s": -1.0}, "arrival_s and think_s must be >= 0"),
    ],
)
def test_inconsistent_requests_are_refused(kw: dict[str, Any], match: str) -> None:
    base: dict[str, Any] = {
        "index": 7,
        "arrival_s": 0.0,
        "input_tokens": 300,
        "output_tokens": 1,
        "block_tokens": 128,
        "block_keys": (b"a", b"b"),
    }
    with pytest.raises(ValueError, match=f"Request 7: {match}"):
        Request(**(base | kw))
