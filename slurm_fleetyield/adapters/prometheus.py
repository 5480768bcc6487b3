"""Sense through Prometheus: the same ``NodeSample``s as the direct scrape, read with fleet-wide queries.

Input: node names (those Slurm lists), a Prometheus base URL, the label that names a series' node
(``Hostname`` as dcgm-exporter and the agent write it, or a target label such as ``node`` set by
relabeling, see contrib/prometheus/README.md) and an optional selector (``job="fleetyield-agent"``).
Output: one ``NodeSample`` per node, GPU readings keyed by DCGM field name, exactly as
``adapters/scrape.py`` builds them from an exposition: same fields, same ``xid_totals`` (the agent's
counter, else dcgm-exporter's windowed count), same ``expected_gpus``, same blank-sentinel rule.

Cost scales with metric families, not nodes: one instant query per family the decision core reads
(``CORE_FIELDS``, derived from ``core/signals.py``) for the whole fleet, plus the two XID families, the
agent's expected-GPU gauge and ``up``/``timestamp(up)``. Node names are batched into one anchored regex
matcher per query (``nodes_per_query`` names each); queries run concurrently and go as POST forms, so a
long regex never hits a URL limit.

Only instant queries: trends (rates over the core's windows) are computed by the core from the history
of raw counters, exactly as on the direct path; handing it Prometheus ``rate()`` values instead would
change the decision code. The shipped recording rules (contrib/prometheus/) compute the same rates for
dashboards and alerts.

Failure is contained like the scrape's: any failed query makes every node's sample an error (a partial
set of families would read as "field not exported" and bias the risk), a node with no series or whose
target is down is an error for that node; the core turns errors into UNKNOWN, never into healthy. The
sample time is the target's last scrape (``timestamp(up)``), so Prometheus lagging behind shows up as a
stale sample, not as fresh data.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from slurm_fleetyield.adapters.dcgm import (
    AGENT_GPUS_EXPECTED,
    AGENT_XID_COUNTER,
    EXPORTER_XID_WINDOW,
    GpuSeries,
    is_blank,
    readings,
)
from slurm_fleetyield.core.model import NodeSample
from slurm_fleetyield.core.signals import COUNTER_CHANNELS, FB_TOTAL, RETIRED_PENDING, SIGNALS

MAX_BODY_BYTES = 64 * 1024 * 1024

CORE_FIELDS: tuple[str, ...] = tuple(
    sorted({*COUNTER_CHANNELS, FB_TOTAL, *(f for s in SIGNALS for f in s.fields)})
)
"""Every DCGM field the decision core reads. Other exported fields never change a decision, so they are
not fetched (``extra_fields`` adds more, e.g. for ``explain`` output)."""

COUNTER_FIELDS = frozenset({*COUNTER_CHANNELS, RETIRED_PENDING})
"""Families dcgm-exporter types as counters: DCGM's int32 blank sentinels are only blanks on gauges (a
cumulative counter may pass 2^31), the rule the scrape applies from the exposition's TYPE line."""

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

Series = dict[str, Any]
"""One element of an instant-vector result: ``{"metric": {labels}, "value": [ts, "v"]}``."""
Query = Callable[[str], list[Series]]
"""``query(promql) -> result vector``; raises ``PrometheusError``. The network seam (tests inject one)."""


class PrometheusError(Exception):
    """A query failed (HTTP, timeout, Prometheus error, unexpected result); the message says which."""


def http_query(base_url: str, timeout_s: float = 10.0, bearer_token: str | None = None) -> Query:
    """The real ``Query``: POST ``/api/v1/query`` (form-encoded), instant vector results only."""
    endpoint = base_url.rstrip("/") + "/api/v1/query"

    def query(promql: str) -> list[Series]:
        data = urllib.parse.urlencode({"query": promql}).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        if bearer_token:
            headers["Authorization"] = f"Bearer {bearer_token}"
        request = urllib.request.Request(endpoint, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                body = response.read(MAX_BODY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = _error_text(exc.read(4096))
            raise PrometheusError(f"HTTP {exc.code} for {promql!r}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(f"cannot reach {endpoint}: {reason}") from None
        if len(body) > MAX_BODY_BYTES:
            raise PrometheusError(f"answer to {promql!r} larger than {MAX_BODY_BYTES} bytes")
        return parse_response(body, promql)

    return query


def _error_text(body: bytes) -> str:
    try:
        doc = json.loads(body)
        return f"{doc.get('errorType', '')}: {doc.get('error', '')}"
    except (ValueError, AttributeError):
        return body.decode("utf-8", "replace")[:200]


def parse_response(body: bytes, promql: str = "") -> list[Series]:
    """The result vector of an instant query's JSON answer; anything else is a ``PrometheusError``."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise PrometheusError(f"answer to {promql!r} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise PrometheusError(f"query {promql!r} failed: {_error_text(body)}")
    data = doc.get("data")
    if (
        not isinstance(data, dict)
        or data.get("resultType") != "vector"
        or not isinstance(data.get("result"), list)
    ):
        raise PrometheusError(f"query {promql!r} did not return an instant vector")
    return data["result"]


def node_regex(nodes: Sequence[str]) -> str:
    """An RE2 alternation matching exactly these names (Prometheus anchors label regexes)."""
    return "|".join(re.escape(n) for n in sorted(nodes))


def _quote(value: str) -> str:
    return json.dumps(value)  # PromQL string literals accept JSON's escapes


@dataclass
class _Node:
    gpus: dict[int, GpuSeries] = field(default_factory=dict)
    expected: int | None = None
    agent: bool = False
    time: float | None = None
    down: list[str] = field(default_factory=list)
    bad: str | None = None  # a malformed series: the whole node is an error, as a malformed exposition


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """One query of a sense round: what it reads (``family``) and its PromQL."""

    family: str
    promql: str


class PrometheusSense:
    """``SensePort`` over the Prometheus HTTP API (see the module docstring)."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:9090",
        *,
        node_label: str = "Hostname",
        selector: str = "",
        extra_fields: Sequence[str] = (),
        timeout_s: float = 10.0,
        nodes_per_query: int = 5000,
        concurrency: int = 8,
        bearer_token: str | None = None,
        query: Query | None = None,
    ) -> None:
        if not _LABEL_NAME.fullmatch(node_label):
            raise ValueError(f"node_label must be a Prometheus label name, got {node_label!r}")
        self.node_label = node_label
        self.selector = selector.strip().strip("{}").strip().rstrip(",")
        self.fields = tuple(sorted({*CORE_FIELDS, *extra_fields}))
        self.nodes_per_query = nodes_per_query
        self._query = query or http_query(url, timeout_s, bearer_token)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="fy-promql")

    # -- planning -------------------------------------------------------------------------------------

    def _matchers(self, *parts: str) -> str:
        used = [p for p in (*parts, self.selector) if p]
        return "{" + ", ".join(used) + "}" if used else ""

    def plan(self, nodes: Sequence[str]) -> list[PlannedQuery]:
        """Every query of one round: per family, one per batch of ``nodes_per_query`` node names."""
        names = sorted(set(nodes))
        batches = [names[i : i + self.nodes_per_query] for i in range(0, len(names), self.nodes_per_query)]
        out: list[PlannedQuery] = []
        for family in (*self.fields, AGENT_XID_COUNTER, EXPORTER_XID_WINDOW):
            for batch in batches:
                node_matcher = f"{self.node_label}=~{_quote(node_regex(batch))}"
                out.append(PlannedQuery(family, family + self._matchers(node_matcher)))
        # One series per target: fetched for the whole selection and attributed to nodes here, since
        # without a node target label they carry only instance/job (mapped through the GPU series).
        out.append(PlannedQuery(AGENT_GPUS_EXPECTED, AGENT_GPUS_EXPECTED + self._matchers()))
        out.append(PlannedQuery("up", "up" + self._matchers()))
        out.append(PlannedQuery("timestamp", f"timestamp(up{self._matchers()})"))
        return out

    # -- one round ------------------------------------------------------------------------------------

    def sample(self, nodes: Sequence[str], now: float) -> Mapping[str, NodeSample]:
        if not nodes:
            return {}
        planned = self.plan(nodes)
        try:
            answers = list(self._pool.map(lambda q: self._query(q.promql), planned))
        except Exception as exc:  # contained: Prometheus down is every node's UNKNOWN, never the tick's
            reason = str(exc) if isinstance(exc, PrometheusError) else f"{type(exc).__name__}: {exc}"
            return {n: NodeSample(node=n, time=now, error=f"prometheus: {reason}") for n in nodes}
        return self.assemble(nodes, now, zip(planned, answers, strict=True))

    def assemble(
        self, nodes: Sequence[str], now: float, answers: Iterable[tuple[PlannedQuery, list[Series]]]
    ) -> dict[str, NodeSample]:
        """Fold query answers into NodeSamples (pure: tests feed it recorded answers)."""
        wanted = set(nodes)
        state: dict[str, _Node] = {}
        by_target: dict[tuple[str, str], str] = {}  # (job, instance) -> node, from node-labelled series
        deferred: list[tuple[str, Series]] = []
        for q, result in answers:
            for series in result:
                labels = series.get("metric") or {}
                node = labels.get(self.node_label)
                if node:
                    by_target.setdefault((labels.get("job", ""), labels.get("instance", "")), node)
                if q.family in (AGENT_GPUS_EXPECTED, "up", "timestamp"):
                    deferred.append((q.family, series))
                elif node in wanted:
                    self._gpu_series(state.setdefault(node, _Node()), q.family, labels, series)
        for family, series in deferred:
            labels = series.get("metric") or {}
            target = (labels.get("job", ""), labels.get("instance", ""))
            node = labels.get(self.node_label) or by_target.get(target)
            if node not in wanted:
                continue
            value = _value(series)
            n = state.setdefault(node, _Node())
            if family == AGENT_GPUS_EXPECTED:
                n.agent = True
                if value is not None and not is_blank(value, gauge=True):
                    n.expected = int(value)
            elif family == "up" and value == 0:
                n.down.append(labels.get("instance", "?"))
            elif family == "timestamp" and value is not None:
                n.time = value if n.time is None else min(n.time, value)
        return {name: self._node_sample(name, state.get(name), now) for name in nodes}

    def _gpu_series(self, n: _Node, family: str, labels: Mapping[str, str], series: Series) -> None:
        value = _value(series)
        try:
            index = int(labels.get("gpu", ""))
        except ValueError:
            n.bad = n.bad or f"{family} has gpu={labels.get('gpu')!r}"
            return
        if value is None:
            n.bad = n.bad or f"{family} has no numeric value"
            return
        gpu = n.gpus.setdefault(index, GpuSeries(index))
        gpu.identify(labels)
        if family in (AGENT_XID_COUNTER, EXPORTER_XID_WINDOW):
            if family == AGENT_XID_COUNTER:
                n.agent = True
            xid = labels.get("xid", "")
            if not xid or xid == "0" or is_blank(value, gauge=False):
                return  # dcgm-exporter's per-GPU zero series carries no xid label
            try:
                code = int(xid)
            except ValueError:
                n.bad = n.bad or f"{family} has xid={xid!r}"
                return
            gpu.count_xid(family, code, value)
        elif not is_blank(value, gauge=family not in COUNTER_FIELDS):
            gpu.fields[family] = value

    def _node_sample(self, name: str, n: _Node | None, now: float) -> NodeSample:
        if n is None or (not n.gpus and n.expected is None):
            return NodeSample(
                node=name, time=now, error=f"no series in Prometheus with {self.node_label}={name!r}"
            )
        if n.down:
            return NodeSample(
                node=name, time=now, error=f"Prometheus target down: {', '.join(sorted(n.down))}"
            )
        if n.bad:
            return NodeSample(node=name, time=now, error=f"malformed series: {n.bad}")
        return NodeSample(
            node=name,
            time=n.time if n.time is not None else now,
            gpus=readings(n.gpus.values(), n.agent),
            expected_gpus=n.expected,
            source="prometheus",
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _value(series: Series) -> float | None:
    try:
        return float(series["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
