"""A real PgBouncer in transaction pooling mode, in front of the tests' PostgreSQL.

`PgBouncer.start()` runs Debian's /usr/sbin/pgbouncer on a free loopback port with a
configuration of its own in a temporary directory (its log and pid file there too); `stop()`
ends that process, and only that one, and removes the directory.

Its `[databases]` section is a wildcard: a client naming database `d` gets a pool on the
upstream server's database `d`. Tests therefore isolate themselves by database, not by schema:
the per-test schema of `tests.support.db.pg_url` is chosen by the URL's `options=-csearch_path=...`,
a startup parameter that PgBouncer cannot carry (it is configured to ignore it, as most
deployments are), so every test behind it gets a database of its own (`Databases`).

PgBouncer refuses to run as root: as root it is started as the `postgres` user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from tests.support.ports import free_port

PGBOUNCER = os.environ.get("OUTBOX_TEST_PGBOUNCER", "/usr/sbin/pgbouncer")
RUN_AS = "postgres"  # PgBouncer will not run as root
POOL_SIZE = 3  # server connections per database: small, so clients really share them


class PgBouncerError(RuntimeError):
    """PgBouncer could not be started: the message says why, with the end of its log."""


class PgBouncer:
    """One PgBouncer process (transaction pooling unless told otherwise), forwarding to
    `upstream_url`'s server."""

    def __init__(
        self, upstream_url: str, *, pool_size: int = POOL_SIZE, pool_mode: str = "transaction"
    ) -> None:
        upstream = make_url(upstream_url)
        self.user = upstream.username or "root"
        self._upstream = f"host={upstream.host or '127.0.0.1'} port={upstream.port or 5432}"
        self.pool_size = pool_size
        self.pool_mode = pool_mode
        self.port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # ---- the configuration

    def _write_config(self, workdir: Path) -> Path:
        (workdir / "users.txt").write_text(f'"{self.user}" ""\n')
        ini = workdir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = {self._upstream}\n"
            "\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {workdir / 'users.txt'}\n"
            f"admin_users = {self.user}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {workdir / 'pgbouncer.log'}\n"
            f"pidfile = {workdir / 'pgbouncer.pid'}\n"
        )
        return ini

    # ---- the process

    def start(self, timeout: float = 15.0) -> None:
        if not Path(PGBOUNCER).exists():
            raise PgBouncerError(
                f"{PGBOUNCER} is missing: scripts/ensure-services.sh installs Debian's pgbouncer"
            )
        workdir = Path(tempfile.mkdtemp(prefix="outbox-pgbouncer-"))
        self._dir = workdir
        self.port = free_port()
        ini = self._write_config(workdir)
        command = [PGBOUNCER, str(ini)]
        if os.geteuid() == 0:
            # Its log and pid file are written as that user: the directory must be its own.
            account = pwd.getpwnam(RUN_AS)
            os.chown(workdir, account.pw_uid, account.pw_gid)
            command = ["runuser", "-u", RUN_AS, "--", *command]
        out = (workdir / "stderr.txt").open("wb")
        with out:
            self._proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while not self._accepts():
            if self._proc.poll() is not None:
                raise PgBouncerError(f"pgbouncer exited with {self._proc.returncode}: {self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise PgBouncerError(f"pgbouncer did not listen within {timeout} s: {self.log()}")
            time.sleep(0.05)

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def log(self, lines: int = 20) -> str:
        """The end of PgBouncer's own log and of its output."""
        if self._dir is None:
            return ""
        # The same lines go to both once it runs; only its output says why it would not start.
        for name in ("pgbouncer.log", "stderr.txt"):
            with contextlib.suppress(OSError):
                text = (self._dir / name).read_text(errors="replace").strip()
                if text:
                    return "\n".join(text.splitlines()[-lines:])
        return ""

    def _pid(self) -> int | None:
        """PgBouncer's own pid (runuser's child), from the pid file it wrote."""
        if self._dir is None:
            return None
        try:
            return int((self._dir / "pgbouncer.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop the PgBouncer this object started (SIGTERM: at once), and remove its files."""
        proc, self._proc = self._proc, None
        if proc is not None:
            pid = self._pid()
            with contextlib.suppress(ProcessLookupError):
                # PgBouncer itself: runuser exits with it. Signalled, runuser would wait 2 s
                # before killing its child.
                if pid is not None:
                    os.kill(pid, signal.SIGTERM)
                else:
                    proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def url(self, database: str) -> str:
        """A SQLAlchemy URL on `database` through this PgBouncer."""
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"


class Databases:
    """Databases of a test's own on the upstream server, made from `admin` (an autocommit
    engine on it), dropped by `drop_all()` with whatever connections PgBouncer keeps to them."""

    def __init__(self, admin: Engine) -> None:
        self._admin = admin
        self._made: list[str] = []

    def create(self) -> str:
        name = f"t_pgb_{uuid.uuid4().hex[:12]}"
        with self._admin.connect() as conn:
            # template0: nobody connects to it, so a session on template1 cannot make this fail.
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE template0')
        self._made.append(name)
        return name

    def direct_url(self, name: str) -> str:
        """A SQLAlchemy URL on database `name` of the upstream server, not through PgBouncer."""
        url = make_url(self._admin.url).set(database=name, query={})
        return url.render_as_string(hide_password=False)

    def drop_all(self) -> None:
        with self._admin.connect() as conn:
            for name in self._made:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._made.clear()


@contextlib.contextmanager
def running(upstream_url: str, *, pool_mode: str = "transaction") -> Iterator[PgBouncer]:
    bouncer = PgBouncer(upstream_url, pool_mode=pool_mode)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()
