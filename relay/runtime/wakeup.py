"""LISTEN for enqueue notifications (PostgreSQL) and wake the relay loop at once. The statement
is the dialect's (relay/store/postgres.py, LISTEN); a database without one is polled only.

A latency optimisation only: polling goes on regardless, so nothing depends on a notification
arriving (pgbouncer in transaction mode, for one, drops LISTEN). But wake-ups never stop without
a word: every failure is logged (once per outage) and retried, whatever raised it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from relay.core.urls import secrets_of
from relay.runtime.config import parse_db_url
from relay.runtime.logs import one_line
from relay.store.databases import DIALECTS

log = logging.getLogger("relay.wakeup")

MAX_RETRY_DELAY = 30.0


class Listener:
    def __init__(self, db_url: str, listen: str, on_notify: Callable[[], None]) -> None:
        url = parse_db_url(db_url).set(drivername="postgresql")
        self._listen = listen
        self._conninfo = url.render_as_string(hide_password=False)
        self._secrets = secrets_of(db_url)
        self._on_notify = on_notify
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="listen", daemon=True)
        self.failures = 0  # consecutive failed attempts (0: listening, or not yet tried)

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
            while not self._stop.is_set():
                try:
                    self._listen_until_stopped()
                # Exception, not psycopg.Error: a callback that raises, or a failure outside
                # the driver, would otherwise end this thread and every wake-up with it.
                except Exception as exc:
                    self._failed(exc)
        finally:
            if not self._stop.is_set():  # BaseException: say so, polling goes on
                log.error("listen.stopped", extra={"fallback": "polling"})

    def _listen_until_stopped(self) -> None:
        with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
            conn.execute(self._listen)
            if self.failures:
                log.info("listen.restored", extra={"after_failures": self.failures})
            self.failures = 0
            while not self._stop.is_set():
                for _ in conn.notifies(timeout=0.5, stop_after=1):
                    self._on_notify()

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
