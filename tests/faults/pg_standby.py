"""A PostgreSQL primary and a streaming standby on this machine, for failover faults: the primary
SIGKILLed (every process of it, as a machine would die) and the standby promoted.

    python -m tests.faults.pg_standby up [--async] | promote | kill-primary | status | down

Both clusters are made with the Debian binaries (PG_BIN) under BASE, on ports of their own
(PRIMARY_PORT, STANDBY_PORT), never touching the machine's own cluster; they run as the
`postgres` OS user (initdb refuses root), trust authentication on 127.0.0.1, a superuser `root`
and a database `test`, as the machine's cluster has. The standby is a `pg_basebackup -R` copy
streaming from the primary; with synchronous replication (the default) a commit returns once the
standby has flushed it (`synchronous_standby_names = '*'`), with `--async` as soon as the primary
has. `down` stops both and removes BASE.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PG_BIN = Path(os.environ.get("OUTBOX_PG_BIN", "/usr/lib/postgresql/15/bin"))
BASE = Path(os.environ.get("OUTBOX_PG_STANDBY_DIR", "/tmp/outbox-pg-standby"))
# Below the kernel's ephemeral range (32768-60999): a client socket never holds them.
PRIMARY_PORT, STANDBY_PORT = 25432, 25433
HOST = "127.0.0.1"
DATABASE = "test"
OS_USER = "postgres"


@dataclass(frozen=True)
class Pair:
    base: Path = BASE
    primary_port: int = PRIMARY_PORT
    standby_port: int = STANDBY_PORT

    @property
    def primary(self) -> Path:
        return self.base / "primary"

    @property
    def standby(self) -> Path:
        return self.base / "standby"

    def url(self, database: str = DATABASE) -> str:
        """The multi-host URL applications and the relay use: whichever host takes writes."""
        return (
            f"postgresql+psycopg://root@/{database}?host={HOST}:{self.primary_port}"
            f"&host={HOST}:{self.standby_port}&target_session_attrs=read-write"
        )

    def direct_url(self, port: int, database: str = DATABASE) -> str:
        return f"postgresql+psycopg://root@{HOST}:{port}/{database}"

    # ----------------------------------------------------------------- commands

    def up(self, *, synchronous: bool = True) -> None:
        """Make and start both clusters (after removing any left from an earlier run)."""
        self.down()
        self.base.mkdir(parents=True)
        shutil.chown(self.base, OS_USER, OS_USER)
        _as_postgres(PG_BIN / "initdb", "-D", self.primary, "-U", "postgres", "--auth=trust",
                     "--no-sync", "-E", "UTF8")  # fmt: skip
        settings = {
            "port": self.primary_port,
            "listen_addresses": f"'{HOST}'",
            "unix_socket_directories": f"'{self.base}'",
            "wal_level": "replica",
            "max_wal_senders": 5,
            "wal_keep_size": "'256MB'",
            "hot_standby": "on",
            "fsync": "off",  # a SIGKILL loses no page cache: durability is not under test
            "full_page_writes": "off",
            "max_connections": 200,
            "logging_collector": "off",
        }
        with (self.primary / "postgresql.conf").open("a") as conf:
            conf.write("".join(f"{k} = {v}\n" for k, v in settings.items()))
        self._start(self.primary)
        for sql in ("CREATE ROLE root SUPERUSER LOGIN", f"CREATE DATABASE {DATABASE} OWNER root"):
            _as_postgres(PG_BIN / "psql", "-h", HOST, "-p", str(self.primary_port),
                         "-U", "postgres", "-d", "postgres", "-qc", sql)  # fmt: skip
        _as_postgres(PG_BIN / "pg_basebackup", "-h", HOST, "-p", str(self.primary_port),
                     "-U", "postgres", "-D", self.standby, "-R", "-X", "stream",
                     "-c", "fast", "--no-sync")  # fmt: skip
        with (self.standby / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {self.standby_port}\n")
        self._start(self.standby)
        if synchronous:  # only now: a commit would wait for a standby that is not there yet
            for sql in ("ALTER SYSTEM SET synchronous_standby_names = '*'",
                        "SELECT pg_reload_conf()"):  # fmt: skip
                _as_postgres(PG_BIN / "psql", "-h", HOST, "-p", str(self.primary_port),
                             "-U", "postgres", "-d", "postgres", "-qc", sql)  # fmt: skip
            self._wait_sync()

    def promote(self) -> None:
        """Promote the standby (returns once it takes writes)."""
        _as_postgres(PG_BIN / "pg_ctl", "promote", "-w", "-D", self.standby)

    def kill_primary(self) -> None:
        """SIGKILL every process of the primary at once: nothing it had not sent is sent."""
        for pid in self._processes(self.primary):
            os.kill(pid, signal.SIGKILL)

    def status(self) -> str:
        lines = []
        for name, port, data in (("primary", self.primary_port, self.primary),
                                 ("standby", self.standby_port, self.standby)):  # fmt: skip
            pids = self._processes(data) if data.exists() else []
            role = "-"
            if pids:
                role = _psql(port, "SELECT CASE WHEN pg_is_in_recovery() THEN 'standby' "
                                   "ELSE 'primary' END") or "not answering"  # fmt: skip
            lines.append(f"{name} {HOST}:{port} {'running' if pids else 'down'} ({role})")
        return "\n".join(lines)

    def down(self) -> None:
        """Stop both clusters (SIGKILL whatever is left) and remove BASE."""
        for data in (self.standby, self.primary):
            if (data / "postmaster.pid").exists():
                subprocess.run(
                    ["runuser", "-u", OS_USER, "--", str(PG_BIN / "pg_ctl"), "stop", "-m",
                     "immediate", "-w", "-D", str(data)],
                    capture_output=True, check=False, timeout=60,
                )  # fmt: skip
            for pid in self._processes(data):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)

    # ----------------------------------------------------------------- parts

    def _start(self, data: Path) -> None:
        log = self.base / f"{data.name}.log"
        try:
            _as_postgres(PG_BIN / "pg_ctl", "start", "-w", "-t", "60", "-D", data, "-l", log)
        except RuntimeError as exc:  # pg_ctl says only "examine the log": say what it logged
            said = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
            raise RuntimeError("\n".join([str(exc), *said])) from None

    def _wait_sync(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        query = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
        while _psql(self.primary_port, query) != "1":
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not become synchronous")
            time.sleep(0.1)

    @staticmethod
    def _processes(data: Path) -> list[int]:
        """The postmaster of `data` (from its pid file) and its children."""
        try:
            postmaster = int((data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        found = [postmaster] if Path(f"/proc/{postmaster}").exists() else []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[1] == str(postmaster):  # the parent's pid
                found.append(int(stat.parent.name))
        return found


def _as_postgres(*argv: object) -> None:
    command = ["runuser", "-u", OS_USER, "--", *map(str, argv)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip() or done.stdout.strip()}")


def _psql(port: int, query: str) -> str:
    done = subprocess.run(
        ["psql", "-h", HOST, "-p", str(port), "-U", "postgres", "-d", "postgres", "-Atqc", query],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.pg_standby")
    parser.add_argument("command", choices=["up", "down", "promote", "kill-primary", "status"])
    parser.add_argument("--async", dest="asynchronous", action="store_true",
                        help="asynchronous replication (up)")  # fmt: skip
    args = parser.parse_args(argv)
    pair = Pair()
    if args.command == "up":
        pair.up(synchronous=not args.asynchronous)
        print(f"up: {pair.url()}")
    elif args.command == "down":
        pair.down()
    elif args.command == "promote":
        pair.promote()
    elif args.command == "kill-primary":
        pair.kill_primary()
    print(pair.status())
    return 0


if __name__ == "__main__":
    sys.exit(main())
