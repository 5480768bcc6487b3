"""Every HTTP handler we serve with keep-alive sets TCP_NODELAY.

Replies leave as two writes (headers, then body). With Nagle on, a body smaller than one segment waits
for the client's delayed ACK of the headers: ~40 ms on Linux per request on a kept-alive connection,
which is how Prometheus scrapes. Found on a real 1-GPU H200 node (10 KB exposition, 52 ms p50 per
scrape against 6 ms of work); a 1-GPU fake agent shows the same (44 ms -> 0.5 ms with the fix,
``bench/bench_agent.py --gpus 1``). Timing is a benchmark's job; this pins the setting itself."""

from __future__ import annotations

import socketserver

import pytest

from node_agent.exporter import _Handler
from slurm_fleetyield.adapters import api, ingest


@pytest.mark.parametrize(
    "handler",
    [_Handler, api._handler_for(None), ingest._handler_for(None)],  # type: ignore[arg-type]
    ids=["agent-metrics", "controller-api", "controller-ingest"],
)
def test_keep_alive_handlers_disable_nagle(handler: type) -> None:
    assert issubclass(handler, socketserver.StreamRequestHandler)
    assert handler.protocol_version == "HTTP/1.1"  # keep-alive: where the stall happens
    assert handler.disable_nagle_algorithm is True
