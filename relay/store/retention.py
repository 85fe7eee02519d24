"""Retention: delete terminal messages older than a cutoff, a small batch at a time; and the
PostgreSQL storage settings that keep the outbox tables from bloating.

How a batch finds its rows: message ids are UUIDv7, time-ordered, so every row created before the
cutoff lies in one contiguous low range of the unique `id` index. Each batch is bounded by
`id < :cutoff_id` (a UUIDv7 of the cutoff millisecond with all random bits zero) and ordered by
id with a small LIMIT: an index range scan that stops at the cutoff and never walks the recent,
hot end of the table, however large it is. The state and time conditions are always checked as
well, so the id bound only narrows the search: a clock difference between the application (which
made the id) and the database (which stamped the times) can delay a row's deletion, never bring
it forward.

What is eligible, and by which time:

- `published`: by `published_at`.
- `dead`, `discarded`, `cancelled`: by the last time the row records anything happening to it,
  the latest of `created_at`, `last_failed_at` (when it died, or last failed before it was
  cancelled) and `replayed_at` (an operator sent it again). Discarding and cancelling stamp no
  time on the row (they write an `outbox_attempt` record), so they do not restart the clock: a
  message dead for 29 days and discarded today goes one day later with a 30-day policy.
- `pending` and `in_flight` never: every statement names the terminal states itself, whatever it
  is asked to delete.

A message's `outbox_attempt` rows are deleted with it, in the same transaction. Each batch is its
own short transaction, so row locks (PostgreSQL) or the write lock (SQLite) are held for one batch
only; relays and application inserts never wait for a whole purge.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, DateTime, Engine, Integer, TextClause, Uuid, bindparam, text

# The autovacuum settings that keep this table small live with the schema, in outbox.migrate.
from outbox.states import State
from relay.store.sqlite_tx import sqlite_transaction

TERMINAL_STATES: tuple[str, ...] = (
    State.PUBLISHED.value,
    State.DEAD.value,
    State.DISCARDED.value,
    State.CANCELLED.value,
)
FAILED_STATES: tuple[str, ...] = (State.DEAD.value, State.DISCARDED.value, State.CANCELLED.value)
NEVER_PURGED: tuple[str, ...] = (State.PENDING.value, State.IN_FLIGHT.value)

# Below every message id (new_id never makes the nil UUID): where a purge's id cursor starts.
_NIL = uuid.UUID(int=0)
_MS = dt.timedelta(milliseconds=1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

# On SQLite a batch holds the database's single write lock; between batches a purge rests this
# many times as long as the batch took, so writers queued in SQLite's busy handler (which retries
# at intervals of up to 100 ms) find the lock free instead of losing every race to the next batch.
SQLITE_REST_RATIO = 1.0


# --------------------------------------------------------------------------- pure parts


def check_states(states: Iterable[str]) -> tuple[str, ...]:
    """The states as a tuple, in the order given, without repeats; ValueError (one line) if
    empty, unknown, or not terminal."""
    chosen = tuple(dict.fromkeys(states))
    if not chosen:
        raise ValueError(f"no state given (purgeable: {', '.join(TERMINAL_STATES)})")
    live = [s for s in chosen if s in NEVER_PURGED]
    if live:
        raise ValueError(
            f"{', '.join(live)} messages are never purged (purgeable: {', '.join(TERMINAL_STATES)})"
        )
    unknown = [s for s in chosen if s not in TERMINAL_STATES]
    if unknown:
        raise ValueError(
            f"unknown state {', '.join(unknown)} (purgeable: {', '.join(TERMINAL_STATES)})"
        )
    return chosen


def cutoff_time(now: dt.datetime, older_than_seconds: float) -> dt.datetime:
    """`now` minus the age, in UTC; ValueError for a naive `now` or a negative or infinite age."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if not math.isfinite(older_than_seconds) or older_than_seconds < 0:
        raise ValueError(
            f"the age must be a finite number of seconds >= 0, not {older_than_seconds}"
        )
    return (now - dt.timedelta(seconds=older_than_seconds)).astimezone(dt.UTC)


def cutoff_id(moment: dt.datetime) -> uuid.UUID:
    """The smallest UUIDv7 of `moment`'s millisecond: version and variant set, every random bit
    zero. A UUIDv7 made before that millisecond sorts below it; one made in it or later sorts at
    or above it (as a UUID on PostgreSQL, and as the 32 lowercase hex digits SQLite stores)."""
    if moment.tzinfo is None:
        raise ValueError("the cutoff must be timezone-aware")
    # 48 bits of milliseconds last until the year 10889, beyond any datetime; before 1970, 0.
    ms = max((moment - _EPOCH) // _MS, 0)
    return uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62))


# --------------------------------------------------------------------------- SQL

# The rows a purge may delete. The id range comes first: it is the index range scanned (see the
# module docstring); :after_id is the id of the last row the previous batch of the same purge
# deleted, so a purge never re-walks rows it has already passed (old rows of states it is not
# purging, which it would otherwise read again in every batch). Each branch names its terminal
# states, so a `pending` or `in_flight` row can never match, whatever :states holds.
_ELIGIBLE = """
id > :after_id AND id < :cutoff_id
AND {state_in}
AND (
    (state = 'published' AND published_at < :cutoff)
    OR (state IN ('dead', 'discarded', 'cancelled') AND {failed_at} < :cutoff)
)
"""

# PostgreSQL: greatest() ignores NULLs (a message that never failed, or was never replayed).
_PG_ELIGIBLE = _ELIGIBLE.format(
    state_in="state = ANY(CAST(:states AS text[]))",
    failed_at="greatest(created_at, last_failed_at, replayed_at)",
)

# One batch, one statement, one short transaction (autocommit). SKIP LOCKED: a row an operator is
# replaying right now, or that another purge (a CLI run beside the relays' own retention) has
# taken, is passed over instead of waited for, and concurrent purges take disjoint batches. The
# lock is taken after the state and time checks, and PostgreSQL re-checks them on a row changed
# since the snapshot, so a row replayed to pending just before is not deleted. The message's
# attempt rows go in the same statement. `= ANY(ARRAY(...))` rather than a join: the planner
# cannot pick a hash join that reads the whole table (or all attempts) for a few hundred rows;
# these are probes of the primary key and of outbox_attempt_message_idx. Returns how many
# messages went and the highest id among them (the next batch's :after_id); uuid has no max()
# aggregate, hence the ORDER BY.
PG_PURGE_BATCH = f"""
WITH doomed AS (
    SELECT seq FROM outbox_message
    WHERE {_PG_ELIGIBLE}
    ORDER BY id
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM outbox_message
    WHERE seq = ANY(ARRAY(SELECT seq FROM doomed))
    RETURNING id
), attempts AS (
    DELETE FROM outbox_attempt
    WHERE message_id = ANY(ARRAY(SELECT id FROM gone))
)
SELECT (SELECT count(*) FROM gone),
       (SELECT id FROM gone ORDER BY id DESC LIMIT 1)
"""  # noqa: S608 - the fragment is a module constant; every value is bound

# For --dry-run and the progress bar: the rows a purge started now would delete (less any that
# are locked when it runs).
PG_COUNT_ELIGIBLE = f"SELECT count(*) FROM outbox_message WHERE {_PG_ELIGIBLE}"  # noqa: S608

# SQLite: the stored times are text in one format, so max() and < compare them as times; a
# multi-argument max() is NULL if any argument is, hence the coalesce.
_SQLITE_ELIGIBLE = _ELIGIBLE.format(
    state_in="state IN (SELECT value FROM json_each(:states))",
    failed_at="max(created_at, coalesce(last_failed_at, created_at), "
    "coalesce(replayed_at, created_at))",
)

# SQLite has no data-modifying CTEs: a batch is this DELETE and SQLITE_PURGE_ATTEMPTS for the ids
# it returns, in one BEGIN IMMEDIATE transaction (the write lock, held for the batch only, is what
# keeps anything from changing the rows in between). The ids come back as the stored hex text.
SQLITE_PURGE_MESSAGES = f"""
DELETE FROM outbox_message
WHERE seq IN (
    SELECT seq FROM outbox_message
    WHERE {_SQLITE_ELIGIBLE}
    ORDER BY id
    LIMIT :batch_size
)
RETURNING id
"""  # noqa: S608

# :ids is a JSON array of message ids as SQLite stores them (32 lowercase hex digits).
SQLITE_PURGE_ATTEMPTS = """
DELETE FROM outbox_attempt WHERE message_id IN (SELECT value FROM json_each(:ids))
"""

SQLITE_COUNT_ELIGIBLE = f"SELECT count(*) FROM outbox_message WHERE {_SQLITE_ELIGIBLE}"  # noqa: S608


# --------------------------------------------------------------------------- PostgreSQL storage


# --------------------------------------------------------------------------- running it

_Time = DateTime(timezone=True)


def _stmt(sql: str) -> TextClause:
    wanted = [
        bindparam(name, type_=t)
        for name, t in (
            ("after_id", Uuid()),
            ("cutoff_id", Uuid()),
            ("cutoff", _Time),
            ("batch_size", Integer()),
        )
        if f":{name}" in sql
    ]
    return text(sql).bindparams(*wanted)


_PG_BATCH = _stmt(PG_PURGE_BATCH)
_PG_COUNT = _stmt(PG_COUNT_ELIGIBLE)
_SQLITE_MESSAGES = _stmt(SQLITE_PURGE_MESSAGES)
_SQLITE_ATTEMPTS = text(SQLITE_PURGE_ATTEMPTS)
_SQLITE_COUNT = _stmt(SQLITE_COUNT_ELIGIBLE)


@dataclass(frozen=True, slots=True)
class _Plan:
    states: tuple[str, ...]
    cutoff: dt.datetime
    cutoff_id: uuid.UUID

    def params(self, dialect: str, after_id: uuid.UUID) -> dict[str, Any]:
        states: Any = list(self.states) if dialect == "postgresql" else json.dumps(self.states)
        return {
            "states": states,
            "cutoff": self.cutoff,
            "cutoff_id": self.cutoff_id,
            "after_id": after_id,
        }


def _plan(states: Iterable[str], older_than_seconds: float, now: dt.datetime) -> _Plan:
    cutoff = cutoff_time(now, older_than_seconds)
    return _Plan(check_states(states), cutoff, cutoff_id(cutoff))


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")


@contextmanager
def _autocommit(engine: Engine) -> Iterator[Connection]:
    # Whatever the engine's own mode (the relay's is autocommit, the CLI's and applications' are
    # not): PostgreSQL runs each batch as one statement, SQLite in an explicit BEGIN IMMEDIATE.
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


def _delete_batch(
    engine: Engine, plan: _Plan, batch_size: int, after_id: uuid.UUID = _NIL
) -> tuple[int, uuid.UUID | None]:
    """Delete one batch; return how many messages went and the highest id among them.

    Does not check `plan.states` (the SQL itself never deletes live rows); use purge_batch.
    """
    dialect = engine.dialect.name
    params = plan.params(dialect, after_id) | {"batch_size": batch_size}
    with _autocommit(engine) as conn:
        if dialect == "postgresql":
            count, last = conn.execute(_PG_BATCH, params).one()
            return int(count), None if last is None else uuid.UUID(str(last))
        with sqlite_transaction(conn):
            ids = [str(i) for i in conn.execute(_SQLITE_MESSAGES, params).scalars()]
            if ids:
                conn.execute(_SQLITE_ATTEMPTS, {"ids": json.dumps(ids)})
    return len(ids), uuid.UUID(max(ids)) if ids else None


def purge_batch(
    engine: Engine,
    *,
    states: Iterable[str],
    older_than_seconds: float,
    batch_size: int,
    now: dt.datetime,
) -> int:
    """Delete up to `batch_size` messages in `states` older than the cutoff, oldest ids first, with
    their attempt rows, in one short transaction; return how many messages went."""
    _check_batch_size(batch_size)
    deleted, _ = _delete_batch(engine, _plan(states, older_than_seconds, now), batch_size)
    return deleted


def purge(
    engine: Engine,
    *,
    states: Iterable[str],
    older_than_seconds: float,
    batch_size: int = 1000,
    now: dt.datetime,
    progress: Callable[[int], object] | None = None,
    max_batches: int | None = None,
    rest_ratio: float | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> int:
    """Delete every message in `states` older than the cutoff, batch by batch; return how many.

    The cutoff is fixed when the purge starts. `progress(n)` is called after each batch with the
    messages it deleted. It stops at the first batch that comes back short: each batch resumes
    after the last id deleted, so a short one means the id range below the cutoff is exhausted
    (rows locked at that moment are left for the next purge). `max_batches` bounds the work of one
    call. `rest_ratio` (default: SQLITE_REST_RATIO on SQLite, 0 on PostgreSQL, where nothing waits
    for a purge) rests that many times a batch's duration after it, through `sleep`.
    """
    _check_batch_size(batch_size)
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be at least 1, not {max_batches}")
    plan = _plan(states, older_than_seconds, now)
    if rest_ratio is None:
        rest_ratio = SQLITE_REST_RATIO if engine.dialect.name == "sqlite" else 0.0
    total, batches, after_id = 0, 0, _NIL
    while max_batches is None or batches < max_batches:
        started = time.monotonic()
        deleted, last = _delete_batch(engine, plan, batch_size, after_id)
        batches += 1
        total += deleted
        if deleted and progress is not None:
            progress(deleted)
        if deleted < batch_size or last is None:
            break
        after_id = last
        if rest_ratio > 0:
            sleep(rest_ratio * (time.monotonic() - started))
    return total


def count_eligible(
    engine: Engine, *, states: Iterable[str], older_than_seconds: float, now: dt.datetime
) -> int:
    """How many messages `purge` with these arguments would delete now (changes nothing)."""
    plan = _plan(states, older_than_seconds, now)
    dialect = engine.dialect.name
    stmt = _PG_COUNT if dialect == "postgresql" else _SQLITE_COUNT
    with engine.connect() as conn:
        return int(conn.execute(stmt, plan.params(dialect, _NIL)).scalar_one())
