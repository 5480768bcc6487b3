"""Who leads: the leader lease and its fencing token, between two controllers sharing one PostgreSQL store.

Input: the store (``Store.lease_acquire`` / ``lease_holds``: one row, holder, token, expiry), this
controller's name, the lease's TTL and renewal period, a clock. Output: ``leading`` (may this controller
act), ``fence()`` (the check the executor runs before anything reaches Slurm, an agent, a BMC or the gate)
and ``status()`` (which controller leads, for ``fleetyield status`` and ``/v1/status``).

Only the holder acts. The renewal runs in its own thread every ``renew_s`` (the tick may take longer, or
wait ``interval_s``); a lease not renewed for ``ttl_s`` lapses and the standby's next try (within
``renew_s``) takes it with the token + 1. A controller that lost the lease (paused, partitioned from the
database, or slow) still holds its old token: ``fence()`` compares it with the row and refuses every action
of a stale token, so a deposed leader's in-flight plan stops at the executor boundary. The lease's times
are this controller's clock (injected, so tests need no sleep): controllers' clocks must agree to well under
``ttl_s`` (NTP). PostgreSQL's advisory locks were the alternative; they die with the session, but a
session kept alive by a hung process would keep the lock forever, where a lease lapses.

With SQLite there is one controller: ``SoleLeadership`` is trivially held, and costs nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from slurm_fleetyield.adapters.store import Store

log = logging.getLogger("fleetyield.lease")


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Leader(Protocol):
    holder: str

    @property
    def leading(self) -> bool: ...

    def renew(self) -> bool: ...

    def fence(self) -> tuple[bool, str]: ...

    def status(self) -> dict[str, Any]: ...

    def release(self) -> None: ...


class SoleLeadership:
    """One controller (SQLite): always leading, never fenced."""

    def __init__(self, holder: str | None = None) -> None:
        self.holder = holder or default_holder()

    @property
    def leading(self) -> bool:
        return True

    def renew(self) -> bool:
        return True

    def fence(self) -> tuple[bool, str]:
        return True, ""

    def status(self) -> dict[str, Any]:
        return {"mode": "single", "self": self.holder, "leader": self.holder, "leading": True, "token": None}

    def release(self) -> None:
        return None


class Leadership:
    """The PostgreSQL lease. ``renew()`` takes or extends it (the renewal thread calls it); ``token`` is
    the fencing token of the lease this controller holds (None: standby)."""

    def __init__(
        self,
        store: Store,
        holder: str | None = None,
        *,
        ttl_s: float = 6.0,
        renew_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.holder = holder or default_holder()
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self.clock = clock
        self.token: int | None = None
        self._lock = threading.Lock()
        self.gained = threading.Event()  # set at each takeover; the daemon reloads the state from the store

    @property
    def leading(self) -> bool:
        return self.token is not None

    def renew(self) -> bool:
        try:
            token = self.store.lease_acquire(self.holder, self.ttl_s, self.clock())
        except Exception as exc:  # the database unreachable: no renewal; the lease lapses by itself
            log.warning("lease renewal failed", extra={"fy": {"error": repr(exc)}})
            token = None
        with self._lock:
            before, self.token = self.token, token
        if token is not None and token != before:
            log.info("leading", extra={"fy": {"holder": self.holder, "token": token}})
            self.gained.set()
        elif token is None and before is not None:
            log.warning("lease lost", extra={"fy": {"holder": self.holder, "token": before}})
        return token is not None

    def fence(self) -> tuple[bool, str]:
        """May an action of this controller go out now? Refused without the lease, or with a stale token."""
        token = self.token
        if token is None:
            return False, f"fenced: {self.holder} does not hold the leader lease (standby)"
        try:
            ok = self.store.lease_holds(self.holder, token, self.clock())
        except Exception as exc:
            return False, f"fenced: the lease cannot be checked ({exc})"
        if not ok:
            return (
                False,
                f"fenced: token {token} of {self.holder} is stale (the lease was taken over or lapsed)",
            )
        return True, ""

    def status(self) -> dict[str, Any]:
        try:
            row = self.store.lease_row()
        except Exception:
            row = None
        now = self.clock()
        live = row is not None and row["expires_at"] > now
        return {
            "mode": "lease",
            "self": self.holder,
            "leader": row["holder"] if live and row else None,
            "leading": self.leading and live and row is not None and row["holder"] == self.holder,
            "token": row["token"] if row else None,
            "expires_in_s": round(row["expires_at"] - now, 3) if row else None,
        }

    def release(self) -> None:
        token, self.token = self.token, None
        if token is not None:
            try:
                self.store.lease_release(self.holder, token)
            except Exception as exc:
                log.warning("lease release failed", extra={"fy": {"error": repr(exc)}})

    def run(self, stop: threading.Event, wake: threading.Event | None = None) -> None:
        """Renew every ``renew_s`` until ``stop``; at a takeover, wake the daemon's loop."""
        while not stop.is_set():
            was = self.leading
            if self.renew() and not was and wake is not None:
                wake.set()
            stop.wait(self.renew_s)


def lease_status(store: Store, now: float) -> dict[str, Any] | None:
    """Which controller leads, read from the store (the read-only CLI and API); None: no lease row."""
    row = store.lease_row()
    if row is None:
        return None
    live = row["expires_at"] > now
    return {
        "leader": row["holder"] if live else None,
        "token": row["token"],
        "expires_in_s": row["expires_at"] - now,
    }
