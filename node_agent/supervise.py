"""Keeping the agent's background work alive and its GPU calls bounded (issue 27 items 2 and 6).

``Supervised``: runs ``target(stop)`` on a thread and restarts it after an exception, waiting 0.5 s, then
twice as long each time up to 30 s; ``ok()`` from the target resets the wait. The NVML XID thread runs under
it: one EMFILE or ENOSPC in its callback used to end it for good while /healthz said ok. Output:
``status()`` (up, failing, restarts, last error) for /healthz and ``fleetyield_agent_thread_*``.

``Guard``: every call into the GPU backend goes through one worker thread with a deadline. A call past its
deadline (a hung NVML call: a wedged GPU or driver) makes the guard *stuck*: that call is abandoned to its
thread and every later call fails at once with ``BackendStuck`` until it returns, so a hung device costs one
thread, not one per scrape, and the agent lock is held at most one deadline. /metrics then answers 503 (the
controller's scrape fails: the node is UNKNOWN, never healthy on stale numbers) and /healthz says why.

``Heartbeat``: the NVML backend's own loops (the slow-counter refresher, the XID event wait) call NVML on
their threads, outside the guard: a call that hangs there would serve the last counters as if fresh, or
stop XID delivery, while every scrape answers 200. Each loop ``beat()``s when it finishes a round (an
injectable monotonic clock); one that has not for ``STALE_FACTOR`` times its interval is *stale*. A stale
loop is reported by ``Agent.health`` (/healthz 503) and fails the scrape like a stuck guard does
(``GpuCollector`` raises ``BackendStuck``, /metrics answers 503). Why 503 and not dropping the stale series:
the controller reads a failed scrape as UNKNOWN (adapters/scrape.py, core/sense.py), but a missing series
as "no contribution" from a node that is otherwise fresh, so the risk signals the slow counters feed
(PCIe replays, thermal and power throttling) and the XID counters would go quiet on a node still read as
healthy. A hung NVML call is a wedged GPU or driver: no number from that node is evidence. XIDs that the
event thread already delivered are pushed regardless; the loop's recovery (its call returns) beats again
and the next scrape is fresh. ``pause()``: a ``Supervised`` thread waiting out its backoff is idle on
purpose and reported as failing instead, not as stale.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
CALL_TIMEOUT_S = 5.0
"""A read of every GPU takes ~6 ms per GPU on an H200 (bench/bench_nvml_calls.py): 5 s is a hung call."""
STALE_FACTOR = 3.0
"""A loop is stale after this many of its intervals without a finished round: one slow round (a busy CPU,
a scrape holding the agent lock) is not a hang, three in a row are."""


class Heartbeat:
    """When a backend loop last finished a round, and whether that is too long ago (module docstring)."""

    def __init__(
        self,
        name: str,
        feeds: str,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        factor: float = STALE_FACTOR,
    ) -> None:
        self.name = name
        self.feeds = feeds  # what goes stale with it, for the message
        self.stale_after_s = factor * interval_s
        self._clock = clock
        self._last = clock()
        self._paused = False

    def beat(self) -> None:
        self._last = self._clock()
        self._paused = False

    def pause(self) -> None:
        """Idle on purpose until the next ``beat()`` (a supervised thread's backoff): not stale meanwhile."""
        self._paused = True

    def age(self) -> float:
        """Seconds since the last finished round."""
        return max(0.0, self._clock() - self._last)

    def stale(self) -> str | None:
        """Why the loop's data is stale ("... no round for 42 s"), or None."""
        age = self.age()
        if self._paused or age <= self.stale_after_s:
            return None
        return (
            f"{self.name} finished no round for {age:.0f} s (stale after {self.stale_after_s:g} s): "
            f"{self.feeds} stale"
        )


class Supervised:
    """``target(stop)`` on a daemon thread named ``name``, restarted with backoff after each exception."""

    def __init__(
        self,
        name: str,
        target: Callable[[threading.Event], None],
        *,
        initial_s: float = BACKOFF_INITIAL_S,
        max_s: float = BACKOFF_MAX_S,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.name = name
        self.heartbeat = heartbeat  # beaten at each (re)start, paused during a backoff
        self._target = target
        self._initial_s = initial_s
        self._max_s = max_s
        self.stop_event = threading.Event()
        self.restarts = 0
        self.failing = False
        self.last_error = ""
        self.last_error_at: float | None = None
        self._wait = initial_s
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self.stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def ok(self) -> None:
        """The target made progress: clears ``failing`` and resets the backoff."""
        self.failing = False
        self._wait = self._initial_s

    def _run(self) -> None:
        while not self.stop_event.is_set():
            if self.heartbeat is not None:
                self.heartbeat.beat()
            try:
                self._target(self.stop_event)
                return  # a target that returns has finished (stop asked)
            except Exception as exc:
                if self.heartbeat is not None:  # out of its round: failing, not stale
                    self.heartbeat.pause()
                self.restarts += 1
                self.failing = True
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.last_error_at = time.time()
                log.exception("%s failed (restart %d in %.1f s)", self.name, self.restarts, self._wait)
            self.stop_event.wait(self._wait)
            self._wait = min(self._wait * 2, self._max_s)

    @property
    def up(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> dict[str, Any]:
        return {
            "thread": self.name,
            "up": self.up,
            "failing": self.failing,
            "restarts": self.restarts,
            "last_error": self.last_error,
        }


class BackendStuck(RuntimeError):
    """A backend call is past its deadline (``Guard``); the message names it and for how long."""


@dataclass
class _Stuck:
    what: str
    since: float


class Guard:
    """Runs backend calls on one worker thread, each with a deadline (module docstring)."""

    def __init__(
        self, timeout_s: float = CALL_TIMEOUT_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stuck: _Stuck | None = None
        self._jobs: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._ready = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._work, name="fleetyield-backend-call", daemon=True)
        self._thread.start()

    def stuck(self) -> str | None:
        """Why calls fail now ("sample stuck for 12 s"), or None."""
        with self._lock:
            s = self._stuck
        return None if s is None else f"GPU backend call {s.what} stuck for {self._clock() - s.since:.0f} s"

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        what = getattr(fn, "__name__", "call")
        with self._lock:
            if self._stuck is not None:
                raise BackendStuck(
                    f"GPU backend call {self._stuck.what} stuck since "
                    f"{self._clock() - self._stuck.since:.0f} s ago; {what} not attempted"
                )
            fut: Future[T] = Future()
            self._jobs.append((lambda: fn(*args), fut))
            self._ready.notify()
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            return fut.result(limit)
        except FutureTimeout:
            with self._lock:
                if not fut.done() and self._stuck is None:
                    self._stuck = _Stuck(what, self._clock() - limit)
                    log.error("GPU backend call %s did not return within %.1f s: backend stuck", what, limit)
            if fut.done():
                return fut.result()
            raise BackendStuck(f"GPU backend call {what} did not return within {limit:g} s") from None

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs:
                    self._ready.wait()
                job, fut = self._jobs.pop(0)
            try:
                fut.set_result(job())
            except BaseException as exc:
                fut.set_exception(exc)
            with self._lock:
                if self._stuck is not None:
                    log.warning("GPU backend call %s returned: backend no longer stuck", self._stuck.what)
                self._stuck = None
