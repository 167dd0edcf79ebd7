"""The request record every workload source produces and a replay consumes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Request"]


@dataclass(frozen=True, slots=True)
class Request:
    """One prefill request of a multi-turn workload.

    ``block_keys`` names the prompt's full serving blocks in order (a partial
    last block is never cached, so it has no key): ``len(block_keys) ==
    input_tokens // block_tokens``. ``arrival_s`` is the arrival time in
    seconds from the start of the workload. ``session`` and ``turn`` place the
    request in its conversation (turn 0 is the first) where the source knows
    it; ``think_s`` is the user's pause before this request after the
    previous turn of its session completed (0 for a session's first turn).
    """

    index: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_tokens: int
    block_keys: tuple[bytes, ...]
    session: int | None = None
    turn: int | None = None
    think_s: float = 0.0

    def __post_init__(self) -> None:
        where = f"Request {self.index}"
        if self.input_tokens < 1 or self.output_tokens < 0 or self.block_tokens < 1:
            raise ValueError(
                f"{where}: needs input_tokens >= 1, output_tokens >= 0 and block_tokens >= 1, "
                f"got {self.input_tokens}, {self.output_tokens}, {self.block_tokens}"
            )
        if len(self.block_keys) != self.input_tokens // self.block_tokens:
            raise ValueError(
                f"{where}: {self.input_tokens} tokens in {self.block_tokens}-token blocks "
                f"make {self.input_tokens // self.block_tokens} full blocks, "
                f"got {len(self.block_keys)} keys"
            )
        if self.think_s < 0 or self.arrival_s < 0:
            raise ValueError(f"{where}: arrival_s and think_s must be >= 0")

    @property
    def cached_tokens_max(self) -> int:
        """Tokens a prefix cache could supply at most (the full blocks)."""
        return len(self.block_keys) * self.block_tokens
