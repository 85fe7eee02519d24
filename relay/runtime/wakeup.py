"""LISTEN for enqueue notifications (PostgreSQL) and wake the relay loop at once. The statement
is the dialect's (relay/store/postgres.py, LISTEN); a database without one is polled only.

A latency optimisation only: polling goes on regardless, so nothing depends on a notification
arriving. But wake-ups never stop without a word: every failure is logged (once per outage) and
retried, whatever raised it.

Through a pooler (PgBouncer), LISTEN may not be carried: in transaction mode it runs on a server
connection that is then lent to other clients, and no notification reaches the relay. So behind
a pooler (postgres.behind_pooler) the listener sends itself a notification from another
connection; if none arrives it says so once (`listen.unavailable`) and stops, and the relay
polls. A direct connection needs no probe: LISTEN is carried there.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from relay.core.urls import secrets_of
from relay.runtime.logs import one_line
from relay.runtime.urls import parse_db_url
from relay.store.databases import DIALECTS, driver_arguments
from relay.store.postgres import NOTIFY_PROBE, NOTIFY_TABLE, behind_pooler

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("relay.wakeup")

MAX_RETRY_DELAY = 30.0
# How long the probe's notification has to arrive through a pooler. On a pooler that carries
# LISTEN it takes milliseconds; a slower one costs only latency (the relay polls).
PROBE_WAIT = 2.0


def _table_oid(conn: psycopg.Connection[Any]) -> str | None:
    row = conn.execute(NOTIFY_TABLE).fetchone()
    return None if row is None else row[0]


def _for(payload: str, table: str | None) -> bool:
    """Whether a notification is for this relay's table. Enqueue's common path names the table
    written (its oid): another schema's outbox in this database (one relay per tenant schema,
    all on one channel) wakes only its own relay. An empty payload (the other paths, older
    applications) and the pooler probe wake every listener."""
    return table is None or not payload.isdigit() or payload == table


class Listener:
    def __init__(self, db_url: str, listen: str, on_notify: Callable[[], None]) -> None:
        url, driver_args = driver_arguments(parse_db_url(db_url))
        self._listen = listen
        from psycopg.conninfo import make_conninfo  # psycopg is an extra: imported when used
        from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

        # As SQLAlchemy's psycopg dialect connects: a multi-host URL (host=h1:p1&host=h2:p2)
        # becomes libpq's host=h1,h2 port=p1,p2, which a URI of the query would not say.
        _, params = PGDialect_psycopg().create_connect_args(url)  # type: ignore[no-untyped-call]
        self._conninfo = make_conninfo("", **params)
        # prepare_threshold is psycopg's, not libpq's: it must not reach the conninfo.
        # Named as the relay's pools are, so pg_stat_activity shows whose connection it is.
        self._connect_args: dict[str, Any] = {
            "prepare_threshold": None,
            "application_name": "outbox-relay",
            **driver_args,
        }
        self._secrets = secrets_of(db_url)
        self._on_notify = on_notify
        self._stop = threading.Event()
        self._thread = threading.Thread(
            # in the context it was made in: its log lines name the same database
            target=contextvars.copy_context().run,
            args=(self._run,),
            name="listen",
            daemon=True,
        )
        self.failures = 0  # consecutive failed attempts (0: listening, or not yet tried)
        self.carried: bool | None = None  # whether LISTEN reaches this relay (None: not known)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(3.0)

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and self.carried is not False:
                try:
                    self._listen_until_stopped()
                # Exception, not psycopg.Error: a callback that raises, or a failure outside
                # the driver, would otherwise end this thread and every wake-up with it.
                except Exception as exc:
                    self._failed(exc)
        finally:
            # BaseException: say so, polling goes on. (Not carried: said already.)
            if not self._stop.is_set() and self.carried is not False:
                log.error("listen.stopped", extra={"fallback": "polling"})

    def _connect(self) -> psycopg.Connection[Any]:
        # Imported here: psycopg needs libpq (or its binary build), which a SQLite relay may lack.
        import psycopg

        return psycopg.connect(
            self._conninfo, autocommit=True, connect_timeout=5, **self._connect_args
        )

    def _listen_until_stopped(self) -> None:
        with self._connect() as conn:
            conn.execute(self._listen)
            carried = behind_pooler(conn) is None or self._probe(conn)
            if self._stop.is_set():
                return
            if not carried:
                self.carried = False
                log.warning(
                    "listen.unavailable",
                    extra={
                        "reason": "LISTEN is not carried through this pooler (transaction pooling)",
                        "fallback": "polling",
                    },
                )
                return
            self.carried = True
            if self.failures:
                log.info("listen.restored", extra={"after_failures": self.failures})
            self.failures = 0
            table = _table_oid(conn)
            while not self._stop.is_set():
                for notify in conn.notifies(timeout=0.5, stop_after=1):
                    if _for(notify.payload, table):
                        self._on_notify()

    def _probe(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether a notification sent from another connection reaches `conn` (listening)."""
        with self._connect() as other:
            other.execute(NOTIFY_PROBE, (f"probe {uuid.uuid4().hex}",))
        # Any notification proves delivery, an application's as well as the probe's.
        deadline = time.monotonic() + PROBE_WAIT
        while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
            for _ in conn.notifies(timeout=min(0.5, left), stop_after=1):
                self._on_notify()
                return True
        return False

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if self.failures == 1:  # once per outage, not once per retry
            log.warning(
                "listen.lost",
                extra={
                    "error": one_line(f"{type(exc).__name__}: {exc}", self._secrets)[:200],
                    "fallback": "polling",
                },
            )
        self._stop.wait(min(MAX_RETRY_DELAY, 0.5 * 2 ** min(self.failures, 10)))


def listener_for(db_url: str, on_notify: Callable[[], None]) -> Listener | None:
    """A listener when the database has notifications (PostgreSQL), else None (SQLite relays
    poll)."""
    listen = DIALECTS[parse_db_url(db_url).get_backend_name()].listen
    if listen is None:
        return None
    try:
        return Listener(db_url, listen, on_notify)
    except Exception as exc:
        # Not silently: an operator who turned --listen on should know it is off.
        log.warning("listen.off", extra={"error": one_line(str(exc)), "fallback": "polling"})
        return None
