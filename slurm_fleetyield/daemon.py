"""The imperative shell around ``tick``: read the world, decide, act, remember, publish.

Input: a ``Config`` and the ports (Slurm, sensing), the store (state, inbox, read model). Output: Slurm
changes (through the Slurm port only), one committed store transaction per tick, the API's read model and
the controller's metrics.

One tick: read Slurm (nodes, jobs) -> scrape the GPU nodes Slurm lists -> take pending inbox events ->
take the intake (``intake.py``: canary results from sacct/squeue, gate decisions from the Gatekeeper,
job outcomes forwarded by the agents), the previous tick's failed actions and the results of power actions
that ran off the tick (Redfish worker threads; the nodes still in flight too) -> ``tick`` -> execute the
plan (``executor.py``: Slurm, agent resets, gate proposals; ``DryRunSlurm`` when dry-run) -> commit state +
processed events + intake marks + ledger rows + log rows + rendered result in one transaction -> publish
to metrics. A Slurm read failure gives
``Observations(slurm_ok=False)``: the core returns no plan, nothing is applied and inbox events stay
pending. Every tick runs inside a backoff throttle: an exception is logged, the next attempt waits
``backoff_initial_s`` growing to ``backoff_max_s``, and the first success resets it.

Wake-ups: the push listener sets ``wake`` after storing a fatal event; the loop then runs a tick at once.
Such a push tick reuses the last scrape when it is younger than ``loop.push_reuse_samples_s``: the pushed
event, not the scrape, carries the fault, and skipping the scrape keeps fault-to-drain near one second
(the core treats a repeated sample as "nothing new", so reuse does not distort trends).
"""

from __future__ import annotations

import json
import logging
import random
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurm_fleetyield import intake as intake_mod
from slurm_fleetyield.adapters.agent_control import AgentControl
from slurm_fleetyield.adapters.metrics import ControllerStats, TickSnapshot, make_registry
from slurm_fleetyield.adapters.slurm import CanarySpec, DryRunSlurm, SlurmCli, SlurmCommandError
from slurm_fleetyield.adapters.slurmrest import SlurmRest, TokenFile
from slurm_fleetyield.adapters.store import LogRow, Store, StoredState, StoreError, TickMarks
from slurm_fleetyield.adapters.views import ViewRenderer, ledger_row
from slurm_fleetyield.config import Config, ConfigError, read_secret
from slurm_fleetyield.core.explain import explain_dict, explain_text
from slurm_fleetyield.core.loop import TickResult, tick
from slurm_fleetyield.core.model import (
    ConfirmedAction,
    FailedAction,
    FatalEvent,
    NodeSample,
    Observations,
    SlurmNode,
)
from slurm_fleetyield.core.quarantine import ATTESTATION_FAILED
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.executor import Executor, GateAccess
from slurm_fleetyield.gcpolicy import collect_after
from slurm_fleetyield.lease import Leader, Leadership, SoleLeadership
from slurm_fleetyield.ports import ActionResult, ApplyReport, SensePort, SlurmPort

if TYPE_CHECKING:  # sushy is imported only when [redfish] is enabled, cryptography when [attest] is
    from slurm_fleetyield.adapters.redfish import RedfishExecutor
    from slurm_fleetyield.attest.verify import AttestService

log = logging.getLogger("fleetyield.daemon")
PENDING_LOG_INTERVAL_S = 600.0
"""Open proposals are logged (warning, with the approve command) at most this often."""


# --------------------------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, plus the ``fy`` dict passed via ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        extra = getattr(record, "fy", None)
        if isinstance(extra, Mapping):
            doc.update(extra)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(level: str = "info", json_lines: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if json_lines
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


# --------------------------------------------------------------------------------------------------------
# Backoff throttle
# --------------------------------------------------------------------------------------------------------


class Backoff:
    """Delay after consecutive failures: initial * factor^(n-1), capped; ``success()`` resets."""

    def __init__(self, initial_s: float, max_s: float, factor: float) -> None:
        self.initial_s, self.max_s, self.factor = initial_s, max_s, factor
        self.failures = 0

    def failure(self) -> float:
        self.failures += 1
        return min(self.max_s, self.initial_s * self.factor ** (self.failures - 1))

    def success(self) -> None:
        self.failures = 0


# --------------------------------------------------------------------------------------------------------
# The daemon
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TickOutcome:
    tick: int
    slurm_ok: bool
    result: TickResult
    report: ApplyReport
    samples: Mapping[str, NodeSample]
    duration_s: float
    reused_samples: bool


class Daemon:
    def __init__(
        self,
        config: Config,
        slurm: SlurmPort,
        sense: SensePort,
        store: Store,
        *,
        stats: ControllerStats | None = None,
        wake: threading.Event | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        dry_run: bool = False,
        control: AgentControl | None = None,
        gate: GateAccess | None = None,
        redfish: RedfishExecutor | None = None,
        attest: AttestService | None = None,
        leader: Leader | None = None,
    ) -> None:
        self.config = config
        self.slurm = slurm
        # SQLite: one controller, always leading, no fence (nothing checked per action)
        self.leader: Leader = leader or SoleLeadership(config.store.controller_id)
        self.gate = gate
        self.attest = attest
        self.executor = Executor(
            slurm,
            store,
            control=control,
            gate=gate,
            redfish=redfish,
            dry_run=dry_run,
            record_proposals_in_dry_run=config.gate.record_in_dry_run,
            fence=None if isinstance(self.leader, SoleLeadership) else self.leader.fence,
        )
        self._failed_actions: tuple[FailedAction, ...] = ()
        self._background: tuple[ActionResult, ...] = ()  # off-tick results not yet committed by a tick
        self._pending_logged_at = float("-inf")
        self.sense = sense
        self.store = store
        self.stats = stats or ControllerStats()
        self.wake = wake or threading.Event()
        self.stop_event = threading.Event()
        self.clock = clock
        self.monotonic = monotonic
        self.rng = rng or random.Random(config.loop.seed)
        self.dry_run = dry_run
        self._last_nodes: Mapping[str, SlurmNode] = {}
        self._last_samples: Mapping[str, NodeSample] = {}
        self._last_sample_time = float("-inf")
        self._live: dict[str, Any] = {"slurm_ok": None, "consecutive_failures": 0, "last_error": None}
        self._live_lock = threading.Lock()
        self._ticked = threading.Condition()
        self._last_tick_started = float("-inf")  # clock() at the start of the last committed tick
        self.views = ViewRenderer()  # renders only the nodes that changed since the last committed tick
        self._explained: tuple[int, TickResult] | None = None  # the last committed tick, for live explain
        stored = self._resume()
        if stored:
            log.info("resumed", extra={"fy": {"tick": self.tick_no, "saved_at": stored.time}})

    def _resume(self) -> StoredState | None:
        """The last committed state, from the store: at start, and at a takeover (the old leader's)."""
        stored = self.store.load_state()
        self.state = stored.state if stored else ControllerState.empty()
        self.tick_no = stored.tick if stored else 0
        self.views.forget()  # another controller may have written the view: the next tick writes all
        self._failed_actions, self._background = (), ()
        self.stats.set_ledger(self.store.ledger_totals())
        return stored

    # -- one tick -------------------------------------------------------------------------------------

    def _scrape_targets(self, nodes: Mapping[str, SlurmNode]) -> list[str]:
        if self.config.sense.gpu_nodes_only:
            return sorted(n for n, v in nodes.items() if v.gpu_count > 0)
        return sorted(nodes)

    def tick_once(self, push: bool = False) -> TickOutcome:
        t0 = self.monotonic()
        now = self.clock()
        try:
            nodes = self.slurm.read_nodes()
            jobs = tuple(self.slurm.read_jobs())
            slurm_ok = True
            self._last_nodes = nodes
        except SlurmCommandError as exc:
            log.error(
                "slurm unreadable; no action this tick",
                extra={"fy": {"command": exc.command, "error": exc.stderr}},
            )
            nodes, jobs, slurm_ok = self._last_nodes, (), False
        reused = False
        samples: Mapping[str, NodeSample] = {}
        if slurm_ok:
            targets = self._scrape_targets(nodes)
            fresh_enough = now - self._last_sample_time <= self.config.loop.push_reuse_samples_s
            if push and fresh_enough and set(targets) <= set(self._last_samples):
                samples, reused = {n: self._last_samples[n] for n in targets}, True
            else:
                samples = self.sense.sample(targets, now)
                self._last_samples, self._last_sample_time = samples, now
        if self.attest is not None:
            self._attest_intake(now)
        pending = tuple(self.store.pending())
        extra = self._intake(nodes, now) if slurm_ok else intake_mod.Intake()
        in_flight, finished = self.executor.background()
        self._background += finished
        done = self._background if slurm_ok else ()
        done_failed = tuple(
            FailedAction(r.action.kind, _action_node(r.action), r.detail) for r in done if not r.ok
        )
        obs = Observations(
            time=now,
            slurm=nodes,
            samples=samples,
            fatal_events=pending,
            jobs=jobs,
            slurm_ok=slurm_ok,
            canary_results=tuple(extra.canary_results),
            gate_decisions=tuple(extra.gate_decisions),
            outcomes=tuple(extra.outcomes),
            failed_actions=self._failed_actions + done_failed if slurm_ok else (),
            confirmed_actions=tuple(
                ConfirmedAction(r.action.kind, _action_node(r.action), r.detail) for r in done if r.ok
            ),
            in_flight=in_flight,
        )
        result = tick(self.state, obs, self.config.core, now, self.rng)
        report = self.executor.apply(result.plan, now) if slurm_ok and result.plan.actions else ApplyReport()
        self.tick_no += 1
        duration = self.monotonic() - t0
        rows = [LogRow(e.time, e.kind, e.node, e.message, dict(e.data)) for e in result.events]
        for e in result.events:
            if e.kind == "stake_breaker":  # capacity the stake rule would have withheld: a human should know
                log.warning(
                    "stake capacity breaker: %s",
                    e.message,
                    extra={"fy": {"tick": self.tick_no, **e.data}},
                )
        rows.extend(extra.rows)
        for r in (*done, *report.results):
            kind = "dry_run" if self.dry_run else ("applied" if r.ok else "apply_failed")
            rows.append(
                LogRow(
                    now,
                    kind,
                    getattr(r.action, "node", ""),
                    " ".join(r.command),
                    {"action": r.action.kind, "detail": r.detail},
                )
            )
        view = None
        marks = None
        if slurm_ok:
            view = self.views.render(
                self.tick_no, now, result, report, samples, dry_run=self.dry_run, duration_s=duration
            )
            marks = TickMarks(
                outcome_keys=extra.outcome_keys,
                attempts=extra.attempts,
                ledger=[ledger_row(e) for e in result.ledger],
                gate_marks=extra.gate_marks,
                canary_seen=extra.canary_seen,
            )
        processed = [e.event_id for e in pending] if slurm_ok else []
        try:
            lease = None
            if isinstance(self.leader, Leadership):
                if self.leader.token is None:
                    raise StoreError("fenced: the leader lease was lost during the tick; nothing committed")
                lease = (self.leader.holder, self.leader.token)
            self.store.commit_tick(
                self.tick_no, now, result.state, processed, rows, marks=marks, view=view, lease=lease
            )
        except BaseException:
            self.views.forget()  # unknown what the store holds now: the next tick rewrites every node
            raise
        if slurm_ok:
            self._background = ()  # committed with this tick (log rows) and seen by its core
        if view is not None:
            self.views.accept(view)
            self._explained = (self.tick_no, result)
        self.state = result.state
        if slurm_ok:
            self._failed_actions = tuple(
                FailedAction(r.action.kind, _action_node(r.action), r.detail) for r in report.failed
            )
            self._publish_gate(now)
        scrape_errors = sum(1 for s in samples.values() if s.error) if not reused else 0
        if slurm_ok and result.ledger:
            self.stats.set_ledger(self.store.ledger_totals())
        if slurm_ok:
            self.stats.record_tick(
                TickSnapshot(self.tick_no, now, duration, result, report, slurm_ok, scrape_errors)
            )
        with self._live_lock:
            self._live.update(last_attempt=now, slurm_ok=slurm_ok, tick=self.tick_no)
        with self._ticked:
            self._last_tick_started = now
            self._ticked.notify_all()
        log.info(
            "tick",
            extra={
                "fy": {
                    "tick": self.tick_no,
                    "slurm_ok": slurm_ok,
                    "push": push,
                    "reused_samples": reused,
                    "nodes": len(nodes),
                    "scrape_errors": scrape_errors,
                    "events_in": len(pending),
                    "actions": len(result.plan.actions),
                    "holds": len(result.plan.holds),
                    "slurm_calls": report.calls,
                    "failed": len(report.failed),
                    "duration_s": round(duration, 4),
                }
            },
        )
        return TickOutcome(self.tick_no, slurm_ok, result, report, samples, duration, reused)

    # -- intake (what the core hears besides Slurm and the GPUs) ----------------------------------------

    def _intake(self, nodes: Mapping[str, SlurmNode], now: float) -> intake_mod.Intake:
        """Canary results, gate decisions, job outcomes: each builder contained (a failure is logged and
        that builder contributes nothing this tick)."""
        out = intake_mod.Intake()
        users = getattr(self.slurm, "node_details", {}) or {}
        builders: list[tuple[str, Callable[[], None]]] = [
            (
                "canaries",
                lambda: intake_mod.canaries(self.slurm, self.store, now, self.config.canary.lookback_s, out),
            ),
            (
                "outcomes",
                lambda: intake_mod.outcomes(
                    self.slurm, self.store, now, self.config.outcomes.sacct_state, out
                ),
            ),
        ]
        if self.gate is not None:
            builders.append(
                (
                    "gate",
                    lambda: intake_mod.gate(
                        self.gate.get(),
                        self.store,
                        nodes,
                        now,
                        out,
                        users=users,
                        open_ids=frozenset(
                            p.proposal_id for p in getattr(self.state, "proposals", {}).values()
                        ),
                    ),
                )
            )
        for name, build in builders:
            try:
                build()
            except Exception as exc:
                log.exception("intake %s failed; nothing from it this tick", name)
                out.rows.append(LogRow(now, "intake_failed", "", f"{name}: {exc!r}"))
        return out

    def _attest_intake(self, now: float) -> None:
        """Failed attestation verdicts into the inbox as ``attestation_failed`` FatalEvents, one per verdict
        (its id names the verdict, so a later tick re-offering it is a duplicate): the core quarantines the
        node through the same path as a fatal XID. A failure is logged; the tick goes on without them."""
        assert self.attest is not None
        try:
            events = [attestation_event(n, why, doc) for n, why, doc in self.attest.quarantine_candidates()]
            new, _dup = self.store.put_events(events, received_at=now) if events else (0, 0)
        except Exception:
            log.exception("attestation verdicts unreadable; none taken this tick")
            return
        if new:
            log.warning("attestation failures queued", extra={"fy": {"new": new, "nodes": len(events)}})

    def _publish_gate(self, now: float) -> None:
        """Count open proposals for the metrics; log them every PENDING_LOG_INTERVAL_S."""
        if self.gate is None:
            return
        try:
            pending = self.gate.get().pending()
        except Exception:
            log.exception("cannot read open proposals")
            return
        self.stats.set_gauge("proposals_pending", len(pending))
        if pending and now - self._pending_logged_at >= PENDING_LOG_INTERVAL_S:
            self._pending_logged_at = now
            for p in pending:
                log.warning(
                    "drain proposal waiting for an admin",
                    extra={
                        "fy": {
                            "proposal_id": p.id,
                            "node": p.node,
                            "risk": p.risk,
                            "affected_jobs": list(p.affected_jobs),
                            "expires_in_s": round(p.expires_at - now),
                        }
                    },
                )

    # -- the loop -------------------------------------------------------------------------------------

    def explain(self, node: str) -> tuple[int, dict[str, Any], str] | None:
        """(tick, explain_dict document, text) of ``node`` from the last committed tick's live result
        (the API's explanations: exact, computed on demand instead of for every node every tick)."""
        explained = self._explained
        if explained is None or node not in explained[1].nodes:
            return None
        doc = explain_dict(node, explained[1])
        return explained[0], doc, explain_text(doc)

    def wait_tick_after(self, since: float, timeout_s: float) -> bool:
        """Block until a tick that started at or after ``since`` (clock time) has committed, or the timeout.

        The push listener calls it after waking the loop on a failed attestation verdict, so that the
        node's drain is applied before the verdict goes back to the Epilog that asked: Slurm gives a node
        to the next job only once its Epilog has finished, so the drain then always comes first."""
        deadline = self.monotonic() + timeout_s
        with self._ticked:
            while self._last_tick_started < since:
                left = deadline - self.monotonic()
                if left <= 0 or self.stop_event.is_set():
                    return False
                self._ticked.wait(min(left, 0.1))
        return True

    def live(self) -> dict[str, Any]:
        with self._live_lock:
            return {**self._live, "dry_run": self.dry_run, "lease": self.leader.status()}

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def run(self) -> None:
        """Tick every ``interval_s`` (or at once when woken) until ``stop()``; errors back off."""
        loop = self.config.loop
        backoff = Backoff(loop.backoff_initial_s, loop.backoff_max_s, loop.backoff_factor)
        next_due = self.monotonic()
        renewals = None
        if isinstance(self.leader, Leadership):  # two controllers: renew (or try to take) the lease apart
            self.leader.renew()
            renewals = threading.Thread(
                target=self.leader.run, args=(self.stop_event, self.wake), name="lease", daemon=True
            )
            renewals.start()
        try:
            self._loop(loop, backoff, next_due)
        finally:
            self.stop_event.set()
            if renewals is not None:
                renewals.join(timeout=10)
            self.leader.release()
        log.info("stopped", extra={"fy": {"tick": self.tick_no}})

    def _loop(self, loop: Any, backoff: Backoff, next_due: float) -> None:
        while not self.stop_event.is_set():
            self.wake.wait(timeout=max(0.0, next_due - self.monotonic()))
            if self.stop_event.is_set():
                break
            push = self.wake.is_set()
            self.wake.clear()
            if not self.leader.leading:  # standby: the API serves the store; the lease thread wakes us
                next_due = self.monotonic() + loop.interval_s
                continue
            try:
                if isinstance(self.leader, Leadership) and self.leader.gained.is_set():
                    self.leader.gained.clear()
                    stored = self._resume()  # the previous leader's last commit
                    log.info(
                        "took over",
                        extra={
                            "fy": {
                                "tick": self.tick_no,
                                "token": self.leader.token,
                                "saved_at": stored.time if stored else None,
                            }
                        },
                    )
                with collect_after():  # the collector runs after the tick, not inside it (gcpolicy.py)
                    self.tick_once(push=push)
            except Exception as exc:
                delay = backoff.failure()
                self.stats.record_failure()
                with self._live_lock:
                    self._live.update(consecutive_failures=backoff.failures, last_error=repr(exc))
                log.exception(
                    "tick failed", extra={"fy": {"failures": backoff.failures, "retry_in_s": delay}}
                )
                next_due = self.monotonic() + delay
                continue
            if backoff.failures:
                log.info("tick recovered", extra={"fy": {"after_failures": backoff.failures}})
            backoff.success()
            with self._live_lock:
                self._live.update(consecutive_failures=0, last_error=None)
            if not push:
                next_due = self.monotonic() + loop.interval_s


def attestation_event(node: str, reason: str, verdict: Mapping[str, Any]) -> FatalEvent:
    """The FatalEvent of one failed verdict. ``reason`` is ``AttestService.quarantine_candidates``'
    ``fleetyield: attestation failed (<records>)``; the event's message is the part in parentheses (the
    core puts it back the same way: one drain reason whichever path reports the failure)."""
    detail = reason.removeprefix("fleetyield: attestation failed (").removesuffix(")")
    return FatalEvent(
        event_id=f"attest:{node}:{verdict.get('time')!r}:{str(verdict.get('nonce', ''))[:16]}",
        node=node,
        time=float(verdict.get("time") or 0.0),
        kind=ATTESTATION_FAILED,
        message=detail,
        source="attest",
    )


def _action_node(action: Any) -> str:
    node = getattr(action, "node", None)
    return node if isinstance(node, str) else ",".join(getattr(action, "nodes", ()))


# --------------------------------------------------------------------------------------------------------
# Wiring
# --------------------------------------------------------------------------------------------------------


@dataclass
class Runtime:
    """Everything ``fleetyield run`` starts, so it can be stopped in order."""

    daemon: Daemon
    store: Store
    servers: list[Any]
    closers: list[Callable[[], None]]

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        for close in self.closers:
            close()
        self.store.close()


def build_slurm_rest(config: Config, cli: SlurmCli) -> SlurmRest:
    """``[slurm] adapter = "rest"``: slurmrestd with the JWT of ``rest_token_file``; ``cli`` for the rest."""
    assert config.slurm.rest_url and config.slurm.rest_token_file  # the config validator requires them
    return SlurmRest(
        config.slurm.rest_url,
        config.slurm.rest_user,
        TokenFile(config.slurm.rest_token_file),
        cli,
        timeout_s=config.slurm.command_timeout_s,
    )


def build(
    config: Config,
    *,
    dry_run: bool | None = None,
    slurm: SlurmPort | None = None,
    sense: SensePort | None = None,
) -> Runtime:
    """Wire the real adapters from ``config`` (ports may be injected, e.g. a recording Slurm runner)."""
    from node_agent.httpd import ListenerCollector
    from slurm_fleetyield.adapters.api import ApiServer, StoreReadModel
    from slurm_fleetyield.adapters.ingest import IngestServer

    dry = config.slurm.dry_run if dry_run is None else dry_run
    # a web-config file that cannot be used stops the start before anything opens (ConfigError)
    push_web = load_listener_web_config("push", config.push.web_config_file)
    api_web = load_listener_web_config("api", config.api.web_config_file)
    agent_client = build_agent_client(config)
    store = Store(config.store.target, events_keep=config.store.events_keep)
    leader: Leader | None = None
    if config.store.url:
        leader = Leadership(
            store, config.store.controller_id, ttl_s=config.store.lease_ttl_s, renew_s=config.store.renew_s
        )
    closers: list[Callable[[], None]] = []
    if slurm is None:
        slurm = SlurmCli(
            config.slurm.bin_dir,
            config.slurm.command_timeout_s,
            canary=CanarySpec(
                command=config.canary.rendered_command,
                constraint=config.canary.constraint,
                time_limit_s=config.canary.time_limit_s,
                partition=config.canary.partition,
            ),
        )
        if config.slurm.adapter == "rest":
            slurm = build_slurm_rest(config, slurm)  # type: ignore[assignment]
    if dry and not isinstance(slurm, DryRunSlurm):
        slurm = DryRunSlurm(slurm)  # type: ignore[arg-type]
    if sense is None:
        sense, close_sense = build_sense(config, agent_client)
        closers.append(close_sense)
    stats = ControllerStats()
    control = None
    control_secret = config.control.secret_file or config.push.secret_file
    if control_secret:
        field = "control.secret_file" if config.control.secret_file else "push.secret_file"
        control = AgentControl(
            config.control.url_template,
            read_secret(control_secret, field),
            timeout_s=config.control.timeout_s,
            client=agent_client,
        )
    gate = GateAccess(
        config.gate_dir,
        url=config.gate_url,
        lease=None if leader is None else lambda: _held(leader),
    )
    closers.append(gate.close)
    try:
        _check_audit(gate)
    except BaseException:
        for close in closers:
            close()
        store.close()
        raise
    holder: list[Daemon] = []
    redfish = build_redfish(config, slurm, gate, lambda: holder[0], dry_run=dry)
    if redfish is not None:
        closers.insert(0, redfish.close)  # let a power cycle in flight finish (bounded) before the rest
    attest = build_attest(config)
    if attest is not None:
        closers.append(attest.store.close)
    daemon = Daemon(
        config,
        slurm,
        sense,
        store,
        stats=stats,
        dry_run=dry,
        control=control,
        gate=gate,
        redfish=redfish,
        attest=attest,
        leader=leader,
    )
    holder.append(daemon)
    servers: list[Any] = []
    if config.push.active or config.alertmanager.active:
        ingest = IngestServer(
            config.push.host,
            config.push.port,
            read_secret(config.push.secret_file or "") if config.push.active else None,
            store,
            daemon.wake,
            max_body_bytes=config.push.max_body_bytes,
            max_skew_s=config.push.max_skew_s,
            on_accept=lambda n: stats.add("push_accepted", n),
            on_unauthenticated=stats.unauthenticated,
            gate_dir=config.gate_dir,
            gate_url=config.gate_url,
            authorized_keys=config.gate.authorized_keys,
            alertmanager=build_alertmanager(config),
            attest=attest,
            drain_xids=frozenset(config.core.quarantine.quarantine_xids),
            settle=daemon.wait_tick_after if attest is not None else None,
            max_connections=config.push.max_connections,
            web=push_web,
        )
        servers.append(ingest)
    named: list[tuple[str, Any]] = [("push", servers[0])] if servers else []
    registry = make_registry(stats)
    registry.register(ListenerCollector("fleetyield", lambda: [(name, s.httpd) for name, s in named]))
    if config.api.enabled:
        api = ApiServer(
            config.api.host,
            config.api.port,
            StoreReadModel(
                store, daemon.live, gate_dir=config.gate_dir, gate_url=config.gate_url, explain=daemon.explain
            ),
            registry,
            stale_after_s=max(10 * config.loop.interval_s, 60.0),
            attest_gate=_attest_gate(attest, config.attest.max_age_s) if attest is not None else None,
            max_connections=config.api.max_connections,
            web=api_web,
            on_unauthenticated=stats.unauthenticated,
        )
        servers.append(api)
        named.append(("api", api))
    return Runtime(daemon, store, servers, closers)


def build_agent_client(config: Config) -> Any:
    """How the scraper and the reset client authenticate to agents (``sense.basic_auth``,
    ``sense.tls_config``; ``node_agent.httpclient``), or None; an unusable file is a ``ConfigError``."""
    client_cfg = config.sense.client()
    if client_cfg is None:
        return None
    from node_agent.httpclient import ClientConfigError, HttpClient
    from slurm_fleetyield.config import ConfigError

    try:
        return HttpClient(client_cfg, "sense.")
    except ClientConfigError as exc:
        raise ConfigError(exc.file, [exc.problem]) from None


def load_listener_web_config(section: str, path: str | None) -> Any:
    """``[section] web_config_file`` loaded (``node_agent.webconfig``), or None when unset; a file that
    cannot be used is a ``ConfigError`` naming the file, the field and the value."""
    if path is None:
        return None
    from node_agent.webconfig import WebConfigError, load_web_config
    from slurm_fleetyield.config import ConfigError

    try:
        return load_web_config(path)
    except WebConfigError as exc:
        raise ConfigError(path, [f"{section}.web_config_file: {exc.problem}"]) from None


def check_files(config: Config) -> tuple[list[ConfigError], list[str]]:
    """(errors, warnings) of the files ``config`` names, opened the way ``build`` opens them before the first
    tick: every error here is one ``run`` refuses to start with (``fleetyield validate-config``, the unit's
    ExecStartPre, reports them all at once, file and field named, instead of a crash loop).

    Errors: the push and control secrets (``read_secret``: mode, length), the listeners' web-config files,
    the scraper's client files (``sense.basic_auth``/``tls_config``), the Alertmanager token, with
    ``[attest]`` its policy and signing key, with ``[redfish]`` the Redfish client. Warning only:
    ``gate.authorized_keys`` that does not parse or is writable by others. ``run`` starts with it (the file is
    re-read at every approval, so a fix needs no restart, and until then approvals are refused while fatal
    faults are still drained): refusing the start for it would stop those drains over an admin-key typo."""
    errors: list[ConfigError] = []

    def attempt(open_it: Callable[[], object]) -> None:
        try:
            open_it()
        except ConfigError as exc:
            errors.append(exc)

    if config.push.active:
        attempt(lambda: read_secret(config.push.secret_file or ""))
    if config.control.secret_file:
        attempt(lambda: read_secret(config.control.secret_file or "", "control.secret_file"))
    attempt(lambda: load_listener_web_config("push", config.push.web_config_file))
    attempt(lambda: load_listener_web_config("api", config.api.web_config_file))
    attempt(lambda: build_agent_client(config))
    attempt(lambda: build_alertmanager(config))
    if config.attest.enabled:
        attempt(lambda: _attest_policy_and_key(config))
    if config.redfish.enabled:
        attempt(_require_sushy)
    warnings: list[str] = []
    if config.gate.authorized_keys:
        from slurm_fleetyield.gate.errors import KeyFileError
        from slurm_fleetyield.gate.keys import load_authorized_keys

        try:
            load_authorized_keys(config.gate.authorized_keys)
        except KeyFileError as exc:
            line = f" (line {exc.line})" if exc.line is not None else ""
            warnings.append(
                f"{exc.path}: gate.authorized_keys{line}: {exc.message}; every approval is refused until "
                "it is fixed (re-read at each approval, no restart needed)"
            )
    return errors, warnings


def _held(leader: Leader) -> tuple[str, int] | None:
    """(holder, token) of the lease this controller holds; None as a standby."""
    token = getattr(leader, "token", None)
    return None if token is None else (leader.holder, token)


def _check_audit(gate: GateAccess) -> None:
    """The gate's audit chain, verified before the first decision is appended to it: an edited, deleted or
    truncated row stops the start (``GateError`` naming gate.db and the first bad seq), so no new decision is
    chained onto a log that no longer proves what happened."""
    from slurm_fleetyield.gate.errors import GateError

    gk = gate.get()
    report = gk.verify_audit()
    if not report.ok:
        raise GateError(
            f"{gk.db_path}: audit chain broken at seq {report.first_bad_seq} ({report.code}): "
            f"{report.problem}. "
            "Refusing to start; inspect with `fleetyield audit verify`, restore gate.db from backup"
        )


def build_attest(config: Config) -> AttestService | None:
    """The attestation service (enrolments, nonces, verdicts) when ``[attest]`` is enabled; a policy or key
    that cannot be used is a ``ConfigError`` naming the file."""
    at = config.attest
    if not at.enabled:
        return None
    from slurm_fleetyield.attest.store import AttestStore, AttestStoreError
    from slurm_fleetyield.attest.verify import AttestService
    from slurm_fleetyield.config import ConfigError

    policy, key = _attest_policy_and_key(config)
    try:
        store = AttestStore(config.store.url or at.db)  # PostgreSQL: verdicts survive a takeover
    except (OSError, sqlite3.Error, AttestStoreError) as exc:
        raise ConfigError(at.db, [f"attest.db: {exc}"]) from None
    return AttestService(store, policy, key, nonce_ttl_s=at.nonce_ttl_s)


def _attest_policy_and_key(config: Config) -> tuple[Any, Any]:
    """The enabled ``[attest]`` section's policy and signing key, loaded (a ``ConfigError`` naming the file
    that cannot be used); opens no store."""
    from slurm_fleetyield.attest.policy import PolicyError, load_policy
    from slurm_fleetyield.gate.errors import GateError
    from slurm_fleetyield.gate.keys import load_private_key

    at = config.attest
    assert at.policy is not None and at.key is not None  # AttestConfig's validator
    try:
        policy = load_policy(at.policy)
    except PolicyError as exc:
        raise ConfigError(at.policy, [f"attest.policy: {exc}"]) from None
    try:
        key = load_private_key(at.key)
    except (GateError, OSError, ValueError) as exc:
        raise ConfigError(at.key, [f"attest.key: {exc}"]) from None
    return policy, key


def _attest_gate(attest: AttestService, max_age_s: float) -> Callable[[str, float], tuple[bool, str]]:
    return lambda node, now: attest.gate(node, now, max_age_s)


def build_redfish(
    config: Config,
    slurm: SlurmPort,
    gate: GateAccess,
    daemon: Callable[[], Daemon],
    *,
    dry_run: bool,
) -> RedfishExecutor | None:
    """The ladder's power-cycle executor, when ``[redfish]`` is enabled. Safety is read from Slurm at each
    action (never power-cycle a node with running jobs unless it is quarantined); every action is audited
    in the gate's hash-chained log and rate-limited fleet-wide through a token bucket file."""
    if not config.redfish.enabled:
        return None
    from slurm_fleetyield.adapters.bmc_ratelimit import TokenBucket
    from slurm_fleetyield.adapters.redfish import (
        PerThreadAudit,
        PowerController,
        RedfishExecutor,
        default_rate_limit_state,
        slurm_safety,
    )
    from slurm_fleetyield.core.lifecycle import DRAINED_STAGES

    _require_sushy()

    def quarantined(node: str) -> bool:
        memory = daemon().state.lifecycle.get(node)
        return memory is not None and memory.stage in DRAINED_STAGES

    rf = config.redfish
    power = PowerController(
        rf,
        safety=slurm_safety(slurm, quarantined),
        audit=PerThreadAudit(lambda: gate.get().audit),
        bucket=TokenBucket(
            rf.rate_limit_actions,
            rf.rate_limit_window_s,
            state_path=rf.rate_limit_state or default_rate_limit_state(config.gate_dir),
        ),
    )
    return RedfishExecutor(power, dry_run=dry_run)


def _require_sushy() -> None:
    """``[redfish] enabled`` needs the Redfish client (the ``controller`` extra): else a ``ConfigError``."""
    from slurm_fleetyield.adapters.redfish import BmcConfigError, require_sushy

    try:
        require_sushy()
    except BmcConfigError as exc:
        raise ConfigError("[redfish]", [str(exc)]) from None


def build_sense(config: Config, client: Any = None) -> tuple[SensePort, Callable[[], None]]:
    """The sense adapter ``sense.mode`` names, and how to close it."""
    if config.sense.mode == "prometheus":
        from slurm_fleetyield.adapters.prometheus import PrometheusSense

        p = config.prometheus
        token = (
            read_secret(p.bearer_token_file, "prometheus.bearer_token_file", min_bytes=1).decode()
            if p.bearer_token_file
            else None
        )
        prom = PrometheusSense(
            p.url,
            node_label=p.node_label,
            selector=p.selector,
            extra_fields=p.extra_fields,
            timeout_s=p.timeout_s,
            nodes_per_query=p.nodes_per_query,
            concurrency=p.concurrency,
            bearer_token=token,
        )
        return prom, prom.close
    from slurm_fleetyield.adapters.scrape import AgentScraper

    scraper = AgentScraper(
        config.sense.url_template,
        config.sense.timeout_s,
        config.sense.concurrency,
        check_hostname=config.sense.check_hostname,
        client=client,
    )
    return scraper, scraper.close


def build_alertmanager(config: Config) -> Any:
    """Alertmanager's webhook receiver when ``alertmanager.token_file`` is set, else None."""
    am = config.alertmanager
    if am.token_file is None:
        return None
    from slurm_fleetyield.adapters.alertmanager import AlertmanagerWebhook, read_token

    return AlertmanagerWebhook(
        read_token(am.token_file),
        node_labels=am.node_labels,
        max_body_bytes=am.max_body_bytes,
        stale_after_s=am.stale_after_s,
    )


def serve(runtime: Runtime, *, once: bool = False) -> TickOutcome | None:
    """Start listeners, run until SIGTERM/SIGINT (or one tick with ``once``), then shut down cleanly."""
    for server in runtime.servers:
        server.start()
        log.info("listening", extra={"fy": {"server": type(server).__name__, "port": server.port}})
    try:
        if once:
            return runtime.daemon.tick_once()
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda signum, frame: runtime.daemon.stop())
        try:
            runtime.daemon.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return None
    finally:
        runtime.close()
