"""A synthetic multi-turn chat workload, deterministic by seed.

Each of ``users`` sessions is a conversation of ``turns`` requests. Every
conversation opens with the same system prompt; each turn appends a user
message, the prompt is the whole conversation so far, and the model's answer
(``output_tokens``) is appended before the next turn. So a turn's prompt
extends the previous turn's prompt plus its answer, and all prompts share the
system prompt's blocks.

Arrivals:

- ``"poisson"`` (open loop): sessions start as a Poisson process of
  ``session_rate_per_s``; a turn arrives its think time after the previous
  turn's arrival (the server's speed does not move arrivals).
- ``"closed"``: ``concurrency`` sessions run at once; a turn arrives its think
  time after the previous turn completed, and a session starts when another
  one finishes. :func:`generate_chat` times them with zero service time;
  :func:`schedule_closed_loop` re-times them with a replay's service times.

Message and answer lengths are uniform integers in their (inclusive) ranges;
think times are exponential with mean ``think_time_s``. Session ``u`` draws
from its own random stream spawned from ``seed``, so a session does not change
when ``users`` grows.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from chm.sim.workloads.keys import chain_key, root_key
from chm.sim.workloads.records import Request

__all__ = ["ChatWorkload", "generate_chat", "schedule_closed_loop"]

Arrival = Literal["poisson", "closed"]


@dataclass(frozen=True)
class ChatWorkload:
    """Parameters of a synthetic multi-turn chat workload (tokens, seconds)."""

    users: int = 8
    turns: int = 6
    system_prompt_tokens: int = 1024
    user_tokens: tuple[int, int] = (128, 512)
    output_tokens: tuple[int, int] = (64, 256)
    think_time_s: float = 5.0
    arrival: Arrival = "poisson"
    session_rate_per_s: float = 1.0
    concurrency: int = 4
    block_tokens: int = 128
    seed: int = 0
    namespace: str = "synthetic"

    def __post_init__(self) -> None:
        for name in ("users", "turns", "block_tokens", "concurrency"):
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                raise ValueError(f"ChatWorkload.{name} must be an integer >= 1, got {v!r}")
        if not _is_int(self.system_prompt_tokens) or self.system_prompt_tokens < 0:
            raise ValueError(
                "ChatWorkload.system_prompt_tokens must be an integer >= 0, "
                f"got {self.system_prompt_tokens!r}"
            )
        for name, least in (("user_tokens", 1), ("output_tokens", 0)):
            r = getattr(self, name)
            if (
                not isinstance(r, tuple)
                or len(r) != 2
                or not all(_is_int(x) for x in r)
                or not least <= r[0] <= r[1]
            ):
                raise ValueError(
                    f"ChatWorkload.{name} must be a (low, high) pair of integers with "
                    f"{least} <= low <= high, got {r!r}"
                )
        for name in ("think_time_s", "session_rate_per_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"ChatWorkload.{name} must be a finite number, got {v!r}")
        if self.think_time_s < 0:
            raise ValueError(f"ChatWorkload.think_time_s must be >= 0, got {self.think_time_s!r}")
        if self.session_rate_per_s <= 0:
            raise ValueError(
                f"ChatWorkload.session_rate_per_s must be > 0, got {self.session_rate_per_s!r}"
            )
        if self.arrival not in ("poisson", "closed"):
            raise ValueError(
                f"ChatWorkload.arrival must be 'poisson' or 'closed', got {self.arrival!r}"
            )
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"ChatWorkload.seed must be an integer >= 0, got {self.seed!r}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _block_keys(
    wl: ChatWorkload, user: int, prompt_tokens: int, known: list[bytes]
) -> tuple[bytes, ...]:
    """Keys of the full blocks of user ``user``'s first ``prompt_tokens`` tokens.

    ``known`` holds the keys already derived for this conversation and is
    extended in place (the conversation only grows). A block entirely inside
    the system prompt is content 0, shared by all users; any other block holds
    this user's tokens, content ``1 + user``.
    """
    b = wl.block_tokens
    while len(known) < prompt_tokens // b:
        k = len(known)
        start = k * b
        content = 0 if start + b <= wl.system_prompt_tokens else 1 + user
        prev = known[-1] if known else root_key(wl.namespace)
        known.append(chain_key(prev, start, (content,)))
    return tuple(known[: prompt_tokens // b])


def _session(wl: ChatWorkload, user: int, rng: np.random.Generator) -> list[Request]:
    keys: list[bytes] = []
    context = wl.system_prompt_tokens
    out: list[Request] = []
    for turn in range(wl.turns):
        msg = int(rng.integers(wl.user_tokens[0], wl.user_tokens[1], endpoint=True))
        answer = int(rng.integers(wl.output_tokens[0], wl.output_tokens[1], endpoint=True))
        think = float(rng.exponential(wl.think_time_s)) if turn and wl.think_time_s else 0.0
        prompt = context + msg
        out.append(
            Request(
                index=-1,
                arrival_s=0.0,
                input_tokens=prompt,
                output_tokens=answer,
                block_tokens=wl.block_tokens,
                block_keys=_block_keys(wl, user, prompt, keys),
                session=user,
                turn=turn,
                think_s=think,
            )
        )
        context = prompt + answer
    return out


def generate_chat(wl: ChatWorkload) -> list[Request]:
    """The workload's requests in arrival order (``index`` = position)."""
    seeds = np.random.SeedSequence(wl.seed).spawn(wl.users + 1)
    sessions = [_session(wl, u, np.random.default_rng(seeds[u])) for u in range(wl.users)]
    if wl.arrival == "closed":
        return schedule_closed_loop(
            [r for s in sessions for r in s], wl.concurrency, lambda _r: 0.0
        )
    starts = np.random.default_rng(seeds[wl.users]).exponential(
        1.0 / wl.session_rate_per_s, size=wl.users
    )
    starts[0] = 0.0
    timed: list[Request] = []
    for start, reqs in zip(np.cumsum(starts), sessions, strict=True):
        t = float(start)
        for r in reqs:
            t += r.think_s
            timed.append(dataclasses.replace(r, arrival_s=t))
    return _in_arrival_order(timed)


def _in_arrival_order(reqs: Iterable[Request]) -> list[Request]:
    ordered = sorted(reqs, key=lambda r: (r.arrival_s, r.session, r.turn))
    return [dataclasses.replace(r, index=i) for i, r in enumerate(ordered)]


def schedule_closed_loop(
    requests: Iterable[Request],
    concurrency: int,
    service_s: Callable[[Request], float],
) -> list[Request]:
    """Re-times sessions as a closed loop of ``concurrency`` users.

    Sessions start in session order, ``concurrency`` of them at time 0, the
    next one when a running one completes its last turn; a turn arrives
    ``think_s`` after its predecessor completed. ``service_s(request)`` gives
    a request's time from arrival to completion and is called once per
    request in arrival order, so a stateful replay can answer it. Every
    request needs ``session`` and ``turn``. Returns the requests re-timed,
    in arrival order.
    """
    if not _is_int(concurrency) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    by_session: dict[int, list[Request]] = {}
    for r in requests:
        if r.session is None or r.turn is None:
            raise ValueError(f"request {r.index} has no session/turn: cannot close the loop")
        by_session.setdefault(r.session, []).append(r)
    queues = [sorted(v, key=lambda r: r.turn or 0) for _, v in sorted(by_session.items())]
    waiting = iter(queues)
    # (arrival time, session order, request): turns ready to arrive
    heap: list[tuple[float, int, int, Request]] = []
    pos = {}

    def start(order: int, t: float) -> None:
        pos[order] = 0
        first = queues[order][0]
        heapq.heappush(heap, (t, order, first.turn or 0, first))

    order = 0
    for _ in range(min(concurrency, len(queues))):
        next(waiting)
        start(order, 0.0)
        order += 1
    out: list[Request] = []
    while heap:
        t, o, _turn, r = heapq.heappop(heap)
        timed = dataclasses.replace(r, arrival_s=t, index=len(out))
        out.append(timed)
        service = float(service_s(timed))
        if not math.isfinite(service) or service < 0:
            raise ValueError(f"service_s gave {service!r} for request {r.index}")
        done = t + service
        pos[o] += 1
        if pos[o] < len(queues[o]):
            nxt = queues[o][pos[o]]
            heapq.heappush(heap, (done + nxt.think_s, o, nxt.turn or 0, nxt))
        elif next(waiting, None) is not None:
            start(order, done)
            order += 1
    return out
