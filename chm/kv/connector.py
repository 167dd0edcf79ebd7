"""The connector for serving code: load a request's cached prefix, save new blocks.

    conn = Connector(store, model="llama-3.1-8b")      # 16 MiB blocks of 128 tokens
    n = conn.load("req-1", keys, dsts, timeout=10.0)   # tokens loaded; recompute the rest
    conn.save("req-1", new_keys, new_blocks)           # skips are fine, they are counted

A load that outlives its timeout returns the tokens loaded so far (the
caller recomputes the rest) and never waits longer: the prefetches still in
flight are released, not waited for. Block size = bytes per token (a model
preset, or explicit) x tokens per block (default 128, the paper's; LMCache
uses 256).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from chm.errors import InvalidArgument
from chm.kv.space import AddressSpace
from chm.kv.store import PutStatus, Store

__all__ = ["MODELS", "Connector", "ConnectorStats", "block_bytes"]

KiB = 1024

MODELS: dict[str, int] = {
    # KV bytes per token: 2 (K and V) x layers x KV heads x head dim x 2 bytes (bf16)
    "llama-3.1-8b": 128 * KiB,  # 2 x 32 x 8 x 128 x 2
    "qwen2.5-32b": 256 * KiB,  # 2 x 64 x 8 x 128 x 2
}
DEFAULT_TOKENS_PER_BLOCK = 128


def block_bytes(
    model: str | None = None,
    *,
    bytes_per_token: int | None = None,
    tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK,
) -> int:
    """KV bytes of one block: a preset's (or explicit) bytes per token x tokens per block."""
    if (
        isinstance(tokens_per_block, bool)
        or not isinstance(tokens_per_block, int)
        or (tokens_per_block < 1)
    ):
        raise InvalidArgument(None, f"tokens_per_block={tokens_per_block!r}: expected an int >= 1")
    if bytes_per_token is None:
        if model is None:
            raise InvalidArgument(None, "give a model preset or bytes_per_token")
        key = model.lower()
        if key not in MODELS:
            raise InvalidArgument(
                None, f"unknown model {model!r}; presets: {', '.join(MODELS)} (or bytes_per_token)"
            )
        bytes_per_token = MODELS[key]
    elif (
        isinstance(bytes_per_token, bool)
        or not isinstance(bytes_per_token, int)
        or (bytes_per_token < 1)
    ):
        raise InvalidArgument(None, f"bytes_per_token={bytes_per_token!r}: expected an int >= 1")
    return bytes_per_token * tokens_per_block


@dataclass(frozen=True)
class ConnectorStats:
    loads: int
    loads_short: int  # loads that returned fewer blocks than were in the store
    load_timeouts: int
    blocks_loaded: int
    tokens_loaded: int
    saves: int
    saved_stored: int
    saved_exists: int
    saved_skipped: int
    saved_error: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class Connector:
    """Serving-side load/save of a request's KV blocks over a Store or AddressSpace."""

    def __init__(
        self,
        target: Store | AddressSpace,
        model: str | None = "llama-3.1-8b",
        *,
        bytes_per_token: int | None = None,
        tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK,
        timeout: float = 10.0,
    ) -> None:
        self.space = target if isinstance(target, AddressSpace) else AddressSpace([target])
        self.tokens_per_block = tokens_per_block
        self.block_bytes = block_bytes(
            model if bytes_per_token is None else None,
            bytes_per_token=bytes_per_token,
            tokens_per_block=tokens_per_block,
        )
        biggest = min(s.max_block for s in self.space.stores)
        if self.block_bytes > biggest:
            raise InvalidArgument(
                None,
                f"Connector: blocks of {self.block_bytes} bytes do not fit the device's "
                f"slots ({biggest} bytes); open it with slot_size >= {self.block_bytes}",
            )
        self.timeout = timeout
        self._lock = threading.Lock()
        self._c = dict.fromkeys(ConnectorStats.__dataclass_fields__, 0)

    def load(
        self,
        request_id: object,
        keys: Any,
        dsts: Sequence[Any],
        timeout: float | None = None,
    ) -> int:
        """Fills dsts with the request's cached prefix; returns the tokens loaded.

        Loads blocks in order and stops at the first block that is not in the
        store, fails its checksum or read, or is not staged before
        ``timeout`` seconds (default: the connector's, 10 s) have passed.
        """
        t = self.timeout if timeout is None else timeout
        if len(dsts) < len(keys):
            raise InvalidArgument(None, f"load: {len(keys)} keys but {len(dsts)} destinations")
        space = self.space
        cached = space.prefix_len(keys)
        before = sum(s.stats().timeouts for s in space.stores)
        n = space.load(request_id, keys, dsts, t)
        timed_out = sum(s.stats().timeouts for s in space.stores) > before
        with self._lock:
            c = self._c
            c["loads"] += 1
            c["loads_short"] += int(n < cached)
            c["load_timeouts"] += int(timed_out)
            c["blocks_loaded"] += n
            c["tokens_loaded"] += n * self.tokens_per_block
        return n * self.tokens_per_block

    def save(self, request_id: object, keys: Any, srcs: Sequence[Any]) -> list[PutStatus]:
        """Writes the request's new blocks (on its device); a status per key."""
        for j, s in enumerate(srcs):
            size = memoryview(s).nbytes if not hasattr(s, "nbytes") else int(s.nbytes)
            if size > self.block_bytes:
                raise InvalidArgument(
                    None, f"save: source {j} has {size} bytes, a block has {self.block_bytes}"
                )
        out = self.space.save(request_id, keys, srcs)
        with self._lock:
            c = self._c
            c["saves"] += 1
            for s in out:
                c[f"saved_{s.name.lower()}"] += 1
        return out

    def finish(self, request_id: object) -> None:
        """The request is over: its next save may be placed on another device."""
        self.space.finish(request_id)

    def stats(self) -> ConnectorStats:
        with self._lock:
            return ConnectorStats(**self._c)
