"""A fleet-wide token bucket for BMC power actions.

Input: a capacity (``actions`` per ``window_s``), an injected clock and, optionally, a state file. Output:
``take()`` -> None when a token was available (and consumed), else ``RateLimited`` saying when the next one
comes. Why a bucket and not a per-node limit: the failure it bounds is fleet-wide (a bad config, a flapping
sensor or a bug that decides to power-cycle half the cluster); per-node repetition is already bounded by
the lifecycle's attempts.

Why a state file: the controller's executor, the RebootProgram request handler and Slurm's Suspend/Resume
programs are different processes on the controller host, and "N per window" must hold across all of them.
The file is a small JSON document rewritten under an exclusive ``flock``; no file means an in-process
bucket (tests, a single daemon).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class RateLimited:
    """No token: ``retry_in_s`` until the next one (at the current refill rate)."""

    actions: int
    window_s: float
    retry_in_s: float

    def __str__(self) -> str:
        return (
            f"fleet-wide BMC rate limit reached ({self.actions} power actions per {self.window_s:g}s); "
            f"next allowed in {self.retry_in_s:.0f}s"
        )


class TokenBucket:
    """``actions`` tokens at most, refilled continuously at ``actions / window_s`` per second."""

    def __init__(
        self,
        actions: int,
        window_s: float,
        *,
        state_path: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if actions < 1 or not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"need actions >= 1 and window_s > 0, got {actions!r} per {window_s!r}")
        self.actions = actions
        self.window_s = window_s
        self.state_path = Path(state_path) if state_path is not None else None
        self._clock = clock  # wall clock when shared through a file: monotonic clocks differ per process
        self._tokens = float(actions)
        self._updated = clock()

    def take(self) -> RateLimited | None:
        """Consume one token if there is one; else say how long until there is."""
        with self._state() as state:
            now = self._clock()
            rate = self.actions / self.window_s
            elapsed = max(0.0, now - state["updated"])  # a clock stepping back never mints tokens
            tokens = min(float(self.actions), state["tokens"] + elapsed * rate)
            state["updated"] = now
            if tokens >= 1.0:
                state["tokens"] = tokens - 1.0
                return None
            state["tokens"] = tokens
            return RateLimited(self.actions, self.window_s, (1.0 - tokens) / rate)

    def available(self) -> float:
        """Tokens available now (for status pages and tests); consumes nothing."""
        with self._state() as state:
            rate = self.actions / self.window_s
            elapsed = max(0.0, self._clock() - state["updated"])
            return min(float(self.actions), state["tokens"] + elapsed * rate)

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, float]]:
        if self.state_path is None:
            state = {"tokens": self._tokens, "updated": self._updated}
            yield state
            self._tokens, self._updated = state["tokens"], state["updated"]
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.read(fd, 4096)
            state = _parse(raw, self.actions, self._clock())
            yield state
            data = json.dumps(state, sort_keys=True).encode()
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the lock


def _parse(raw: bytes, actions: int, now: float) -> dict[str, float]:
    """The stored state; an empty or corrupt file is a full bucket stamped now (fails open to the cap,
    never beyond it: at most ``actions`` right after a corruption)."""
    try:
        doc = json.loads(raw or b"{}")
        tokens, updated = float(doc["tokens"]), float(doc["updated"])
        if math.isfinite(tokens) and math.isfinite(updated):
            return {"tokens": min(max(tokens, 0.0), float(actions)), "updated": updated}
    except (ValueError, KeyError, TypeError):
        pass
    return {"tokens": float(actions), "updated": now}
