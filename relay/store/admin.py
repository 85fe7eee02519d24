"""The operator's queries: list, page, show, failure groups, replay, discard, cancel, reschedule,
prioritize, per-exchange status, and the console's activity per minute.

Written with SQLAlchemy Core on the `outbox.schema` tables, so one definition serves every
database (the one raw statement, the unpark sweep, is the dialect's); values are always bound.
Every state change names the states it may leave, so a command racing a relay either wins cleanly
or changes nothing.

It is longer than the project's 500 lines because it is one interface: the command line's
operator commands and the console each call both its reads (list, page, show, groups, counts) and
its changes, all through MessageFilter.where and one guarded `_transition`; split into reads and
changes, each caller would import both halves and each half would need the other's filter.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError

from outbox.dberrors import sqlstate_of
from outbox.migrate import upgrade
from outbox.schema import attempt, message
from outbox.states import State
from relay.core.retention import FAILED_STATES
from relay.errors import MigrationDenied
from relay.store import counting
from relay.store.databases import dialect_for
from relay.store.retention import cutoff_id


@dataclass(frozen=True, slots=True)
class MessageFilter:
    states: Sequence[str] = ()
    exchange: str | None = None
    routing_key: str | None = None
    key: str | None = None
    created_since: dt.datetime | None = None
    created_until: dt.datetime | None = None
    failed_since: dt.datetime | None = None
    failed_until: dt.datetime | None = None
    error_contains: str | None = None
    # A failure group (failure_groups): the first GROUP_CHARS characters of the last error.
    error_group: str | None = None
    no_error: bool = False  # only messages without a last error (a failure group of NULLs)
    max_seq: int | None = None  # only messages enqueued up to this seq (a counted set's bound)
    ids: Sequence[uuid.UUID] = field(default_factory=tuple)

    def where(self) -> list[ColumnElement[bool]]:
        m = message.c
        clauses: list[ColumnElement[bool]] = []
        if self.ids:
            clauses.append(m.id.in_(list(self.ids)))
        if self.states:
            clauses.append(m.state.in_(list(self.states)))
        if self.exchange is not None:
            clauses.append(m.exchange == self.exchange)
        if self.routing_key is not None:
            clauses.append(m.routing_key == self.routing_key)
        if self.key is not None:
            clauses.append(m.key == self.key)
        if self.created_since is not None:
            clauses.append(m.created_at >= self.created_since)
        if self.created_until is not None:
            clauses.append(m.created_at < self.created_until)
        if self.failed_since is not None:
            clauses.append(m.last_failed_at >= self.failed_since)
        if self.failed_until is not None:
            clauses.append(m.last_failed_at < self.failed_until)
        if self.error_contains:
            clauses.append(m.last_error.contains(self.error_contains, autoescape=True))
        if self.error_group is not None:
            clauses.append(_error_group() == self.error_group)
        if self.no_error:
            clauses.append(m.last_error.is_(None))
        if self.max_seq is not None:
            clauses.append(m.seq <= self.max_seq)
        return clauses


# How much of an error names its group: enough to tell causes apart, short enough that messages
# differing only in a long tail (an id, a payload excerpt) still group together.
GROUP_CHARS = 200


def _error_group() -> ColumnElement[str]:
    # Literal bounds, not bound values: PostgreSQL matches a GROUP BY expression to the selected
    # one by its text, and two sets of bound parameters would make them different expressions.
    return func.substr(message.c.last_error, literal_column("1"), literal_column(str(GROUP_CHARS)))


_SUMMARY_COLUMNS = (
    message.c.id,
    message.c.state,
    message.c.exchange,
    message.c.routing_key,
    message.c.key,
    message.c.priority,
    message.c.attempts,
    message.c.max_attempts,
    message.c.created_at,
    message.c.available_at,
    message.c.published_at,
    message.c.last_failed_at,
    message.c.last_error,
    message.c.replay_count,
)


def _utc(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def _row(mapping: Any) -> dict[str, Any]:
    return {k: _utc(v) for k, v in dict(mapping).items()}


def list_messages(engine: Engine, flt: MessageFilter, limit: int) -> list[dict[str, Any]]:
    """Newest first."""
    stmt = select(*_SUMMARY_COLUMNS).where(*flt.where()).order_by(message.c.seq.desc())
    with engine.connect() as conn:
        return [_row(r) for r in conn.execute(stmt.limit(limit)).mappings()]


def get_message(engine: Engine, message_id: uuid.UUID) -> dict[str, Any] | None:
    """The whole message, with its attempt history oldest first, or None."""
    with engine.connect() as conn:
        found = conn.execute(select(message).where(message.c.id == message_id)).mappings().first()
        if found is None:
            return None
        history = conn.execute(
            select(
                attempt.c.attempt,
                attempt.c.at,
                attempt.c.relay_id,
                attempt.c.failure_class,
                attempt.c.outcome,
                attempt.c.error,
                attempt.c.next_attempt_at,
            )
            .where(attempt.c.message_id == message_id)
            .order_by(attempt.c.id)
        ).mappings()
        result = _row(found)
        result["attempt_history"] = [_row(h) for h in history]
    return result


def matching_ids(engine: Engine, flt: MessageFilter, limit: int | None = None) -> list[uuid.UUID]:
    """Ids of the messages a bulk command would touch, oldest first (replay keeps order)."""
    stmt = select(message.c.id).where(*flt.where()).order_by(message.c.seq)
    if limit is not None:
        stmt = stmt.limit(limit)
    with engine.connect() as conn:
        return [uuid.UUID(str(i)) for i in conn.execute(stmt).scalars()]


def matching_batches(engine: Engine, flt: MessageFilter, size: int) -> Iterator[list[uuid.UUID]]:
    """The ids `flt` matches, oldest first, `size` at a time: a bulk command over a whole state
    never holds every id, and never binds more than `size` of them into one statement.

    Each batch is its own short read, resumed after the last seq seen (keyset, not OFFSET), so
    a caller may change the rows of one batch before asking for the next: a replayed row leaves
    the filter's state, and nothing is skipped or seen twice.
    """
    if flt.ids:
        for start in range(0, len(flt.ids), size):
            chunk = replace(flt, ids=tuple(flt.ids[start : start + size]))
            found = matching_ids(engine, chunk)
            if found:
                yield found
        return
    after: int | None = None
    while True:
        stmt = select(message.c.seq, message.c.id).where(*flt.where())
        if after is not None:
            stmt = stmt.where(message.c.seq > after)
        with engine.connect() as conn:
            rows = conn.execute(stmt.order_by(message.c.seq).limit(size)).all()
        if rows:
            yield [uuid.UUID(str(i)) for _, i in rows]
        if len(rows) < size:
            return
        after = int(rows[-1][0])


def count_messages(engine: Engine, flt: MessageFilter) -> int:
    """How many messages `flt` matches (for a progress bar's total)."""
    stmt = select(func.count()).select_from(message).where(*flt.where())
    with engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def count_and_last(engine: Engine, flt: MessageFilter) -> tuple[int, int | None]:
    """How many messages `flt` matches, and the highest seq among them (None for none): what a
    confirmation may then act on (MessageFilter.max_seq), however many arrive meanwhile."""
    stmt = select(func.count(), func.max(message.c.seq)).where(*flt.where())
    with engine.connect() as conn:
        count, last = conn.execute(stmt).one()
    return int(count), None if last is None else int(last)


@dataclass(frozen=True, slots=True)
class Page:
    """One page of messages, newest first, and the cursors of its neighbours (None: none)."""

    rows: list[dict[str, Any]]
    older: int | None  # pass as `before` for the next older page
    newer: int | None  # pass as `after` for the next newer page


def page_messages(
    engine: Engine,
    flt: MessageFilter,
    limit: int,
    *,
    before: int | None = None,
    after: int | None = None,
) -> Page:
    """A page of `flt`'s matches, newest first, by keyset on seq (never OFFSET): each page reads
    from its cursor along the primary key, so the thousandth page costs what the first does.
    `before` gives the page older than that seq, `after` the one newer; one more row than
    `limit` is read to know whether the page has a neighbour that way."""
    m = message.c
    stmt = select(m.seq, *_SUMMARY_COLUMNS).where(*flt.where()).limit(limit + 1)
    if after is not None:
        stmt = stmt.where(m.seq > after).order_by(m.seq)
    else:
        if before is not None:
            stmt = stmt.where(m.seq < before)
        stmt = stmt.order_by(m.seq.desc())
    with engine.connect() as conn:
        found = [_row(r) for r in conn.execute(stmt).mappings()]
    more = len(found) > limit
    rows = found[:limit]
    if after is not None:
        rows.reverse()
    if not rows:
        return Page([], None, None)
    older = rows[-1]["seq"] if (more if after is None else True) else None
    newer = rows[0]["seq"] if (more if after is not None else before is not None) else None
    return Page(rows, older, newer)


def failure_groups(engine: Engine, flt: MessageFilter, limit: int) -> list[dict[str, Any]]:
    """`flt`'s messages grouped by exchange and the start of their last error, the largest
    groups first: one cause, one line, however many messages it failed. Each group's
    `error` is the MessageFilter.error_group that selects it."""
    m = message.c
    group = _error_group().label("error")
    count = func.count().label("count")
    stmt = (
        select(m.exchange, group, count,
               func.min(m.last_failed_at).label("first_failed_at"),
               func.max(m.last_failed_at).label("last_failed_at"))
        .where(*flt.where())
        .group_by(m.exchange, group)
        .order_by(count.desc(), m.exchange)
        .limit(limit)
    )  # fmt: skip
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(stmt).mappings()]
    for row in rows:
        for name in ("first_failed_at", "last_failed_at"):
            row[name] = _utc(_time(row[name]))
    return rows


def states_of(engine: Engine, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Each of `ids` that exists, with its state."""
    if not ids:
        return {}
    stmt = select(message.c.id, message.c.state).where(message.c.id.in_(list(ids)))
    with engine.connect() as conn:
        return {uuid.UUID(str(i)): str(s) for i, s in conn.execute(stmt)}


def _time(value: Any) -> Any:
    # SQLite hands back min()/max() of a time column as the stored text.
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else value


REPLAYABLE = FAILED_STATES
# What reschedule, prioritize and cancel may change: a row no relay holds. A claim takes the
# row's lock (PostgreSQL) or the write lock (SQLite) until it commits, after which the row is
# in_flight and these UPDATEs match nothing.
UNCLAIMED = (State.PENDING.value,)
# The priorities a row can hold (an INTEGER column, as enqueue checks).
PRIORITIES = range(-(2**31), 2**31)


def replay(
    engine: Engine, ids: Sequence[uuid.UUID], *, now: dt.datetime, by: str
) -> list[uuid.UUID]:
    """Back to pending with attempts reset and the same id; returns the ids that changed."""
    return _transition(
        engine,
        ids,
        from_states=REPLAYABLE,
        values={
            "state": State.PENDING.value,
            "attempts": 0,
            "available_at": now,
            "replay_count": message.c.replay_count + 1,
            "replayed_at": now,
        },
        outcome="replayed",
        now=now,
        by=by,
        next_at=now,
    )


def discard(
    engine: Engine, ids: Sequence[uuid.UUID], *, now: dt.datetime, by: str
) -> list[uuid.UUID]:
    """Dead to discarded: never sent, kept for audit until retention removes it."""
    return _transition(
        engine,
        ids,
        from_states=(State.DEAD.value,),
        values={"state": State.DISCARDED.value},
        outcome="discarded",
        now=now,
        by=by,
    )


def cancel(
    engine: Engine, ids: Sequence[uuid.UUID], *, now: dt.datetime, by: str
) -> dict[uuid.UUID, str]:
    """Cancel messages not yet claimed. Returns each id's state afterwards.

    Only `pending` rows change. A relay that claimed the row first holds its row lock
    (PostgreSQL) or the write lock (SQLite) until the claim commits, after which the row is
    `in_flight` and this UPDATE matches nothing: the command then reports it too late.
    """
    changed = set(
        _transition(
            engine,
            ids,
            from_states=(State.PENDING.value,),
            values={"state": State.CANCELLED.value},
            outcome="cancelled",
            now=now,
            by=by,
        )
    )
    with engine.connect() as conn:
        states = {
            uuid.UUID(str(i)): s
            for i, s in conn.execute(
                select(message.c.id, message.c.state).where(message.c.id.in_(list(ids)))
            )
        }
    return {i: ("cancelled" if i in changed else states.get(i, "not found")) for i in ids}


def reschedule(
    engine: Engine, ids: Sequence[uuid.UUID], *, at: dt.datetime, now: dt.datetime, by: str
) -> list[uuid.UUID]:
    """Pending messages due at `at` instead (earlier or later); returns the ids that changed.
    Race-safe as `cancel` is: a message a relay has claimed is not changed."""
    at = at.astimezone(dt.UTC)  # SQLite keeps the digits of a time, not its offset
    return _transition(
        engine,
        ids,
        from_states=UNCLAIMED,
        values={"available_at": at},
        outcome="rescheduled",
        now=now,
        by=by,
        next_at=at,
        detail=f"due at {at.isoformat()}",
    )


def prioritize(
    engine: Engine, ids: Sequence[uuid.UUID], *, priority: int, now: dt.datetime, by: str
) -> list[uuid.UUID]:
    """Pending messages claimed at `priority` from now on; returns the ids that changed.
    Race-safe as `cancel` is."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority {priority} is out of range")
    return _transition(
        engine,
        ids,
        from_states=UNCLAIMED,
        values={"priority": priority},
        outcome="prioritized",
        now=now,
        by=by,
        detail=f"priority {priority}",
    )


def _transition(
    engine: Engine,
    ids: Sequence[uuid.UUID],
    *,
    from_states: Sequence[str],
    values: dict[str, Any],
    outcome: str,
    now: dt.datetime,
    by: str,
    next_at: dt.datetime | None = None,
    detail: str | None = None,
) -> list[uuid.UUID]:
    """The UPDATE, guarded by `from_states`, and an attempt record naming `by` (who) for each
    row it changed, in one transaction."""
    if not ids:
        return []
    guard = (message.c.id.in_(list(ids)), message.c.state.in_(list(from_states)))
    with engine.begin() as conn:
        changed = _update_returning(conn, guard, values)
        if changed and outcome in ("cancelled", "discarded"):
            # A cancelled or discarded head frees its key: unpark the next message now rather
            # than at the relay's next sweep (with dead heads still holding their keys: the
            # relays' own sweep frees those where dead_key is "skip").
            conn.execute(dialect_for(conn.dialect.name).sql.unpark_sweep)
        if changed:
            # inline(): no RETURNING of the new ids, which would need SELECT on outbox_attempt
            # (relay/store/grants.py); nothing reads them.
            conn.execute(
                insert(attempt).inline(),
                [
                    {
                        "message_id": i,
                        "attempt": attempts,
                        "at": now,
                        "relay_id": by,
                        "failure_class": "operator",
                        "outcome": outcome,
                        "error": detail,
                        "next_attempt_at": next_at,
                    }
                    for i, attempts in changed
                ],
            )
    return [uuid.UUID(str(i)) for i, _ in changed]


def _update_returning(
    conn: Connection, guard: tuple[ColumnElement[bool], ...], values: dict[str, Any]
) -> list[tuple[Any, int]]:
    """UPDATE the rows `guard` picks; return (id, attempts) of each, as changed. MySQL has no
    UPDATE ... RETURNING: the rows are locked and listed first (FOR UPDATE, in the caller's
    transaction, so the UPDATE changes exactly those), then read back."""
    m = message.c
    if conn.dialect.update_returning:
        stmt = update(message).where(*guard).values(**values).returning(m.id, m.attempts)
        return [(i, n) for i, n in conn.execute(stmt)]
    seqs = list(conn.execute(select(m.seq).where(*guard).with_for_update()).scalars())
    if not seqs:
        return []
    conn.execute(update(message).where(m.seq.in_(seqs)).values(**values))
    changed = select(m.id, m.attempts).where(m.seq.in_(seqs)).order_by(m.seq)
    return [(i, n) for i, n in conn.execute(changed)]


def per_exchange(engine: Engine, now: dt.datetime) -> list[dict[str, Any]]:
    """Counts by state and the oldest ready age, per exchange: exact through the partial
    indexes, published and cancelled estimated beside a large table (relay/store/counting.py)."""
    with engine.connect() as conn:
        return counting.exchange_counts(dialect_for(engine.dialect.name), conn, now)


def activity(
    engine: Engine, *, since: dt.datetime, enqueued_since: dt.datetime
) -> dict[dt.datetime, dict[str, int]]:
    """What happened each minute since `since` (UTC minutes): `published`, counted among the
    messages enqueued since `enqueued_since` (the bound that keeps the scan to recent rows), and
    the relays' failed attempts by outcome (`retry`, `deferred`, `dead`). Minutes with nothing
    are absent."""
    sql = dialect_for(engine.dialect.name).sql
    since = since.astimezone(dt.UTC)
    floor = cutoff_id(enqueued_since)
    out: dict[dt.datetime, dict[str, int]] = {}
    with engine.connect() as conn:
        published = {"since": since, "id_floor": floor}
        for minute, n in conn.execute(sql.published_per_minute, published):
            out.setdefault(_minute(minute), {})["published"] = int(n)
        for minute, outcome, n in conn.execute(sql.failed_per_minute, {"since": since}):
            counts = out.setdefault(_minute(minute), {})
            counts[str(outcome)] = counts.get(str(outcome), 0) + int(n)
    return out


def _minute(value: Any) -> dt.datetime:
    if isinstance(value, str):  # SQLite: 'YYYY-MM-DD HH:MM', UTC
        return dt.datetime.strptime(value, "%Y-%m-%d %H:%M").replace(tzinfo=dt.UTC)
    assert isinstance(value, dt.datetime)
    moment: dt.datetime = _utc(value)
    return moment.astimezone(dt.UTC)


# SQLSTATEs of a role that may not do what a migration asks (never told apart by message text):
# insufficient privilege, and no schema on the search_path that exists or that it may use.
_DENIED = ("42501", "3F000")


def migrate(engine: Engine) -> int:
    """Create or upgrade the outbox schema; return its version. A role that lacks a privilege
    gets a MigrationDenied naming it (and the GRANT that gives it), not the driver's error
    (Dialect.migration_denied)."""
    try:
        return upgrade(engine)
    except DBAPIError as exc:
        sqlstate = sqlstate_of(exc.orig)
        if sqlstate not in _DENIED:
            raise
        why = dialect_for(engine.dialect.name).migration_denied(engine, exc, sqlstate)
        raise MigrationDenied(why) from exc
