"""Sense by scraping each node's exporter directly: FleetYield's agent or a stock dcgm-exporter.

Input: node names (those Slurm lists) and a URL template (``http://{node}:9400/metrics``). Output: one
``NodeSample`` per node, GPU readings keyed by DCGM field name. A failed scrape (timeout, refused
connection, HTTP error, malformed exposition, wrong host) is a ``NodeSample`` with ``error`` set and no
readings: it never raises into the tick, and the core turns it into UNKNOWN, never into "healthy".

Translation only: DCGM's blank-value sentinels are dropped (a blank is "no value", not a 9.2e18 degree
GPU); which readings matter and how much is the core's business.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from prometheus_client.parser import text_string_to_metric_families

from node_agent.httpclient import HttpClient, urlopen
from slurm_fleetyield.adapters.dcgm import (
    AGENT_GPUS_EXPECTED,
    AGENT_XID_COUNTER,
    EXPORTER_XID_WINDOW,
    GpuSeries,
    is_blank,
    readings,
)
from slurm_fleetyield.core.model import NodeSample

FIELD_PREFIX = "DCGM_FI_"
HOSTNAME_LABELS = ("Hostname", "hostname")
MAX_BODY_BYTES = 16 * 1024 * 1024

Fetch = Callable[[str, float], bytes]
"""``fetch(url, timeout_s) -> body``; raises on any failure. The network seam (tests may inject one)."""


class ScrapeError(Exception):
    """An exposition that cannot be read as GPU telemetry; the message names what is wrong."""


def fetch_url(url: str, timeout_s: float, client: HttpClient | None = None) -> bytes:
    """GET ``url``, with ``client``'s basic auth and TLS (``sense.basic_auth``, ``sense.tls_config``)."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4"})
    with urlopen(request, timeout_s, client) as response:
        body = response.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError(f"exposition larger than {MAX_BODY_BYTES} bytes")
    return body


def parse_exposition(text: str, node: str, now: float, expect_hostname: str | None = None) -> NodeSample:
    """Turn one exposition into a NodeSample; raise ``ScrapeError`` for anything unusable.

    ``expect_hostname``: when set, every GPU's Hostname/hostname label must name this host (short names,
    case-insensitive): a DNS or port mix-up must not pin one node's GPUs on another.
    """
    gpus: dict[int, GpuSeries] = {}
    expected: int | None = None
    agent = False
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on bad input
        raise ScrapeError(f"malformed exposition: {exc}") from None
    for family in families:
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name.startswith(FIELD_PREFIX) and name.endswith("_total"):
                # prometheus_client appends "_total" to counter samples; DCGM names never end in lowercase
                name = name[: -len("_total")]
            if name == AGENT_GPUS_EXPECTED:
                agent = True
                if not is_blank(value, gauge=True):
                    expected = int(value)
                continue
            if name.startswith("fleetyield_"):
                agent = True
            if "gpu" not in labels or not (
                name.startswith(FIELD_PREFIX) or name in (AGENT_XID_COUNTER, EXPORTER_XID_WINDOW)
            ):
                continue
            try:
                index = int(labels["gpu"])
            except ValueError:
                raise ScrapeError(f"malformed exposition: {name} has gpu={labels['gpu']!r}") from None
            gpu = gpus.setdefault(index, GpuSeries(index))
            gpu.identify(labels)
            gpu.hostname = gpu.hostname or next((labels[k] for k in HOSTNAME_LABELS if labels.get(k)), "")
            if name in (AGENT_XID_COUNTER, EXPORTER_XID_WINDOW):
                xid = labels.get("xid", "")
                if not xid or xid == "0" or is_blank(value, gauge=False):
                    continue  # dcgm-exporter's per-GPU zero series carries no xid label
                try:
                    code = int(xid)
                except ValueError:
                    raise ScrapeError(f"malformed exposition: {name} has xid={xid!r}") from None
                gpu.count_xid(name, code, value)
            elif not is_blank(value, gauge=family.type == "gauge"):
                gpu.fields[name] = value
    if expect_hostname:
        want = expect_hostname.split(".", 1)[0].lower()
        for gpu in gpus.values():
            got = gpu.hostname.split(".", 1)[0].lower()
            if got and got != want:
                raise ScrapeError(
                    f"hostname mismatch: scraped {expect_hostname!r}, exporter says {gpu.hostname!r}"
                )
    return NodeSample(
        node=node,
        time=now,
        gpus=readings(gpus.values(), agent),
        expected_gpus=expected,
        source="agent" if agent else "dcgm-exporter",
    )


def describe_error(exc: BaseException) -> str:
    """A short operator-facing reason for a failed scrape."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return "timed out"
        return f"connection failed: {reason}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ScrapeError):
        return str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return "malformed exposition: not UTF-8"
    return f"{type(exc).__name__}: {exc}"


class AgentScraper:
    """``SensePort`` over HTTP: GET every node's metrics concurrently, each with its own timeout."""

    def __init__(
        self,
        url_template: str = "http://{node}:9400/metrics",
        timeout_s: float = 5.0,
        concurrency: int = 64,
        check_hostname: bool = False,
        fetch: Fetch | None = None,
        client: HttpClient | None = None,
    ) -> None:
        """``client``: how to authenticate to agents served with a web-config file; ``fetch`` replaces
        the network altogether (tests)."""
        self._url_template = url_template
        self._timeout_s = timeout_s
        self._check_hostname = check_hostname
        self._fetch: Fetch = fetch or partial(fetch_url, client=client)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fy-scrape")

    def url_for(self, node: str) -> str:
        return self._url_template.format(node=node)

    def sample_one(self, node: str, now: float) -> NodeSample:
        try:
            body = self._fetch(self.url_for(node), self._timeout_s)
            return parse_exposition(
                body.decode("utf-8"), node, now, expect_hostname=node if self._check_hostname else None
            )
        except Exception as exc:  # contained: one node's failure is that node's UNKNOWN, never the tick's
            return NodeSample(node=node, time=now, error=describe_error(exc))

    def sample(self, nodes: Sequence[str], now: float) -> Mapping[str, NodeSample]:
        return dict(zip(nodes, self._pool.map(lambda n: self.sample_one(n, now), nodes), strict=True))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
