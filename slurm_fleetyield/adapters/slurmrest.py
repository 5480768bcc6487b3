"""Slurm through slurmrestd (JWT auth): read nodes and jobs, execute a plan.

Input: slurmrestd's OpenAPI (``/openapi/v3`` tells which plugin versions the server offers; the highest
``/slurm/vX.Y.Z`` with nodes and jobs is used), a JWT read from a file (re-read when the file changes,
never logged) and a ``SlurmCli`` for what the served API lacks. Output: the same ``SlurmNode`` /
``JobView`` values and ``ApplyReport`` as the CLI adapter.

What goes over REST: reads always; node updates (features, weight, drain, resume) where the server offers
``POST /slurm/vX/node/{node_name}`` (v0.0.39+, Slurm 23.02+); requeue where it offers a requeue path. Slurm
22.05 serves up to v0.0.38, which has neither: those actions fall back to the CLI's own commands (logged
once, when the version is negotiated). Canaries, reboots, signals and accounting always go through the CLI.

Why this module imports the CLI adapter: both speak Slurm's own formats (22.05's REST answers are the same
data_parser output as ``squeue --json``), so the parsing and hostlist helpers are shared, not copied.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from slurm_fleetyield.adapters.slurm import (
    NOT_SLURM_KINDS,
    JobAttempt,
    NodeDetail,
    SlurmCli,
    SlurmCommandError,
    job_views,
    parse_jobs_json,
    parse_nodes_json,
)
from slurm_fleetyield.core.model import CanaryResult, JobView, SlurmNode
from slurm_fleetyield.core.plan import Action, DrainNode, Plan, RequeueJobs, ResumeNode, UpdateNodes
from slurm_fleetyield.ports import ActionResult, ApplyReport

log = logging.getLogger(__name__)

_SLURM_PATH = re.compile(r"^/slurm/v(\d+)\.(\d+)\.(\d+)/")
KNOWN_VERSIONS = ((0, 0, 41), (0, 0, 40), (0, 0, 39), (0, 0, 38), (0, 0, 37))
"""Probed with ``/ping`` (newest first) when the server serves no OpenAPI document."""
NUMBER_OBJECTS_SINCE = (0, 0, 40)
"""From v0.0.40 on, integers in requests are ``{"set": true, "number": N}`` objects."""


class SlurmRestError(SlurmCommandError):
    """An HTTP or API error from slurmrestd; ``command`` is (method, endpoint)."""

    def __init__(self, method: str, endpoint: str, status: int | None, message: str) -> None:
        super().__init__((method, endpoint), status, message)
        self.endpoint = endpoint
        self.status = status

    def __str__(self) -> str:
        status = f"HTTP {self.status}" if self.status is not None else "no answer"
        return f"slurmrestd {self.command[0]} {self.endpoint}: {status}: {self.stderr}"


class TokenFile:
    """The JWT in ``path`` (``scontrol token`` output or the bare token), re-read when the file changes.

    A token file that group or others may read is refused, as the push secret is (config.read_secret): a
    JWT for the controller's Slurm user is that user's password to slurmrestd."""

    def __init__(self, path: str, field: str = "slurm.rest_token_file") -> None:
        self.path = path
        self.field = field
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""

    def get(self) -> str:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if st.st_mode & 0o077:
                raise SlurmRestError(
                    "READ",
                    self.path,
                    None,
                    f"{self.field}: mode {st.st_mode & 0o777:o} is group/world accessible (chmod 600)",
                )
            if stamp != self._stamp:
                with open(self.path, encoding="utf-8") as fh:
                    text = fh.read().strip()
                self._token = text.removeprefix("SLURM_JWT=").strip()
                self._stamp = stamp
        except OSError as exc:
            raise SlurmRestError(
                "READ", self.path, None, f"{self.field}: cannot read: {exc.strerror}"
            ) from None
        if not self._token:
            raise SlurmRestError("READ", self.path, None, f"{self.field}: the token file is empty")
        return self._token


@dataclass(frozen=True, slots=True)
class ServedApi:
    """What the server offers, from its OpenAPI paths."""

    version: tuple[int, int, int]
    node_update: bool = False
    requeue_path: str | None = None  # e.g. "/slurm/v0.0.4x/job/{job_id}/requeue" where a server has one

    @property
    def prefix(self) -> str:
        return "/slurm/v{}.{}.{}".format(*self.version)


def negotiate(paths: Mapping[str, Mapping[str, Any]]) -> ServedApi:
    """OpenAPI ``paths`` -> the slurm plugin version to use, and its write paths: the newest version this
    adapter knows (``KNOWN_VERSIONS``) that serves nodes and jobs, else the newest that does (a later
    Slurm; logged). Paths compare without a trailing slash: 22.05 writes ``/slurm/v0.0.38/nodes``, 24.11
    ``/slurm/v0.0.41/nodes/`` (both answer either)."""
    served = {p.rstrip("/"): ops for p, ops in paths.items()}
    versions: set[tuple[int, int, int]] = set()
    for path in served:
        m = _SLURM_PATH.match(path + "/")
        if m:
            versions.add((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    usable = [
        v
        for v in sorted(versions, reverse=True)
        if {"/slurm/v{}.{}.{}/nodes".format(*v), "/slurm/v{}.{}.{}/jobs".format(*v)} <= served.keys()
    ]
    if not usable:
        raise ValueError(
            f"no /slurm/vX.Y.Z/nodes and /jobs in the served OpenAPI (versions {sorted(versions)})"
        )
    known = [v for v in usable if v in KNOWN_VERSIONS]
    version = known[0] if known else usable[0]
    if not known:
        log.warning(
            "slurmrestd serves none of the API versions this adapter was tested on; using %s", version
        )
    prefix = "/slurm/v{}.{}.{}".format(*version)
    node = served.get(f"{prefix}/node/{{node_name}}", {})
    requeue = next(
        (p for p, ops in served.items() if p.startswith(prefix) and p.endswith("/requeue") and "post" in ops),
        None,
    )
    return ServedApi(version, node_update="post" in node, requeue_path=requeue)


def ping_states(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(hostname, state) per slurmctld of a ``/ping`` answer: ``"pinged"`` from v0.0.40, ``"ping"`` before."""
    return [
        (str(p.get("hostname", "?")), str(p.get("pinged", p.get("ping", "?"))))
        for p in doc.get("pings") or []
        if isinstance(p, dict)
    ]


def api_errors(doc: object) -> str:
    """The ``errors`` array of an answer as one line ('' when none): each error's description, then
    Slurm's error text where it says something else ("Failure to query nodes: Protocol authentication
    error"), then its source."""
    if not isinstance(doc, dict):
        return ""
    parts = []
    for err in doc.get("errors") or ():
        if isinstance(err, dict):
            said = [str(t) for t in (err.get("description"), err.get("error")) if t]
            text = ": ".join(dict.fromkeys(said)) or json.dumps(err)
            source = err.get("source")
            parts.append(f"{text} ({source})" if source else text)
        else:
            parts.append(str(err))
    return "; ".join(parts)


def normalize_nodes(doc: Mapping[str, Any]) -> dict[str, Any]:
    """v0.0.38 nodes (``state`` a word, ``state_flags`` apart) -> the v0.0.40 shape of parse_nodes_json."""
    nodes = []
    for raw in doc.get("nodes", []):
        raw = dict(raw)
        state = raw.get("state", [])
        if isinstance(state, str):
            state = [state.upper(), *(str(f).upper() for f in raw.get("state_flags") or ())]
        raw["state"] = state
        nodes.append(raw)
    return {"nodes": nodes}


def _number(value: int, version: tuple[int, int, int]) -> object:
    return {"set": True, "infinite": False, "number": value} if version >= NUMBER_OBJECTS_SINCE else value


class SlurmRest:
    """``SlurmPort`` over slurmrestd; ``cli`` runs what the served API cannot (see the module docstring)."""

    def __init__(
        self,
        url: str,
        user: str,
        token: TokenFile,
        cli: SlurmCli,
        timeout_s: float = 30.0,
        retries: int = 3,
        session: requests.Session | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.user = user
        self.token = token
        self.cli = cli
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        retry = Retry(
            total=retries,
            connect=retries,
            read=retries,
            status=retries,
            backoff_factor=0.2,
            status_forcelist=(502, 503, 504),
            allowed_methods=frozenset({"GET"}),
            raise_on_status=False,
        )
        self.session.mount("http://", HTTPAdapter(max_retries=retry))
        self.session.mount("https://", HTTPAdapter(max_retries=retry))
        self._api: ServedApi | None = None
        self.calls = 0
        self.node_details: dict[str, NodeDetail] = {}

    # -- plumbing -------------------------------------------------------------------------------------

    def request(self, method: str, endpoint: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self.token.get()}
        self.calls += 1
        try:
            resp = self.session.request(
                method, self.url + endpoint, headers=headers, json=body, timeout=self.timeout_s
            )
        except requests.RequestException as exc:
            raise SlurmRestError(method, endpoint, None, type(exc).__name__ + ": " + str(exc)) from None
        try:
            doc = resp.json()
        except ValueError:
            doc = None
        errors = api_errors(doc)
        if resp.status_code >= 400 or errors:
            text = errors or resp.text.strip()[:300] or resp.reason
            raise SlurmRestError(method, endpoint, resp.status_code, text)
        if not isinstance(doc, dict):
            raise SlurmRestError(method, endpoint, resp.status_code, "the answer is not a JSON object")
        return doc

    def api(self) -> ServedApi:
        if self._api is None:
            try:
                self._api = negotiate(self.request("GET", "/openapi/v3").get("paths", {}))
            except (SlurmRestError, ValueError) as exc:
                log.info("no usable /openapi/v3 (%s); probing ping endpoints", exc)
                self._api = self._probe()
            missing = [
                w
                for w, ok in (("node update", self._api.node_update), ("requeue", self._api.requeue_path))
                if not ok
            ]
            log.info(
                "slurmrestd %s: using %s%s",
                self.url,
                self._api.prefix,
                f"; {' and '.join(missing)} through scontrol (not in this API)" if missing else "",
            )
        return self._api

    def _probe(self) -> ServedApi:
        last: Exception | None = None
        for version in KNOWN_VERSIONS:
            api = ServedApi(version)
            try:
                self.request("GET", f"{api.prefix}/ping")
                return api
            except SlurmRestError as exc:
                last = exc
        raise SlurmRestError("GET", "/slurm/vX/ping", None, f"no known API version answered ({last})")

    def ping(self) -> dict[str, Any]:
        """``/ping``; an error unless some slurmctld answered UP. 24.11 (v0.0.41) answers HTTP 200 with
        ``"pinged": "DOWN"`` when slurmctld refuses the JWT; 22.05 (v0.0.38: ``"ping"``) answers 500."""
        endpoint = f"{self.api().prefix}/ping"
        doc = self.request("GET", endpoint)
        states = ping_states(doc)
        if not any(st == "UP" for _, st in states):
            seen = ", ".join(f"{host} {st}" for host, st in states)
            raise SlurmRestError(
                "GET",
                endpoint,
                200,
                f"no slurmctld answered UP ({seen or 'no pings'}): slurmctld down, or it refused the token",
            )
        return doc

    # -- reads ----------------------------------------------------------------------------------------

    def read_nodes(self) -> Mapping[str, SlurmNode]:
        endpoint = f"{self.api().prefix}/nodes"
        doc = self.request("GET", endpoint)
        try:
            parsed = parse_nodes_json(json.dumps(normalize_nodes(doc)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SlurmRestError("GET", endpoint, 200, f"unparsable answer: {exc}") from None
        self.node_details = {name: detail for name, (_, detail) in parsed.items()}
        return {name: node for name, (node, _) in parsed.items()}

    def read_jobs(self) -> Sequence[JobView]:
        endpoint = f"{self.api().prefix}/jobs"
        doc = self.request("GET", endpoint)
        try:
            raw = parse_jobs_json(json.dumps({"jobs": doc.get("jobs", [])}))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SlurmRestError("GET", endpoint, 200, f"unparsable answer: {exc}") from None
        return job_views(raw, self.cli.expand_hostlists(j.nodelist for j in raw))

    # -- writes ---------------------------------------------------------------------------------------

    def requests_for(self, action: Action) -> list[tuple[str, str, dict[str, Any]]] | None:
        """The REST calls (method, endpoint, body) executing ``action``, or None: the CLI runs it."""
        api = self.api()
        node_path = f"{api.prefix}/node/{{}}"
        if isinstance(action, UpdateNodes) and api.node_update:
            features = list(action.features)
            body = {
                "features": features,
                "features_act": features,
                "weight": _number(action.weight, api.version),
            }
            return [("POST", node_path.format(n), body) for n in action.nodes]
        if (
            isinstance(action, DrainNode)
            and api.node_update
            and (api.requeue_path or not action.requeue_jobs)
        ):
            calls = [("POST", node_path.format(action.node), {"state": ["DRAIN"], "reason": action.reason})]
            return calls + self._requeue_calls(api, action.requeue_jobs)
        if isinstance(action, ResumeNode) and api.node_update:
            return [("POST", node_path.format(action.node), {"state": ["RESUME"]})]
        if isinstance(action, RequeueJobs) and api.requeue_path:
            return self._requeue_calls(api, action.jobs)
        return None

    @staticmethod
    def _requeue_calls(api: ServedApi, jobs: Sequence[int]) -> list[tuple[str, str, dict[str, Any]]]:
        path = api.requeue_path or ""
        return [("POST", path.replace("{job_id}", str(j)), {}) for j in jobs]

    def commands_for(self, action: Action, hostlist: str | None = None) -> list[tuple[str, ...]]:
        """What ``apply`` would do, as printable commands (dry-run): REST calls or the CLI's commands."""
        calls = self.requests_for(action)
        if calls is None:
            return self.cli.commands_for(action, hostlist)
        return [(method, endpoint, json.dumps(body, sort_keys=True)) for method, endpoint, body in calls]

    def apply(self, plan: Plan) -> ApplyReport:
        """Execute every action in order, REST where the served API can, else the CLI; a failure is recorded
        and the next action still runs."""
        start_calls = self.calls + self.cli.calls
        results: list[ActionResult] = []
        for action in plan.actions:
            if action.kind in NOT_SLURM_KINDS:
                continue
            try:
                calls = self.requests_for(action)
            except SlurmCommandError as exc:
                results.append(ActionResult(action, False, exc.command, str(exc)))
                continue
            if calls is None:
                results.extend(self.cli.apply(Plan(actions=(action,))).results)
                continue
            executed: tuple[str, ...] = ()
            try:
                for method, endpoint, body in calls:
                    executed = (method, endpoint)
                    self.request(method, endpoint, body)
                results.append(ActionResult(action, True, executed))
            except SlurmCommandError as exc:
                log.error("slurm action failed: %s", exc)
                results.append(ActionResult(action, False, exc.command, str(exc)))
        return ApplyReport(tuple(results), calls=self.calls + self.cli.calls - start_calls)

    # -- what only the CLI does -----------------------------------------------------------------------

    def read_canaries(self, tokens: Mapping[str, str], since: float) -> list[CanaryResult]:
        return self.cli.read_canaries(tokens, since)

    def read_job_attempts(self, job_ids: Sequence[int]) -> dict[int, list[JobAttempt]]:
        return self.cli.read_job_attempts(job_ids)

    def expand_hostlists(self, expressions: Iterable[str]) -> dict[str, tuple[str, ...]]:
        return self.cli.expand_hostlists(expressions)

    def compress_hostlist(self, nodes: Sequence[str]) -> str:
        return self.cli.compress_hostlist(nodes)

    @property
    def canary(self):  # type: ignore[no-untyped-def]
        return self.cli.canary

    def version(self) -> tuple[int, int, int]:
        return self.cli.version()
