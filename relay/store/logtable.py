"""The outbox table as logical capture writes it (relay/capture/source.py): the log's messages
that take the table's path, the held rows of those published straight from the log, and which
keys the table holds. PostgreSQL only: the statements are its own (sql/postgres.sql, "logical
capture"), run on the relay's store's engine behind the same boundary.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from sqlalchemy import Connection

from relay.errors import ConfigError
from relay.store.boundary import translated
from relay.store.postgres import PostgresStatements
from relay.store.sql_store import ERROR_MAX, SqlStore


class Admitted(NamedTuple):
    """A message from the log as the table is to hold it."""

    id: str
    has_row: bool  # it has a held row already (moved, not inserted)
    exchange: str
    routing_key: str
    payload: bytes
    content_type: str
    headers: Any  # a JSON value or None
    key: str | None
    priority: int
    max_attempts: int | None
    state: str  # pending | dead
    attempts: int
    available_at: dt.datetime
    created_at: dt.datetime
    traceparent: str | None
    tracestate: str | None
    error: str | None  # last_error
    # A failed attempt: its failure class and outcome (retry, deferred, dead) for the attempt
    # record; None for a message that takes the table's path without having failed.
    failure_class: str | None = None
    outcome: str | None = None


class LogTable:
    def __init__(self, store: SqlStore) -> None:
        sql = store.dialect.sql
        if not isinstance(sql, PostgresStatements):
            raise ConfigError(
                f"logical capture needs PostgreSQL; the database is {store.dialect.name}"
            )
        self._sql = sql
        self._engine = store.engine

    @contextmanager
    def _conn(self) -> Iterator[Connection]:
        """A connection of the relay's store, behind its one driver-error boundary."""
        with translated(self._engine), self._engine.connect() as conn:
            yield conn

    def admit(self, rows: Sequence[Admitted], *, relay_id: str) -> None:
        """Write `rows` into the table, in this order (sql/postgres.sql, admit_logged)."""
        if not rows:
            return
        columns: dict[str, list[Any]] = {
            "ids": [r.id for r in rows],
            "has_rows": [r.has_row for r in rows],
            "exchanges": [r.exchange for r in rows],
            "routing_keys": [r.routing_key for r in rows],
            "payloads": [r.payload for r in rows],
            "content_types": [r.content_type for r in rows],
            "headers": [None if r.headers is None else json.dumps(r.headers) for r in rows],
            "keys": [r.key for r in rows],
            "priorities": [r.priority for r in rows],
            "max_attempts": [r.max_attempts for r in rows],
            "states": [r.state for r in rows],
            "attempts": [r.attempts for r in rows],
            "available_ats": [r.available_at for r in rows],
            "created_ats": [r.created_at for r in rows],
            "traceparents": [r.traceparent for r in rows],
            "tracestates": [r.tracestate for r in rows],
            "errors": [None if r.error is None else r.error[:ERROR_MAX] for r in rows],
            "classes": [r.failure_class for r in rows],
            "outcomes": [r.outcome for r in rows],
        }
        with self._conn() as conn:
            conn.execute(self._sql.admit_logged, {**columns, "relay_id": relay_id, "now": None})

    def mark(self, ids: Sequence[str]) -> int:
        """Mark published the held rows of these messages (sql/postgres.sql, mark_logged)."""
        if not ids:
            return 0
        with self._conn() as conn:
            return conn.execute(self._sql.mark_logged, {"ids": list(ids), "now": None}).rowcount

    def held_keys(self, keys: Collection[str]) -> set[str]:
        """Which of `keys` have a message in the table that holds their later ones."""
        if not keys:
            return set()
        with self._conn() as conn:
            found = conn.execute(self._sql.held_keys, {"keys": list(keys)})
            return {row[0] for row in found}
