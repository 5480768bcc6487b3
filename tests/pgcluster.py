"""A throwaway PostgreSQL cluster for tests: initdb in a temporary directory, postgres on a unix socket.

The real server, never a fake (the store's PostgreSQL SQL and the lease's row locking are what is tested).
Binaries: ``pg_config --bindir``, else the newest /usr/lib/postgresql/*/bin. PostgreSQL refuses to run as
root, and CI runs as root: then initdb and postgres run as the ``postgres`` system user when it exists, else
``nobody``, through ``runuser``, in a directory that user owns. Each test gets its own database
(``PgCluster.database()``), so tests share one server start (about a second) and nothing else.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg


def bindir() -> Path | None:
    """The directory holding initdb and postgres, or None when PostgreSQL is not installed."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10)
            candidates.append(Path(out.stdout.strip()))
    candidates += sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for c in candidates:
        if (c / "initdb").exists() and (c / "postgres").exists():
            return c
    return None


def _run_as() -> tuple[list[str], str | None]:
    """(command prefix, user name) to run the server unprivileged; ([], None) when not root."""
    if os.geteuid() != 0:
        return [], None
    for user in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            return ["runuser", "-u", user, "--"], user
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists")


class PgCluster:
    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.prefix, user = _run_as()
        # under /tmp, not pytest's tmp_path: that is root-only (0700) when CI runs as root
        self.root = Path(tempfile.mkdtemp(prefix="fy-pg-"))
        self.data, self.sock = self.root / "data", self.root / "sock"
        self.sock.mkdir()
        if user is not None:
            ent = pwd.getpwnam(user)
            for p in (self.root, self.sock):
                os.chown(p, ent.pw_uid, ent.pw_gid)
        self._n = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0, fsync: bool = False) -> None:
        """initdb and start; ``fsync`` off for tests (a throwaway cluster), on for benchmarks."""
        subprocess.run(
            [*self.prefix, str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
             "--auth=trust", "--no-sync", "-E", "UTF8"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        self.log = open(self.root / "server.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [*self.prefix, str(self.bin / "postgres"), "-D", str(self.data), "-k", str(self.sock),
             "-c", "listen_addresses=", "-c", f"fsync={'on' if fsync else 'off'}",
             "-c", "max_connections=200"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"postgres did not start: {(self.root / 'server.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.1)

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@/{dbname}?host={self.sock}"

    def database(self) -> str:
        """A fresh empty database; its URL."""
        self._n += 1
        name = f"t{self._n}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: smart shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(AttributeError):
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)
