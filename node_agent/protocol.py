"""Agent -> controller wire format and request signing (stdlib + pydantic only).

Input: fatal events from the agent. Output: ``POST {push_url}`` (controller path
``/v1/agent/events``) with a JSON body ``AgentEventBatch`` and three headers:

* ``X-FleetYield-Node``: the sending node name (must equal ``batch.node``);
* ``X-FleetYield-Timestamp``: unix seconds (integer) when the request was signed;
* ``X-FleetYield-Signature``: ``sha256=<hex HMAC-SHA256(secret, f"{timestamp}.".encode() + body)>``.

The controller imports this module and calls ``verify()``; the agent calls ``sign()``
(through ``signed_headers``). Events carry a uuid4 ``event_id``: receivers must treat a
repeated ``event_id`` as a duplicate (the agent retries undelivered events). The id is also
the replay defence: the signature proves who sent an event, the id that it is new; a request
replayed inside the timestamp window (``max_skew_s``) finds every id seen and writes nothing
(the controller keeps seen ids, fatal or not, for 7 days, longer than any window). No wire
change: every agent already sends unique ids.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

NODE_HEADER = "X-FleetYield-Node"
TIMESTAMP_HEADER = "X-FleetYield-Timestamp"
SIGNATURE_HEADER = "X-FleetYield-Signature"
EVENTS_PATH = "/v1/agent/events"
SIGNATURE_PREFIX = "sha256="

EventKind = Literal["xid", "gpu_missing", "gpu_reset", "check_failed"]


class AgentEvent(BaseModel):
    """One event seen on a node."""

    model_config = ConfigDict(extra="forbid")

    event_id: str = Field(min_length=1, max_length=64)
    time: float
    node: str = Field(min_length=1)
    gpu: int | None = None
    uuid: str | None = None
    kind: EventKind
    xid: int | None = None
    fatal: bool
    message: str = ""


class AgentEventBatch(BaseModel):
    """The body of one push request."""

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1)
    events: list[AgentEvent]


class SignatureError(Exception):
    """A push request failed verification; ``str(err)`` says why."""


def sign(secret: bytes, timestamp: int | str, body: bytes) -> str:
    """Return the ``X-FleetYield-Signature`` value for ``body`` signed at ``timestamp``."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256)
    return SIGNATURE_PREFIX + mac.hexdigest()


def signed_headers(secret: bytes, node: str, timestamp: int, body: bytes) -> dict[str, str]:
    """All headers of a push request (content type included)."""
    return {
        "Content-Type": "application/json",
        NODE_HEADER: node,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }


def verify(
    secret: bytes,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    max_skew_s: float = 300,
) -> AgentEventBatch:
    """Check a push request and return its parsed batch, or raise ``SignatureError``."""
    node, batch = _signed_batch(AgentEventBatch, secret, headers, body, now, max_skew_s)
    for event in batch.events:
        if event.node != node:
            raise SignatureError(
                f"node mismatch: event {event.event_id} is from {event.node!r}, not {node!r}"
            )
    return batch


# --------------------------------------------------------------------------------------------------------
# Job outcomes (agent -> controller) and remote control (controller -> agent): same HMAC scheme
# --------------------------------------------------------------------------------------------------------

OUTCOMES_PATH = "/v1/agent/outcomes"
"""Controller path the agent forwards the Epilog's job-outcome records to (a batch per request)."""

CONTROL_RESET_PATH = "/v1/control/reset"
"""Agent path the controller asks for a GPU reset on (signed; see ``ResetRequest``)."""

RESET_RESEND_WINDOW_S = 600.0
"""The controller sends an unfinished reset intent again (same ``request_id``, so the agent can answer 409
to a repeat) only while the intent is younger than this (slurm_fleetyield/executor.py)."""
RESET_ID_MARGIN_S = 60.0
"""What the agent keeps an id beyond that window: the request's travel and the two clocks' rates."""


def reset_id_memory_s(max_skew_s: float) -> float:
    """How long the agent keeps an executed reset ``request_id`` (node_agent/remote.py): as long as a
    signature it would still accept could replay it (2 x ``max_skew_s``), and past the controller's resend
    window, so a resend of a reset that was done is refused rather than done again. Derived here, in the
    one module both sides import, so neither can be changed without the other."""
    return max(2 * max_skew_s, RESET_RESEND_WINDOW_S + RESET_ID_MARGIN_S)


MAX_OUTCOMES_PER_BATCH = 100


class OutcomeBatch(BaseModel):
    """The body of one outcome forward: the Epilog's records, verbatim (the controller maps them).

    Every record must carry ``job_id`` and name this node (``node``); anything else in it is the Epilog's
    schema (``prolog_epilog/epilog.py``) and is kept whole, so a newer Epilog never breaks an older
    controller.
    """

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1)
    records: list[dict] = Field(max_length=MAX_OUTCOMES_PER_BATCH)


class ResetRequest(BaseModel):
    """``POST /v1/control/reset``: reset ``gpus`` (empty: every GPU) of ``node``.

    ``request_id`` is a single-use nonce: the agent refuses a second request with the same id within the
    signature's validity window (so a captured request cannot be replayed), and the controller logs it.
    """

    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1)
    gpus: list[int] = Field(default_factory=list)
    request_id: str = Field(pattern=r"^[A-Za-z0-9_.:-]{8,128}$")


def verify_signed(
    secret: bytes,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    max_skew_s: float = 300,
) -> str:
    """Check the node/timestamp/signature headers of any signed request; return the node header.

    The same checks as ``verify`` without parsing the body: callers validate their own body model and must
    compare its node with the returned one.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    node = lowered.get(NODE_HEADER.lower())
    timestamp = lowered.get(TIMESTAMP_HEADER.lower())
    signature = lowered.get(SIGNATURE_HEADER.lower())
    if not node:
        raise SignatureError(f"missing {NODE_HEADER} header")
    if not timestamp:
        raise SignatureError(f"missing {TIMESTAMP_HEADER} header")
    if not signature:
        raise SignatureError(f"missing {SIGNATURE_HEADER} header")
    try:
        ts = int(timestamp)
    except ValueError:
        raise SignatureError(f"bad {TIMESTAMP_HEADER} header: {timestamp!r} is not unix seconds") from None
    if abs(now - ts) > max_skew_s:
        raise SignatureError(f"stale timestamp: {ts} is {now - ts:+.0f}s from now (max skew {max_skew_s:g}s)")
    if not signature.startswith(SIGNATURE_PREFIX):
        raise SignatureError(f"bad {SIGNATURE_HEADER} header: expected '{SIGNATURE_PREFIX}<hex>'")
    if not hmac.compare_digest(sign(secret, timestamp, body).encode(), signature.encode()):
        raise SignatureError("bad signature: body, timestamp or secret do not match")
    return node


_SignedBatch = TypeVar("_SignedBatch", AgentEventBatch, OutcomeBatch)


def _signed_batch(
    model: type[_SignedBatch],
    secret: bytes,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    max_skew_s: float,
) -> tuple[str, _SignedBatch]:
    """(node, batch): the signature checked (``verify_signed``), the body parsed as ``model``, and the
    batch's ``node`` the signed one; else ``SignatureError``."""
    node = verify_signed(secret, headers, body, now, max_skew_s)
    try:
        batch = model.model_validate_json(body)
    except ValidationError as exc:
        raise SignatureError(
            f"malformed body: {exc.error_count()} error(s): {exc.errors()[0]['msg']}"
        ) from None
    if batch.node != node:
        raise SignatureError(f"node mismatch: header says {node!r}, body says {batch.node!r}")
    return node, batch


def verify_outcomes(
    secret: bytes, headers: Mapping[str, str], body: bytes, now: float, max_skew_s: float = 300
) -> OutcomeBatch:
    """Check an outcome forward and return its batch, or raise ``SignatureError``."""
    node, batch = _signed_batch(OutcomeBatch, secret, headers, body, now, max_skew_s)
    for record in batch.records:
        if not str(record.get("job_id") or "").strip():
            raise SignatureError("malformed body: an outcome record has no job_id")
        if record.get("node") not in (None, node):
            raise SignatureError(
                f"node mismatch: outcome of job {record.get('job_id')} is from {record.get('node')!r}"
            )
    return batch
