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


class Supervised:
    """``target(stop)`` on a daemon thread named ``name``, restarted with backoff after each exception."""

    def __init__(
        self,
        name: str,
        target: Callable[[threading.Event], None],
        *,
        initial_s: float = BACKOFF_INITIAL_S,
        max_s: float = BACKOFF_MAX_S,
    ) -> None:
        self.name = name
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
            try:
                self._target(self.stop_event)
                return  # a target that returns has finished (stop asked)
            except Exception as exc:
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
