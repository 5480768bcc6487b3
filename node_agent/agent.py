"""The agent core shared by the server and the offline CLI: backend + fatal marker + push + scenario.

Input: a started backend, the state dir, node name, a clock, an optional ``Pusher`` and
scenario. Output: operations (inject / clear / list / reset / check / tick) that mutate the
backend, keep ``STATE_DIR/fatal.json`` in step, and hand every resulting ``AgentEvent`` to
the pusher (or, offline, to the spool). One lock serialises operations and scrapes.

Fatal marker rules: fatal XIDs and ``gpu_missing`` add entries (``reset_fixes`` from the
fault spec); a GPU reset drops that GPU's reset-fixable entries; ``fault clear`` drops the
entries of the cleared faults; a failed active check adds a ``check_failed`` entry
(not reset-fixable) that the next passing check of that GPU removes.

XID storms: the same XID repeating on a GPU within ``fold_window_s`` of its first report is that
event again: counted (``folded``), not pushed, spooled or marked a second time (a driver can log
thousands of XID 95s for one fault). The scrape's XID counters still count every one. A GPU
reset or ``fault clear`` ends the GPU's folds: an XID after it is new evidence.

Backend calls at scrape time and resets go through ``guard`` (``node_agent.supervise.Guard``): each has a
deadline, and a hung one makes ``health()`` report the node's GPU data stale. The backend's own loops (NVML's
slow-counter refresher and XID thread) are watched by their heartbeats: ``health()`` names a stale one.
"""

from __future__ import annotations

import threading
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node_agent import fatal
from node_agent.backends.base import Backend, BackendError
from node_agent.backends.fake import FakeBackend
from node_agent.check import CheckReport, run_fake_check
from node_agent.faults import CorruptFault, DegradeFault, XidFault
from node_agent.protocol import AgentEvent
from node_agent.push import Pusher, spool_event
from node_agent.scenario import Scenario, ScenarioRunner
from node_agent.state import ScenarioProgress
from node_agent.supervise import Guard

RESET_DEADLINE_S = 150.0
"""A GPU reset: nvidia-smi's own 120 s timeout (backends/nvml.py) and margin."""

Spec = XidFault | DegradeFault | CorruptFault


class Agent:
    def __init__(
        self,
        backend: Backend,
        state_dir: Path,
        node: str,
        clock: Callable[[], float],
        pusher: Pusher | None = None,
        scenario: Scenario | None = None,
        seed: int = 0,
        fold_window_s: float = 300.0,
        guard: Guard | None = None,
    ) -> None:
        self.backend = backend
        self.fold_window_s = fold_window_s
        self.folded: dict[tuple[int | None, int], list[float]] = {}  # (gpu, xid) -> [first time, repeats]
        self.state_dir = Path(state_dir)
        self.node = node
        self.clock = clock
        self.pusher = pusher
        self.scenario = scenario
        self.seed = seed
        self.lock = threading.RLock()
        self.runner: ScenarioRunner | None = None
        self.attest_factory: Callable[[Agent], Any] | None = None  # set by the server (exporter.py)
        self._attestor: Any = None
        self.guard = guard or Guard()  # every scrape-time and reset call into the backend is bounded
        backend.set_event_callback(self.handle_events)

    @property
    def attestor(self) -> Any:
        """The node's ``node_agent.attest.service.Attestor``, built on first use: the attest package pulls
        in ``cryptography`` (a few MB of RSS) that an agent nobody asks to attest should not pay for.
        Without an ``attest_factory`` (offline CLI): default settings, no controller."""
        with self.lock:
            if self._attestor is None:
                if self.attest_factory is not None:
                    self._attestor = self.attest_factory(self)
                else:
                    from node_agent.attest.service import Attestor

                    self._attestor = Attestor(self)
            return self._attestor

    def health(self) -> list[str]:
        """What is wrong now (empty: healthy): a stuck backend call, a supervised thread failing or dead, a
        backend loop that finished no round for too long."""
        problems = []
        stuck = self.guard.stuck()
        if stuck:
            problems.append(f"{stuck}: GPU data is stale")
        for sup in self.backend.supervised():
            if not sup.up:
                problems.append(f"{sup.name} is not running ({sup.last_error or 'stopped'})")
            elif sup.failing:
                problems.append(f"{sup.name} failing, restarted {sup.restarts}x: {sup.last_error}")
        problems.extend(why for beat in self.backend.heartbeats() if (why := beat.stale()))
        return problems

    # ------------------------------------------------------------ lifecycle
    def start_scenario(self, now: float) -> None:
        if self.scenario is None:
            return
        fake = self._fake()
        state = fake.state
        assert state is not None
        timeline = self.scenario.resolve(self.seed, len(state.gpus))
        progress = state.scenarios.get(self.scenario.digest)
        if progress is None:
            progress = ScenarioProgress(started_at=now)
            state.scenarios[self.scenario.digest] = progress
            fake._save()
        self.runner = ScenarioRunner(timeline, progress.started_at, progress.applied)

    def tick(self, now: float) -> list[dict]:
        """Apply scenario faults due at ``now``; returns what was injected."""
        if self.runner is None or self.scenario is None:
            return []
        with self.lock:
            out = []
            for at, spec in self.runner.due(now):
                out.append(self._inject(spec, at))
            if out:
                fake = self._fake()
                assert fake.state is not None
                fake.state.scenarios[self.scenario.digest].applied = self.runner.applied
                fake._save()
            return out

    # ------------------------------------------------------------ events & marker
    def _fold(
        self, events: list[AgentEvent]
    ) -> tuple[list[AgentEvent], dict[tuple[int | None, int], list[float]]]:
        """The events that are news (an XID repeating on its GPU within the window is counted instead), and
        the folds to record once they are handled: an event whose handling failed (ENOSPC writing the
        marker) is news again when it is retried."""
        out = []
        folds = {k: list(v) for k, v in self.folded.items()}
        for e in events:
            if e.kind == "xid" and e.xid is not None:
                fold = folds.get((e.gpu, e.xid))
                if fold is not None and 0.0 <= e.time - fold[0] <= self.fold_window_s:
                    fold[1] += 1
                    continue
                folds[(e.gpu, e.xid)] = [e.time, 0]
            out.append(e)
        return out, folds

    def _unfold(self, gpu: int | None) -> None:
        for key in [k for k in self.folded if gpu is None or k[0] == gpu]:
            del self.folded[key]

    def handle_events(self, events: list[AgentEvent], reset_fixes: bool = True) -> None:
        with self.lock:
            events, folds = self._fold(events)
            if not events:
                self.folded = folds
                return
            new = [e for e in events if e.fatal and e.kind in ("xid", "gpu_missing", "check_failed")]
            if new:
                pending = fatal.read_pending(self.state_dir)
                pending = [p for p in pending if p.get("kind") != "marker_unreadable"]
                known = {p.get("event_id") for p in pending}
                for e in new:
                    if e.event_id in known:
                        continue
                    fixes = reset_fixes and not (e.kind == "xid" and e.xid == 64) and e.kind != "check_failed"
                    pending.append(
                        {
                            "event_id": e.event_id,
                            "time": e.time,
                            "gpu": e.gpu,
                            "uuid": e.uuid,
                            "kind": e.kind,
                            "xid": e.xid,
                            "reset_fixes": fixes,
                            "message": e.message,
                        }
                    )
                fatal.write_pending(self.state_dir, self.node, pending, self.clock())
            if self.pusher is not None:
                self.pusher.enqueue(events)
            else:
                for e in events:
                    spool_event(self.state_dir, e)
            self.folded = folds

    def _drop_pending(self, keep: Callable[[dict], bool]) -> int:
        pending = fatal.read_pending(self.state_dir)
        kept = [p for p in pending if p.get("kind") != "marker_unreadable" and keep(p)]
        if len(kept) != len(pending) or not (self.state_dir / fatal.FATAL_FILE).exists():
            fatal.write_pending(self.state_dir, self.node, kept, self.clock())
        return len(pending) - len(kept)

    # ------------------------------------------------------------ operations
    def _fake(self) -> FakeBackend:
        if not isinstance(self.backend, FakeBackend):
            raise BackendError(
                f"fault injection needs the fake backend (this agent runs {self.backend.name})"
            )
        return self.backend

    def inject(self, spec: Spec) -> dict[str, Any]:
        with self.lock:
            return self._inject(spec, self.clock())

    def _inject(self, spec: Spec, now: float) -> dict[str, Any]:
        fault, events = self._fake().inject(spec, now)
        self.handle_events(events, reset_fixes=spec.fixed_by_reset())
        return {
            "fault_id": fault.fault_id,
            "gpu": spec.gpu,
            "events": [e.model_dump(mode="json") for e in events],
        }

    def list_faults(self, gpu: int | None = None) -> list[dict]:
        with self.lock:
            return self._fake().list_faults(gpu)

    def clear(self, gpu: int | None = None, fault_id: str | None = None) -> dict[str, Any]:
        with self.lock:
            removed = self._fake().clear(self.clock(), gpu=gpu, fault_id=fault_id)
            ids = {eid for f in removed for eid in f.event_ids}
            self._unfold(gpu)
            dropped = self._drop_pending(lambda p: p.get("event_id") not in ids)
            return {"cleared": [f.fault_id for f in removed], "fatal_entries_dropped": dropped}

    def reset(self, gpu: int) -> dict[str, Any]:
        with self.lock:
            now = self.clock()
            events = self.guard.call(self.backend.reset_gpu, gpu, now, timeout_s=RESET_DEADLINE_S)
            dropped = self._drop_pending(lambda p: not (p.get("gpu") == gpu and p.get("reset_fixes")))
            self._unfold(gpu)
            self.handle_events(events)
            return {
                "gpu": gpu,
                "fatal_entries_dropped": dropped,
                "events": [e.model_dump(mode="json") for e in events],
            }

    def check(self, gpu: int | None = None, diag_level: int = 0) -> CheckReport:
        """The active check: the fake's simulated compute, or on real GPUs ``node_agent.cuda_check`` (run
        outside the agent lock: a kernel per GPU and dcgmi diag take seconds to minutes, scrapes go on)."""
        if isinstance(self.backend, FakeBackend):
            with self.lock:
                report = run_fake_check(self.backend, self.clock(), gpu)
        else:
            report = self._real_check(gpu, diag_level)
        now = report.time
        with self.lock:
            events = []
            for r in report.results:
                if r.status == "pass":
                    self._drop_pending(
                        lambda p, i=r.gpu: not (p.get("kind") == "check_failed" and p.get("gpu") == i)
                    )
                else:
                    events.append(
                        AgentEvent(
                            event_id=str(uuidlib.uuid4()),
                            time=now,
                            node=self.node,
                            gpu=r.gpu,
                            uuid=r.uuid,
                            kind="check_failed",
                            xid=None,
                            fatal=True,
                            message=f"active check {r.status}: {r.detail}",
                        )
                    )
            if report.diag is not None and not report.diag.ok:
                events.append(
                    AgentEvent(
                        event_id=str(uuidlib.uuid4()),
                        time=now,
                        node=self.node,
                        gpu=None,
                        uuid=None,
                        kind="check_failed",
                        xid=None,
                        fatal=True,
                        message=f"active check: {report.diag.detail}",
                    )
                )
            if events:
                self.handle_events(events, reset_fixes=False)
            return report

    def _real_check(self, gpu: int | None, diag_level: int) -> CheckReport:
        from node_agent.cuda_check import run_cuda_check

        infos = self.backend.infos()
        started_here = False
        if not infos:  # the CLI without a running server: enumerate the GPUs with NVML for this check
            try:
                self.backend.start()
            except BackendError as exc:
                return CheckReport(
                    node=self.node,
                    ok=False,
                    time=self.clock(),
                    results=[],
                    unavailable=f"no compute path: {exc}",
                )
            started_here = True
            infos = self.backend.infos()
        try:
            return run_cuda_check(self.node, infos, self.clock(), gpu, seed=self.seed, diag_level=diag_level)
        finally:
            if started_here:
                self.backend.stop()
