"""Requests the agent refused for want of authentication, counted for ``/metrics``.

Input: ``(endpoint, reason)`` from the HTTP listener's basic auth (``BoundedHTTPServer.on_unauthorized``:
``metrics``, ``basic_auth``, the 401 of a web-config file's ``basic_auth_users``) and from the signed reset
(``remote.ResetEndpoint``: ``reset``, ``bad_signature`` for its 401, a missing, stale or forged signature,
and ``wrong_node`` for its 403, a request signed for another node) and from the control socket
(``control.ControlServer``: ``control``, ``peer_uid``, a local caller neither root nor the agent's uid).
Output:
``fleetyield_agent_unauthenticated_requests_total{endpoint, reason}``, read at scrape time (the Collector
protocol), the agent's counterpart of the controller's ``fleetyield_unauthenticated_requests_total``. A
refused request changes nothing on the node: this counter is the only trace a flood of them leaves, so an
alert can see one. The known pairs are exported from 0, so ``rate()`` has a series before the first refusal.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, Metric

METRIC = "fleetyield_agent_unauthenticated_requests"
KNOWN = (
    ("metrics", "basic_auth"),
    ("reset", "bad_signature"),
    ("reset", "wrong_node"),
    ("control", "peer_uid"),
)


class Unauthenticated:
    """Counts by ``(endpoint, reason)``, safe to bump from any listener thread; a collector of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = dict.fromkeys(KNOWN, 0)

    def add(self, endpoint: str, reason: str) -> None:
        with self._lock:
            self._counts[(endpoint, reason)] = self._counts.get((endpoint, reason), 0) + 1

    def read(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def describe(self) -> Iterable[Metric]:
        return []  # no collect() at register time

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            METRIC,
            "Requests refused for want of authentication (metrics: basic_auth; reset: bad_signature, "
            "wrong_node; control: peer_uid). A refused request changes nothing on the node.",
            labels=["endpoint", "reason"],
        )
        for (endpoint, reason), n in sorted(self.read().items()):
            family.add_metric([endpoint, reason], n)
        yield family
