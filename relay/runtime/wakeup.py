"""LISTEN for enqueue notifications (PostgreSQL) and wake the relay loop at once. The statement
is the dialect's (relay/store/postgres.py, LISTEN); a database without one is polled only.

A latency optimisation only: polling goes on regardless, so nothing depends on a notification
arriving (pgbouncer in transaction mode, for one, drops LISTEN).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import psycopg

from relay.runtime.config import parse_db_url
from relay.store.databases import DIALECTS

log = logging.getLogger("relay.wakeup")


class Listener:
    def __init__(self, db_url: str, listen: str, on_notify: Callable[[], None]) -> None:
        url = parse_db_url(db_url).set(drivername="postgresql")
        self._listen = listen
        self._conninfo = url.render_as_string(hide_password=False)
        self._on_notify = on_notify
        self._stop = threading.Event()
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._thread = threading.Thread(target=self._run, name="listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(3.0)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(self._listen)
                    if failures:
                        log.info("listen.restored")
                    failures = 0
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self._on_notify()
            except psycopg.Error as exc:
                failures += 1
                if failures == 1:  # once per outage, not once per retry
                    log.warning("listen.lost", extra={"error": str(exc).strip()[:200]})
                self._stop.wait(min(30.0, 0.5 * 2**failures))


def listener_for(db_url: str, on_notify: Callable[[], None]) -> Listener | None:
    """A listener when the database has notifications (PostgreSQL), else None (SQLite relays
    poll)."""
    listen = DIALECTS[parse_db_url(db_url).get_backend_name()].listen
    if listen is None:
        return None
    with contextlib.suppress(Exception):
        return Listener(db_url, listen, on_notify)
    return None
