"""Retention: delete terminal messages older than a cutoff, a small batch at a time. The
statements are each dialect's (`Dialect.purge_batch`, `Statements.count_eligible`); the
autovacuum settings that keep the tables small live with the schema, in outbox/databases.py.

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
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from outbox.states import State
from relay.core.retention import FAILED_STATES, RetentionPolicy
from relay.store.databases import dialect_for
from relay.store.dialect import Dialect

log = logging.getLogger("relay")

TERMINAL_STATES: tuple[str, ...] = (State.PUBLISHED.value, *FAILED_STATES)
NEVER_PURGED: tuple[str, ...] = (State.PENDING.value, State.IN_FLIGHT.value)

# Below every message id (new_id never makes the nil UUID): where a purge's id cursor starts.
_NIL = uuid.UUID(int=0)
_MS = dt.timedelta(milliseconds=1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


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


# --------------------------------------------------------------------------- running it


@dataclass(frozen=True, slots=True)
class _Plan:
    states: tuple[str, ...]
    cutoff: dt.datetime
    cutoff_id: uuid.UUID

    def params(self, dialect: Dialect, after_id: uuid.UUID) -> dict[str, Any]:
        return {
            "states": dialect.bind_list(self.states),
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
    # not): a batch is one statement (PostgreSQL) or the dialect's own short transaction (SQLite).
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


def _delete_batch(
    engine: Engine, plan: _Plan, batch_size: int, after_id: uuid.UUID = _NIL
) -> tuple[int, uuid.UUID | None]:
    """Delete one batch; return how many messages went and the highest id among them.

    Does not check `plan.states` (the SQL itself never deletes live rows); use purge_batch.
    """
    dialect = dialect_for(engine.dialect.name)
    params = plan.params(dialect, after_id) | {"batch_size": batch_size}
    with _autocommit(engine) as conn:
        return dialect.purge_batch(conn, params)


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
    call. `rest_ratio` (default: the dialect's purge_rest_ratio: 1 on SQLite, 0 where nothing waits
    for a purge) rests that many times a batch's duration after it, through `sleep`.
    """
    _check_batch_size(batch_size)
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be at least 1, not {max_batches}")
    plan = _plan(states, older_than_seconds, now)
    if rest_ratio is None:
        rest_ratio = dialect_for(engine.dialect.name).purge_rest_ratio
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
    dialect = dialect_for(engine.dialect.name)
    with engine.connect() as conn:
        found = conn.execute(dialect.sql.count_eligible, plan.params(dialect, _NIL))
        return int(found.scalar_one())


def run_retention_once(engine: Engine, policy: RetentionPolicy, now: dt.datetime) -> int:
    """One bounded pass of the relay's retention: delete what the policy says has expired at
    `now`, at most `policy.max_batches` batches per group; return how many messages went.

    Never sleeps. Driver errors propagate as they are: SqlStore.purge_expired runs this behind
    the store's error boundary.
    """
    deleted: dict[str, int] = {}
    for states, age in policy.groups():
        deleted[states[0]] = purge(
            engine,
            states=states,
            older_than_seconds=age,
            batch_size=policy.batch_size,
            now=now,
            max_batches=policy.max_batches,
            rest_ratio=0.0,
        )
    total = sum(deleted.values())
    if total:
        log.info(
            "relay.retention_purged",
            extra={
                "published": deleted.get(State.PUBLISHED.value, 0),
                "failed": deleted.get(FAILED_STATES[0], 0),
            },
        )
    return total
