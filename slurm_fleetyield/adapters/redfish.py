"""Node power through its BMC, over Redfish (the sushy client library).

Input: a ``RedfishConfig`` (node -> BMC address, system, credentials file), a safety callback, an audit log,
a fleet-wide token bucket, injected clocks. Output: ``BmcStatus`` reads (power state, health) and power
actions (ForceRestart, GracefulRestart, power cycle = ForceOff, wait Off, dwell, On, wait On; power off; power
on) that either complete or raise a typed ``BmcError`` / ``PowerRefused`` naming the node and the operation.
``RedfishExecutor`` turns the lifecycle's ``PowerCycle`` action into an ``ActionResult`` like every other
executor.

Why a hung node needs this: ``scontrol reboot`` runs the RebootProgram through the node's own slurmd, which a
node whose GPU fell off the bus (XID 79) or whose kernel is wedged cannot do. The BMC is a separate computer
on the board, reachable from the controller host even when the OS is gone.

Order of every power action (``PowerController.act``):
1. safety: the callback's ``SafetyContext`` (read fresh, just before acting) must allow it: destructive
   operations need no running jobs and a node drained by us, or a quarantined node (its jobs are lost
   anyway), or a Slurm-initiated request (RebootProgram / SuspendProgram: Slurm waited for idle); and the
   drain cap (a node not already counted as drained needs room under the cap);
2. the fleet-wide token bucket (``bmc_ratelimit``): beyond it the action is refused, logged and audited;
3. an audit entry ``power_action`` result ``started`` (fails closed: no audit, no action);
4. the BMC calls, with bounded retries and exponential backoff; only requests that cannot have acted twice
   are retried (a connection that was never made, or an idempotent target state such as ForceOff/On);
   authentication errors are never retried (BMCs lock accounts after a few failures);
5. an audit entry with the result and the duration.

Secrets: the password is read from a 0600 file, kept in a ``Credentials`` whose repr hides it, handed to
sushy only, and scrubbed (with its basic-auth form) from every error text this module produces.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from slurm_fleetyield.adapters.bmc_ratelimit import TokenBucket
from slurm_fleetyield.core.model import JobView, SlurmNode
from slurm_fleetyield.core.plan import PowerCycle
from slurm_fleetyield.ports import ActionResult
from slurm_fleetyield.redfish_config import BmcNode, RedfishConfig, ResolvedBmc

log = logging.getLogger("fleetyield.redfish")

AUDIT_ACTOR = "fleetyield-redfish"
AUDIT_KIND = "power_action"
RUNNING_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED"})
"""Job states that hold a node's resources: a power action would kill them."""

__all__ = ["BmcNode", "RedfishConfig", "ResolvedBmc"]  # config models live in redfish_config (no sushy)


# --------------------------------------------------------------------------------------------------------
# Credentials
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password='***')"

    def secrets(self) -> tuple[str, ...]:
        """Strings that must never appear in a log line or an error: the password, its basic-auth token."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return (self.password, token)


def read_credentials(path: str | Path) -> Credentials:
    """Line 1 user, line 2 password (trailing newline stripped, nothing else). A file readable or writable
    by group/others, missing lines or an unreadable file raise ``BmcConfigError`` (naming the file only)."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
        if mode & 0o077:
            raise BmcConfigError(f"{p}: mode {mode & 0o777:o} is group/world accessible (chmod 600)")
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BmcConfigError(
            f"{p}: cannot read BMC credentials: {exc.strerror or type(exc).__name__}"
        ) from None
    if len(lines) < 2 or not lines[0].strip() or not lines[1]:
        raise BmcConfigError(f"{p}: expected the BMC user on line 1 and its password on line 2")
    return Credentials(lines[0].strip(), lines[1])


def redact(text: str, secrets: Sequence[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    # belt and braces: any basic-auth header or user:password@ URL that slipped into a message
    text = re.sub(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?basic\s+)[A-Za-z0-9+/=]+", r"\1***", text)
    return re.sub(r"(://[^/\s:@]+):[^@\s/]+@", r"\1:***@", text)


# --------------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------------


class BmcConfigError(Exception):
    """The BMC configuration or its credentials file cannot be used."""


def require_sushy() -> None:
    """sushy (with requests, pbr, stevedore) is the controller host's extra, not a GPU node's: say which
    install is missing at startup rather than at the first power cycle."""
    try:
        import sushy  # noqa: F401
    except ImportError as exc:
        raise BmcConfigError(
            f"redfish.enabled = true needs the Redfish client sushy ({exc}): on the controller host, "
            "pip install 'fleetyield[controller]'"
        ) from None


class BmcError(Exception):
    """A BMC operation failed. Carries the node, the operation and the BMC address; never a secret."""

    retryable = False

    def __init__(self, node: str, operation: str, address: str, detail: str) -> None:
        self.node = node
        self.operation = operation
        self.address = address
        self.detail = detail
        super().__init__(f"{type(self).__name__}: {operation} on {node} via {address}: {detail}")


class BmcUnreachable(BmcError):
    """No connection to the BMC (refused, no route, connect timeout, TLS failure)."""

    retryable = True


class BmcAuthError(BmcError):
    """The BMC refused the credentials (401/403)."""


class BmcTimeout(BmcError):
    """The BMC did not answer in time, or the system did not reach the expected power state in time."""

    retryable = True


class BmcProtocolError(BmcError):
    """The BMC answered something unusable (4xx/5xx, missing resource or action, several systems)."""


class PowerRefused(Exception):
    """A power action refused before touching the BMC. ``rule``: safety | drain_cap | rate_limit | audit |
    no_bmc | config (credentials file unusable)."""

    def __init__(self, node: str, operation: str, rule: str, detail: str) -> None:
        self.node = node
        self.operation = operation
        self.rule = rule
        self.detail = detail
        super().__init__(f"power action {operation} on {node} refused ({rule}): {detail}")


# --------------------------------------------------------------------------------------------------------
# Operations and safety
# --------------------------------------------------------------------------------------------------------


class PowerOp(StrEnum):
    FORCE_RESTART = "force_restart"
    GRACEFUL_RESTART = "graceful_restart"
    POWER_CYCLE = "power_cycle"  # ForceOff, wait Off, dwell, On, wait On
    POWER_OFF = "power_off"  # ForceOff, wait Off
    POWER_ON = "power_on"  # On, wait On

    @property
    def destructive(self) -> bool:
        """Kills whatever runs on the node. Powering on cannot hurt a job."""
        return self is not PowerOp.POWER_ON


@dataclass(frozen=True, slots=True)
class SafetyContext:
    """What the caller knows about the node right before a power action.

    ``drained_by_us``: Slurm shows it drained with a ``fleetyield:`` reason. ``quarantined``: the lifecycle
    holds it in a drained stage (quarantined, remediating, needs_human, retired). ``slurm_initiated``: the
    request comes from Slurm itself (RebootProgram after ``scontrol reboot``, Suspend/ResumeProgram), which
    only acts on idle nodes. ``counts_against_drain_cap``: the action takes out a node that is not already
    counted as drained (the caller decides; a node drained by us is already counted); ``drain_cap_room``:
    how many more nodes the drain cap allows (``core.quarantine``'s budget).
    """

    node: str
    running_jobs: tuple[int, ...] = ()
    drained_by_us: bool = False
    quarantined: bool = False
    slurm_initiated: bool = False
    counts_against_drain_cap: bool = False
    drain_cap_room: int = 0

    def refusal(self, op: PowerOp) -> tuple[str, str] | None:
        """(rule, why) if ``op`` must not run; None if it may."""
        if not op.destructive:
            return None
        if self.quarantined:
            pass  # a quarantined node's remaining jobs are lost anyway: the cycle is what frees it
        elif self.running_jobs:
            jobs = ", ".join(str(j) for j in self.running_jobs[:10])
            return "safety", f"node has running jobs ({jobs}) and is not quarantined"
        elif not (self.drained_by_us or self.slurm_initiated):
            return "safety", "node is neither drained by FleetYield, quarantined, nor handed over by Slurm"
        if self.counts_against_drain_cap and self.drain_cap_room <= 0:
            return "drain_cap", "taking this node out would exceed the drain cap"
        return None


SafetyCallback = Callable[[str, PowerOp], SafetyContext]
"""``safety(node, op)``: called right before each power action, so the answer is fresh."""


def safety_from_views(
    node: str,
    slurm: SlurmNode | None,
    jobs: Sequence[JobView],
    *,
    quarantined: bool = False,
    slurm_initiated: bool = False,
    drain_cap_room: int = 0,
) -> SafetyContext:
    """A ``SafetyContext`` from Slurm's current view of the node and the job list."""
    running = tuple(sorted(j.job_id for j in jobs if node in j.nodes and j.state in RUNNING_JOB_STATES))
    drained_by_us = bool(slurm and slurm.drained_by_us)
    return SafetyContext(
        node=node,
        running_jobs=running,
        drained_by_us=drained_by_us,
        quarantined=quarantined,
        slurm_initiated=slurm_initiated,
        counts_against_drain_cap=not (drained_by_us or quarantined or slurm_initiated),
        drain_cap_room=drain_cap_room,
    )


class SlurmView(Protocol):
    def read_nodes(self) -> Mapping[str, SlurmNode]: ...

    def read_jobs(self) -> Sequence[JobView]: ...


REBOOT_STATES = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
"""Slurm state flags of a node whose reboot Slurm itself asked for (``scontrol reboot``)."""


def slurm_is_rebooting(node: SlurmNode | None) -> bool:
    """The node carries Slurm's reboot flag: a RebootProgram request for it is Slurm's, not a forgery."""
    return bool(node and node.states & REBOOT_STATES)


def slurm_safety(
    slurm: SlurmView,
    quarantined: Callable[[str], bool],
    *,
    initiated: Callable[[SlurmNode | None], bool] = lambda _node: False,
    drain_cap_room: Callable[[], int] = lambda: 0,
) -> SafetyCallback:
    """A safety callback reading Slurm (any ``SlurmPort``) at each call; an unreadable Slurm raises, so
    the action is never admitted. ``initiated(node)``: does Slurm itself want this (e.g.
    ``slurm_is_rebooting`` for the RebootProgram handler, ``lambda _: True`` for Suspend/Resume)."""

    def check(node: str, op: PowerOp) -> SafetyContext:
        nodes = slurm.read_nodes()
        jobs = slurm.read_jobs()
        view = nodes.get(node)
        return safety_from_views(
            node,
            view,
            jobs,
            quarantined=quarantined(node),
            slurm_initiated=initiated(view),
            drain_cap_room=drain_cap_room(),
        )

    return check


class AuditSink(Protocol):
    """``gate.audit.AuditLog`` (its ``append``), or anything with the same keyword signature."""

    def append(self, *, time: float, actor: str, kind: str, subject: str, data: dict[str, Any]) -> Any: ...


class PerThreadAudit:
    """An ``AuditSink`` opening one log per thread: SQLite connections may not cross threads, and power
    actions run in the tick thread, the listener's threads and the RebootProgram handler's workers.
    ``open_log`` is e.g. ``lambda: AuditLog.open(db, head)`` or ``lambda: gate_access.get().audit``."""

    def __init__(self, open_log: Callable[[], AuditSink]) -> None:
        import threading

        self._open = open_log
        self._local = threading.local()

    def append(self, *, time: float, actor: str, kind: str, subject: str, data: dict[str, Any]) -> Any:
        sink = getattr(self._local, "sink", None)
        if sink is None:
            sink = self._local.sink = self._open()
        return sink.append(time=time, actor=actor, kind=kind, subject=subject, data=data)


# --------------------------------------------------------------------------------------------------------
# The controller
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BmcStatus:
    node: str
    power_state: str  # On | Off | PoweringOn | PoweringOff | Paused | unknown
    health: str | None  # OK | Warning | Critical | None (not reported)
    system: str  # the Redfish path of the system


@dataclass(frozen=True, slots=True)
class PowerResult:
    node: str
    operation: PowerOp
    power_state: str
    duration_s: float
    address: str
    system: str


@dataclass(frozen=True, slots=True)
class Admission:
    """A power action that passed the guards and is audited as started (``PowerController.admit``)."""

    node: str
    op: PowerOp
    bmc: ResolvedBmc
    credentials: Credentials = field(repr=False)
    reason: str = ""


SushyFactory = Callable[..., Any]
"""``factory(base_url, auth=..., verify=..., read_timeout=..., ...)``: ``sushy.Sushy`` (a test seam)."""


class PowerController:
    """Power actions and status reads for configured nodes. One instance serves the whole fleet."""

    def __init__(
        self,
        config: RedfishConfig,
        *,
        safety: SafetyCallback,
        audit: AuditSink | None,
        bucket: TokenBucket | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        sushy_factory: SushyFactory | None = None,
    ) -> None:
        self.config = config
        self.safety = safety
        self.audit = audit
        self.bucket = bucket or TokenBucket(config.rate_limit_actions, config.rate_limit_window_s)
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._factory = sushy_factory
        self.bmc_calls = 0
        """Redfish requests issued through ``_call`` (connect + actions + polls), for tests and metrics."""

    # -- public ---------------------------------------------------------------------------------------

    def status(self, node: str) -> BmcStatus:
        """Power state and health of the node's system (read-only: no safety check, no rate limit)."""
        bmc, creds = self._resolve(node, "status")
        system = self._call(bmc, creds, "status", lambda: self._system(bmc, creds, "status"), idempotent=True)
        return _status(node, system)

    def act(self, node: str, op: PowerOp | str, *, reason: str = "") -> PowerResult:
        """Run one power action with every guard (see the module docstring). Raises ``PowerRefused`` or a
        ``BmcError``; both are audited."""
        return self.perform(self.admit(node, op, reason=reason))

    def admit(self, node: str, op: PowerOp | str, *, reason: str = "") -> Admission:
        """Steps 1-3 (safety, rate limit, ``started`` audit entry), nothing sent to the BMC yet: a caller
        that must answer before the node goes down (the RebootProgram handler) admits, answers, then
        ``perform``s. Raises ``PowerRefused``."""
        op = PowerOp(op)
        bmc = self.config.bmc_for(node)
        if bmc is None:
            raise self._refuse(node, op, "no_bmc", "no BMC configured for this node", reason, audit=False)
        try:
            creds = self._credentials(bmc, op.value)
        except BmcConfigError as exc:
            raise self._refuse(node, op, "config", str(exc), reason) from None
        try:
            ctx = self.safety(node, op)
        except Exception as exc:  # Slurm unreadable: unknown is never safe
            raise self._refuse(node, op, "safety", f"cannot check safety: {exc}", reason) from None
        refusal = ctx.refusal(op)
        if refusal is not None:
            raise self._refuse(node, op, refusal[0], refusal[1], reason, ctx=ctx)
        limited = self.bucket.take()
        if limited is not None:
            raise self._refuse(node, op, "rate_limit", str(limited), reason, ctx=ctx)
        try:
            self._audit(node, op, "started", 0.0, bmc.address, reason=reason, ctx=ctx)
        except Exception as exc:  # AuditIntegrityError, sqlite errors: no evidence, no action
            raise PowerRefused(node, op.value, "audit", f"cannot write the audit log: {exc}") from None
        return Admission(node, op, bmc, creds, reason)

    def perform(self, admitted: Admission) -> PowerResult:
        """Steps 4-5: the BMC calls and the audited result. Raises ``BmcError``."""
        node, op, bmc = admitted.node, admitted.op, admitted.bmc
        start = self._clock()
        try:
            result = self._run(bmc, admitted.credentials, op)
        except BmcError as exc:
            duration = self._clock() - start
            log.error("BMC power action failed: %s", exc)
            self._audit(
                node, op, f"error:{type(exc).__name__}", duration, bmc.address, exc.detail, admitted.reason
            )
            raise
        self._audit(
            node, op, "ok", result.duration_s, bmc.address, f"power {result.power_state}", admitted.reason
        )
        log.warning(
            "BMC power action done",
            extra={"fy": {"node": node, "operation": op.value, "duration_s": round(result.duration_s, 1)}},
        )
        return result

    # -- guards and audit -----------------------------------------------------------------------------

    def _refuse(
        self,
        node: str,
        op: PowerOp,
        rule: str,
        detail: str,
        reason: str,
        *,
        ctx: SafetyContext | None = None,
        audit: bool = True,
    ) -> PowerRefused:
        log.warning("BMC power action refused: %s on %s (%s): %s", op.value, node, rule, detail)
        if audit:
            try:
                self._audit(node, op, f"refused:{rule}", 0.0, "", detail, reason, ctx=ctx)
            except Exception as exc:  # the refusal stands either way
                log.error("cannot audit the refusal of %s on %s: %s", op.value, node, exc)
        return PowerRefused(node, op.value, rule, detail)

    def _audit(
        self,
        node: str,
        op: PowerOp,
        result: str,
        duration_s: float,
        address: str,
        detail: str = "",
        reason: str = "",
        *,
        ctx: SafetyContext | None = None,
    ) -> None:
        if self.audit is None:
            return
        data: dict[str, Any] = {
            "node": node,
            "operation": op.value,
            "result": result,
            "duration_s": round(duration_s, 3),
            "bmc": address,
        }
        if detail:
            data["detail"] = detail[:1000]
        if reason:
            data["reason"] = reason[:300]
        if ctx is not None:
            data["running_jobs"] = list(ctx.running_jobs[:50])
        self.audit.append(time=self._wall(), actor=AUDIT_ACTOR, kind=AUDIT_KIND, subject=node, data=data)

    # -- the BMC --------------------------------------------------------------------------------------

    def _resolve(self, node: str, operation: str) -> tuple[ResolvedBmc, Credentials]:
        bmc = self.config.bmc_for(node)
        if bmc is None:
            raise BmcConfigError(f"{operation} on {node}: no BMC configured for this node")
        return bmc, self._credentials(bmc, operation)

    def _credentials(self, bmc: ResolvedBmc, operation: str) -> Credentials:
        if bmc.credentials_file is None:
            raise BmcConfigError(f"{operation} on {bmc.node}: no credentials_file configured")
        return read_credentials(bmc.credentials_file)

    def _run(self, bmc: ResolvedBmc, creds: Credentials, op: PowerOp) -> PowerResult:
        import sushy

        start = self._clock()
        name = op.value
        system = self._call(bmc, creds, name, lambda: self._system(bmc, creds, name), idempotent=True)

        def reset(kind: Any, idempotent: bool) -> None:
            self._call(bmc, creds, name, lambda: system.reset_system(kind), idempotent=idempotent)

        if op is PowerOp.POWER_OFF or op is PowerOp.POWER_CYCLE:
            if _state(system) != "Off":
                reset(sushy.ResetType.FORCE_OFF, idempotent=True)
                self._wait(bmc, creds, system, name, "Off", self.config.off_timeout_s)
            if op is PowerOp.POWER_CYCLE:
                self._sleep(self.config.off_dwell_s)
        if op is PowerOp.POWER_ON or op is PowerOp.POWER_CYCLE:
            if _state(system) != "On":
                reset(sushy.ResetType.ON, idempotent=True)
            self._wait(bmc, creds, system, name, "On", self.config.on_timeout_s)
        elif op is PowerOp.FORCE_RESTART or op is PowerOp.GRACEFUL_RESTART:
            kind = (
                sushy.ResetType.FORCE_RESTART
                if op is PowerOp.FORCE_RESTART
                else sushy.ResetType.GRACEFUL_RESTART
            )
            reset(kind, idempotent=False)  # a second restart is a second outage: never retried once sent
            self._wait(bmc, creds, system, name, "On", self.config.on_timeout_s)
        return PowerResult(bmc.node, op, _state(system), self._clock() - start, bmc.address, system.path)

    def _system(self, bmc: ResolvedBmc, creds: Credentials, operation: str) -> Any:
        import sushy
        from sushy import auth as sushy_auth

        auth_cls = {
            "basic": sushy_auth.BasicAuth,
            "session": sushy_auth.SessionAuth,
            "auto": sushy_auth.SessionOrBasicAuth,
        }[self.config.auth]
        factory = self._factory or sushy.Sushy
        root = factory(
            bmc.address,
            auth=auth_cls(username=creds.username, password=creds.password),
            verify=self.config.verify_tls,
            read_timeout=self.config.read_timeout_s,
            connect_timeout=self.config.connect_timeout_s,
            server_side_retries=1,  # our own loop retries, with backoff and an injected sleep
            server_side_retries_delay=0,
        )
        if bmc.system_id == "first":
            return root.get_system()  # sushy: exactly one member, else UnknownDefaultError
        path = bmc.system_id if bmc.system_id.startswith("/") else f"/redfish/v1/Systems/{bmc.system_id}"
        return root.get_system(path)

    def _wait(
        self, bmc: ResolvedBmc, creds: Credentials, system: Any, operation: str, target: str, timeout_s: float
    ) -> None:
        deadline = self._clock() + timeout_s
        last = "unknown"
        while True:
            self._call(bmc, creds, operation, lambda: system.refresh(force=True), idempotent=True)
            last = _state(system)
            if last == target:
                return
            if self._clock() >= deadline:
                raise BmcTimeout(
                    bmc.node,
                    operation,
                    bmc.address,
                    f"system {system.path} did not reach power {target} within {timeout_s:g}s "
                    f"(last power state {last})",
                )
            self._sleep(self.config.poll_interval_s)

    def _call(
        self, bmc: ResolvedBmc, creds: Credentials, operation: str, fn: Callable[[], Any], *, idempotent: bool
    ) -> Any:
        """``fn()`` with sushy's exceptions turned into ``BmcError``s, retried with backoff when safe."""
        delay = self.config.backoff_initial_s
        for attempt in range(self.config.retries + 1):
            self.bmc_calls += 1
            try:
                return fn()
            except Exception as exc:  # sushy raises its own hierarchy, plus requests' on odd paths
                err = _classify(exc, bmc, operation, creds)
            never_sent = isinstance(err, BmcUnreachable)
            if not (err.retryable and (idempotent or never_sent)) or attempt == self.config.retries:
                raise err from None
            log.warning(
                "BMC request failed, retrying in %.1fs (%d/%d): %s",
                delay,
                attempt + 1,
                self.config.retries,
                err,
            )
            self._sleep(delay)
            delay = min(self.config.backoff_max_s, max(delay * 2, 0.0))
        raise AssertionError("unreachable")  # pragma: no cover


def _state(system: Any) -> str:
    state = getattr(system, "power_state", None)
    return str(getattr(state, "value", state)) if state is not None else "unknown"


def _status(node: str, system: Any) -> BmcStatus:
    status = getattr(system, "status", None)
    health = getattr(status, "health", None) if status is not None else None
    return BmcStatus(
        node, _state(system), None if health is None else str(getattr(health, "value", health)), system.path
    )


def _classify(exc: Exception, bmc: ResolvedBmc, operation: str, creds: Credentials) -> BmcError:
    from sushy import exceptions as sx

    detail = redact(f"{type(exc).__name__}: {exc}", creds.secrets())
    args = (bmc.node, operation, bmc.address, detail)
    if isinstance(exc, sx.AccessError):
        return BmcAuthError(
            bmc.node,
            operation,
            bmc.address,
            redact(f"credentials refused ({exc.status_code})", creds.secrets()),
        )
    if isinstance(exc, sx.ConnectionError):
        cause = _requests_cause(exc)
        if cause is not None and _is_read_timeout(cause):
            return BmcTimeout(*args)
        return BmcUnreachable(*args)
    if isinstance(exc, sx.ServerSideError):
        err = BmcProtocolError(*args)
        err.retryable = True  # 5xx: the BMC is busy; retried only when the request is idempotent
        return err
    if isinstance(exc, sx.SushyError):
        return BmcProtocolError(*args)
    if _is_read_timeout(exc):
        return BmcTimeout(*args)
    if isinstance(exc, OSError) or type(exc).__module__.startswith(("requests", "urllib3")):
        return BmcUnreachable(*args)
    return BmcProtocolError(*args)


def _requests_cause(exc: BaseException) -> BaseException | None:
    seen = exc.__cause__ or exc.__context__
    while seen is not None:
        if type(seen).__module__.startswith(("requests", "urllib3")):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _is_read_timeout(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, requests.exceptions.ReadTimeout)


# --------------------------------------------------------------------------------------------------------
# Executor side: the lifecycle's PowerCycle action
# --------------------------------------------------------------------------------------------------------


class RedfishExecutor:
    """Runs ``PowerCycle`` actions; failures come back as ``ActionResult(ok=False)`` (the next tick turns
    them into REMEDIATION_FAILED: next rung, or NEEDS_HUMAN after max_remediation_attempts).

    ``run`` does the whole cycle in the caller's thread (tens of seconds, minutes with retries and a slow
    BMC). ``start`` is what the daemon uses: it admits the action in the caller's thread (safety read from
    Slurm, rate limit, the ``started`` audit entry: no BMC call, so a refusal is this tick's failure) and
    performs it in a worker thread, so the tick never waits on a BMC. ``collect`` hands the finished
    results to the next tick (ok: REMEDIATION_STARTED, the node boots from then on; failed:
    REMEDIATION_FAILED) together with the nodes still in flight (no REMEDIATION_OK while the power may
    not even be cut yet). One action per node at a time: a second one while the first runs fails at once.
    """

    def __init__(
        self,
        power: PowerController,
        *,
        dry_run: bool = False,
        spawn: Callable[[Callable[[], None]], Any] | None = None,
    ) -> None:
        import threading

        self.power = power
        self.dry_run = dry_run
        self._spawn = spawn or _spawn_thread
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight: dict[str, PowerCycle] = {}
        self._finished: list[ActionResult] = []

    def command(self, action: PowerCycle) -> tuple[str, ...]:
        bmc = self.power.config.bmc_for(action.node)
        return ("redfish", PowerOp.POWER_CYCLE.value, action.node, bmc.address if bmc else "(no BMC)")

    def _not_run(self, action: PowerCycle, command: tuple[str, ...]) -> ActionResult | None:
        if not self.power.config.enabled:
            return ActionResult(action, False, command, "redfish.enabled is false: power cycle not executed")
        if self.dry_run:
            log.info("dry-run: would power cycle %s through %s", action.node, command[-1])
            return ActionResult(action, True, command, "dry-run: not executed")
        return None

    def run(self, action: PowerCycle) -> ActionResult:
        """The whole power cycle, in this thread."""
        command = self.command(action)
        skipped = self._not_run(action, command)
        if skipped is not None:
            return skipped
        try:
            result = self.power.act(action.node, PowerOp.POWER_CYCLE, reason=action.reason)
        except (BmcError, PowerRefused, BmcConfigError) as exc:
            return ActionResult(action, False, command, str(exc))
        return _done(action, command, result)

    def start(self, action: PowerCycle, sent: Callable[[], None] | None = None) -> ActionResult:
        """Admit here, perform in a worker thread; the result comes later through ``collect``. ``sent``:
        called once admitted, before the worker may reach the BMC (the executor records it in the action's
        intent); if it raises, nothing is sent."""
        command = self.command(action)
        skipped = self._not_run(action, command)
        if skipped is not None:
            return skipped
        with self._lock:
            if action.node in self._in_flight:
                return ActionResult(
                    action, False, command, f"a power action on {action.node} is still in flight"
                )
            self._in_flight[action.node] = action  # claimed before admit: no second one slips in
        try:
            admitted = self.power.admit(action.node, PowerOp.POWER_CYCLE, reason=action.reason)
        except (PowerRefused, BmcConfigError) as exc:
            self._release(action.node)
            return ActionResult(action, False, command, str(exc))
        except BaseException:
            self._release(action.node)
            raise
        if sent is not None:
            try:
                sent()
            except Exception as exc:  # no record that it was sent, no sending
                self._perform_failed(action, command, admitted, f"cannot record the start: {exc}")
                return ActionResult(action, False, command, f"cannot record the start: {exc}")
        try:
            self._spawn(lambda: self._perform(action, command, admitted))
        except Exception as exc:  # no thread: the audited "started" gets its result here
            self._perform_failed(action, command, admitted, f"cannot start a worker: {exc}")
            return ActionResult(action, False, command, f"cannot start a worker thread: {exc}")
        return ActionResult(action, True, command, "power cycle started off the tick; result follows")

    def collect(self) -> tuple[frozenset[str], tuple[ActionResult, ...]]:
        """(nodes still in flight, results finished since the last call), taken under one lock: a node
        finishing in between is in both, never in neither."""
        with self._lock:
            finished, self._finished = tuple(self._finished), []
            return frozenset(self._in_flight), finished

    def in_flight(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._in_flight)

    def close(self, timeout_s: float = 10.0) -> frozenset[str]:
        """Wait up to ``timeout_s`` for actions in flight (a cycle cut in half can leave a node off; the
        ladder's timeout and the next attempt recover it). Returns the nodes still in flight."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
            left_over = frozenset(self._in_flight)
        if left_over:
            log.error("stopping with BMC power actions in flight: %s", ", ".join(sorted(left_over)))
        return left_over

    def _perform(self, action: PowerCycle, command: tuple[str, ...], admitted: Admission) -> None:
        try:
            result = _done(action, command, self.power.perform(admitted))
        except BmcError as exc:  # audited by perform
            result = ActionResult(action, False, command, str(exc))
        except Exception as exc:  # a bug or an unexpected library error: the tick must still hear of it
            log.exception("BMC power action on %s crashed", action.node)
            result = ActionResult(action, False, command, f"{type(exc).__name__}: {exc}")
        self._finish(action.node, result)

    def _perform_failed(
        self, action: PowerCycle, command: tuple[str, ...], admitted: Admission, detail: str
    ) -> None:
        with contextlib.suppress(Exception):
            self.power._audit(
                action.node, admitted.op, "error:NotStarted", 0.0, admitted.bmc.address, detail, action.reason
            )
        self._release(action.node)

    def _finish(self, node: str, result: ActionResult) -> None:
        with self._lock:
            self._in_flight.pop(node, None)
            self._finished.append(result)
            self._idle.notify_all()

    def _release(self, node: str) -> None:
        with self._lock:
            self._in_flight.pop(node, None)
            self._idle.notify_all()


def _done(action: PowerCycle, command: tuple[str, ...], result: PowerResult) -> ActionResult:
    return ActionResult(
        action, True, command, f"power cycled in {result.duration_s:.1f}s, power {result.power_state}"
    )


def _spawn_thread(fn: Callable[[], None]) -> None:
    import threading

    threading.Thread(target=fn, name="fleetyield-bmc", daemon=True).start()


def default_rate_limit_state(gate_dir: str | Path) -> Path:
    return Path(gate_dir) / "bmc-ratelimit.json"
