"""Alertmanager's webhook, read as fatal events: parsing, authentication and mapping, no HTTP plumbing.

Input: the headers and body of ``POST /v1/alertmanager`` (Alertmanager webhook payload version 4, sent
with ``Authorization: Bearer <token>`` from ``http_config.authorization.credentials_file``). Output:
``(status, reply, events)``: the HTTP status and JSON reply the listener (``adapters/ingest.py``) sends,
and the ``FatalEvent``s it must store in the durable inbox before replying.

Which alerts act: a FIRING alert labelled ``fleetyield_action="quarantine"`` becomes
``FatalEvent(kind="alert", source="alertmanager")`` for the node named by the first of ``node_labels``
it carries; the core quarantines such an event exactly like a pushed fatal XID. Resolved alerts and
alerts without the label are acknowledged and ignored: recovery is the rehabilitation path's decision,
never an alert's. ``event_id`` is a hash of (fingerprint, startsAt): Alertmanager re-sends a firing alert
on every group_interval/repeat_interval and retries failed deliveries, and every copy maps to the same
id, so the inbox and the core count it once; the same alert firing again later has a new startsAt and
is a new event.

Status codes, chosen knowing Alertmanager retries 5xx (and other errors it deems recoverable) but not
4xx: 401 bad or missing token (retrying cannot help; Alertmanager logs it), 400 malformed payload (the
whole request is refused and nothing is stored, so a bad label on one alert is visible, not half
applied), 413 too large, 200 accepted (including pure duplicates). Storage failures are the listener's:
it answers 503 so Alertmanager retries. A firing alert whose endsAt is already well past is a stale
replay (a captured request sent again): it is acknowledged, counted as ``stale`` and not stored.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slurm_fleetyield.config import ConfigError
from slurm_fleetyield.core.model import FatalEvent

WEBHOOK_PATH = "/v1/alertmanager"
ACTION_LABEL = "fleetyield_action"
QUARANTINE = "quarantine"
DEFAULT_NODE_LABELS = ("node", "Hostname", "hostname")
MAX_ALERTS = 10_000
MAX_LABELS = 256

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_FINGERPRINT = r"^[0-9a-fA-F]{1,64}$"
_ZERO_TIME_BEFORE = 1.0  # Alertmanager writes "no endsAt" as 0001-01-01T00:00:00Z


class WebhookError(ValueError):
    """The payload is not a usable Alertmanager webhook; the message says why (sent back with the 400)."""


_MODEL = ConfigDict(extra="ignore", frozen=True)


class WebhookAlert(BaseModel):
    model_config = _MODEL

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(max_length=MAX_LABELS)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    startsAt: datetime  # the wire's camelCase names, kept so the model reads as the payload does
    endsAt: datetime | None = None
    generatorURL: str = ""
    fingerprint: str = Field(pattern=_FINGERPRINT)


class WebhookPayload(BaseModel):
    """Alertmanager's webhook body, version 4 (alertmanager/notify/webhook)."""

    model_config = _MODEL

    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupKey: str = ""
    truncatedAlerts: int = Field(0, ge=0)
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[WebhookAlert] = Field(max_length=MAX_ALERTS)


def read_token(path: str | Path) -> bytes:
    """The bearer token: file contents without surrounding whitespace (as Alertmanager sends a
    credentials_file). Empty, unreadable, or readable by group/others is a ``ConfigError``."""
    try:
        mode = Path(path).stat().st_mode
        if mode & 0o077:
            raise ConfigError(
                str(path),
                [f"alertmanager.token_file: mode {mode & 0o777:o} is group/world accessible (chmod 600)"],
            )
        token = Path(path).read_bytes().strip()
    except OSError as exc:
        problem = f"alertmanager.token_file: cannot read: {exc.strerror or exc}"
        raise ConfigError(str(path), [problem]) from None
    if not token:
        raise ConfigError(str(path), ["alertmanager.token_file: the token is empty"])
    return token


def bearer_ok(authorization: str | None, token: bytes) -> bool:
    """Constant-time check of ``Authorization: Bearer <token>`` (both sides hashed first, so the
    comparison time does not reveal the token's length either)."""
    if not authorization:
        return False
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    try:
        given = credentials.strip().encode("utf-8")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(hashlib.sha256(given).digest(), hashlib.sha256(token).digest())


def parse_webhook(body: bytes) -> WebhookPayload:
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WebhookError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WebhookError("the payload is not a JSON object")
    try:
        return WebhookPayload.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise WebhookError(f"{where}: {first['msg']} ({exc.error_count()} problem(s))") from None
    except RecursionError:
        raise WebhookError("payload nested too deeply") from None


def event_id(fingerprint: str, starts_at: datetime) -> str:
    """Stable across re-sends and retries of one alert instance; new when the alert fires again."""
    key = f"{fingerprint.lower()}|{starts_at.isoformat()}"
    return "am-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def _int_label(labels: Mapping[str, str], name: str, fp: str) -> int | None:
    raw = labels.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise WebhookError(f"alert {fp}: label {name}={raw!r} is not an integer") from None
    if value < 0:
        raise WebhookError(f"alert {fp}: label {name}={raw!r} is negative")
    return value


@dataclass(frozen=True, slots=True)
class Mapped:
    """What a valid payload means: the events to store and how many alerts were left alone."""

    events: tuple[FatalEvent, ...] = ()
    ignored: int = 0  # resolved, or not a quarantine alert
    stale: int = 0  # firing, but its endsAt is long past: a replayed request


def to_fatal_events(
    payload: WebhookPayload,
    node_labels: Sequence[str] = DEFAULT_NODE_LABELS,
    now: float | None = None,
    stale_after_s: float = 3600.0,
) -> Mapped:
    """Map a validated payload; raise ``WebhookError`` if a quarantine alert cannot be attributed."""
    events: dict[str, FatalEvent] = {}
    ignored = stale = 0
    for alert in payload.alerts:
        labels = alert.labels
        fp = alert.fingerprint
        if alert.status != "firing" or labels.get(ACTION_LABEL) != QUARANTINE:
            ignored += 1
            continue
        node = next((labels[k] for k in node_labels if labels.get(k)), None)
        if node is None:
            raise WebhookError(f"alert {fp}: no node label (looked for {', '.join(node_labels)})")
        if not _NODE_NAME.fullmatch(node):
            raise WebhookError(f"alert {fp}: {node!r} is not a node name")
        gpu = _int_label(labels, "gpu", fp)
        xid = _int_label(labels, "xid", fp)
        ends = alert.endsAt.timestamp() if alert.endsAt is not None else None
        if now is not None and ends is not None and ends > _ZERO_TIME_BEFORE and ends < now - stale_after_s:
            stale += 1
            continue
        name = labels.get("alertname", "alert")
        parts = (name, f"XID {xid}" if xid is not None else "", f"gpu {gpu}" if gpu is not None else "")
        message = " ".join(p for p in parts if p)
        eid = event_id(fp, alert.startsAt)
        events[eid] = FatalEvent(
            event_id=eid,
            node=node,
            time=alert.startsAt.timestamp(),
            kind="alert",
            gpu=gpu,
            uuid=labels.get("UUID") or None,
            xid=xid,
            message=message,
            source="alertmanager",
        )
    return Mapped(tuple(events.values()), ignored, stale)


class AlertmanagerWebhook:
    """The receiver's decision for one request: ``handle(headers, body, now) -> (status, reply, events)``.

    The listener stores ``events`` durably (503 if it cannot, so Alertmanager retries) and then replies.
    """

    def __init__(
        self,
        token: bytes,
        *,
        node_labels: Sequence[str] = DEFAULT_NODE_LABELS,
        max_body_bytes: int = 1 << 20,
        stale_after_s: float = 3600.0,
    ) -> None:
        self.token = token
        self.node_labels = tuple(node_labels)
        self.max_body_bytes = max_body_bytes
        self.stale_after_s = stale_after_s

    def authorized(self, headers: Mapping[str, str]) -> bool:
        lowered = {k.lower(): v for k, v in headers.items()}
        return bearer_ok(lowered.get("authorization"), self.token)

    def handle(
        self, headers: Mapping[str, str], body: bytes, now: float
    ) -> tuple[int, dict, tuple[FatalEvent, ...]]:
        if not self.authorized(headers):
            return 401, {"error": "missing or wrong bearer token"}, ()
        if len(body) > self.max_body_bytes:
            return 413, {"error": f"body of {len(body)} bytes exceeds {self.max_body_bytes}"}, ()
        try:
            mapped = to_fatal_events(parse_webhook(body), self.node_labels, now, self.stale_after_s)
        except WebhookError as exc:
            return 400, {"error": str(exc)}, ()
        reply = {"events": len(mapped.events), "ignored": mapped.ignored, "stale": mapped.stale}
        return 200, reply, mapped.events
