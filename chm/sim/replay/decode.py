"""Decode instances of PD-disaggregated serving: the parameters of their timelines.

After its prefill a request's KV moves from its prefill worker to a decode
worker over the PD path: the prefill worker's own PD link sends it at
``pd_link_Bps``, and the decode node's NIC, shared by every prefill worker,
is one FIFO link of ``decode_nic_Bps``. A transfer leaves its worker when
that worker's PD link is free (``start``); the decode NIC serves the
transfers in the order they leave, each for ``bytes / decode_nic_Bps``
from when the NIC is free (``nic_start``); the transfer ends at
``max(nic_start + bytes / decode_nic_Bps, start + bytes / pd_link_Bps)``:
never faster than its sender's link, and several senders share the NIC's
rate (two 100 Gbps senders at once on a 200 Gbps NIC both end as one alone
would). Its worker's PD link is busy until that end.

The request then queues on its decode worker (``session % workers``, or its
index without a session) in the order its KV arrived, and runs ``tokens``
decode steps of ``step_s`` each, one request at a time (request-level: no
batching across requests). ``step_s < 0`` takes each request's step from the
prefill model: the compute of one token after the prompt
(``PrefillModel.compute_s(1, input_tokens)``), a lower bound on a decode
step (the read of the weights from HBM is not modeled).

:mod:`chm.sim.replay.cxlhm` runs these timelines in its event queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from chm.sim.replay.params import param
from chm.sim.replay.prefill import PrefillModel

__all__ = ["DecodeModel"]


@dataclass(frozen=True)
class DecodeModel:
    """The decode instances and the PD path to them (see the module doc)."""

    workers: int = param(0, "", "decode instances (0: decode not modeled)")
    tokens: int = param(1, "tokens", "decode steps per request (output tokens)")
    step_s: float = param(-1.0, "s", "one decode step (<0: prefill model's one token)")
    pd_link_Bps: float = param(12.5e9, "B/s", "each prefill worker's PD link (100 Gbps)")
    decode_nic_Bps: float = param(25e9, "B/s", "the decode node's NIC, shared (200 Gbps)")

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"DecodeModel: workers must be >= 0, got {self.workers}")
        if self.tokens < 1:
            raise ValueError(f"DecodeModel: tokens must be >= 1, got {self.tokens}")
        if not (self.pd_link_Bps > 0 and self.decode_nic_Bps > 0):
            raise ValueError("DecodeModel: pd_link_Bps and decode_nic_Bps must be > 0")

    def step_time_s(self, prefill: PrefillModel, input_tokens: int) -> float:
        """One decode step of a request of ``input_tokens`` prompt tokens."""
        return self.step_s if self.step_s >= 0 else prefill.compute_s(1, input_tokens)
