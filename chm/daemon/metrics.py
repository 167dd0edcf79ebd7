"""The daemon's Prometheus endpoint (prometheus_client), loopback only, off by default.

Exports the device counters, the KV store counters, what clients hold, the
clients' staging queues (``chm_kv_staging_*``: what they skipped and hold,
from their KV_STAGING reports), a remote storage node's health
(``chm_node_*``: Master reachable, epoch, lease left, entries published,
TCP clients), and a latency histogram of the daemon's requests by op.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["Metrics", "parse_listen"]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` with a loopback HOST (ValueError otherwise)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: port {int(port)} is not in 0..65535")
    host = host.strip("[]") or "127.0.0.1"
    try:
        loop = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loop = host == "localhost"
    if not loop:
        raise ValueError(f"{text!r}: the metrics endpoint listens on loopback only")
    return host, int(port)


# the clients' staging queues (KV_STAGING reports): chm_kv_staging_skipped_total, ...
_PREFIX = {"staging": "kv_staging"}


class _Collector(Collector):
    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        s = self.stats()
        for group in ("device", "kv", "held", "daemon", "staging", "node"):
            prefix = _PREFIX.get(group, group)
            for k, v in (s.get(group) or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    yield GaugeMetricFamily(f"chm_{prefix}_{k}", f"chm {prefix} {k}", value=v)


class Metrics:
    """The endpoint's registry: a latency histogram, and gauges read from
    ``stats()`` (the daemon's STATS answer) at each scrape."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "chm_request_seconds",
            "daemon request latency by op",
            ["op"],
            registry=self.registry,
            buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0),
        )
        self.registry.register(_Collector(stats))
        self._server: Any = None
        self.address: tuple[str, int] | None = None

    def observe(self, op: str, seconds: float) -> None:
        self.latency.labels(op).observe(seconds)

    def serve(self, listen: str) -> None:
        host, port = parse_listen(listen)
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.address = (host, self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
