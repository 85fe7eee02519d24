"""The operator's queries: list, show, replay, discard, cancel, per-exchange status.

Written with SQLAlchemy Core on the `outbox.schema` tables, so one definition serves every
database (the one raw statement, the unpark sweep, is the dialect's); values are always bound.
Every state change names the states it may leave, so a command racing a relay either wins cleanly
or changes nothing.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Engine,
    and_,
    case,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError

from outbox.migrate import upgrade
from outbox.schema import attempt, message
from outbox.states import State
from relay.core.retention import FAILED_STATES
from relay.errors import MigrationDenied
from relay.store.databases import dialect_for


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
        return clauses


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


REPLAYABLE = FAILED_STATES


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


def _transition(
    engine: Engine,
    ids: Sequence[uuid.UUID],
    *,
    from_states: Sequence[str],
    values: dict[str, Any],
    outcome: str,
    now: dt.datetime,
    by: str,
) -> list[uuid.UUID]:
    if not ids:
        return []
    stmt = (
        update(message)
        .where(message.c.id.in_(list(ids)), message.c.state.in_(list(from_states)))
        .values(**values)
        .returning(message.c.id, message.c.attempts)
    )
    with engine.begin() as conn:
        changed = conn.execute(stmt).all()
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
                        "error": None,
                        "next_attempt_at": now if outcome == "replayed" else None,
                    }
                    for i, attempts in changed
                ],
            )
    return [uuid.UUID(str(i)) for i, _ in changed]


def per_exchange(engine: Engine, now: dt.datetime) -> list[dict[str, Any]]:
    """Counts by state and the oldest ready age, per exchange."""
    m = message.c
    ready = and_(m.state == State.PENDING.value, m.available_at <= now)
    columns: list[Any] = [m.exchange]
    columns += [func.sum(case((m.state == s.value, 1), else_=0)).label(s.value) for s in State]
    columns.append(func.min(case((ready, m.available_at), else_=None)).label("oldest_ready"))
    stmt = select(*columns).group_by(m.exchange).order_by(m.exchange)
    out: list[dict[str, Any]] = []
    with engine.connect() as conn:
        for row in conn.execute(stmt).mappings():
            entry = {"exchange": row["exchange"]}
            entry.update({s.value: int(row[s.value] or 0) for s in State})
            oldest = row["oldest_ready"]
            if isinstance(oldest, str):  # SQLite returns the stored text from min()
                oldest = dt.datetime.fromisoformat(oldest)
            oldest = _utc(oldest)
            entry["oldest_ready_age_s"] = (
                None if oldest is None else round(max(0.0, (now - oldest).total_seconds()), 3)
            )
            out.append(entry)
    return out


# SQLSTATEs of a role that may not do what a migration asks (never told apart by message text).
_INSUFFICIENT_PRIVILEGE = "42501"
_NO_SCHEMA = "3F000"  # nothing on the search_path exists, or the role may not use it


def migrate(engine: Engine) -> int:
    """Create or upgrade the outbox schema; return its version. A role that lacks a privilege
    gets a MigrationDenied naming it (and the GRANT that gives it), not the driver's
    error."""
    try:
        return upgrade(engine)
    except DBAPIError as exc:
        sqlstate = getattr(exc.orig, "sqlstate", None)
        if sqlstate not in (_INSUFFICIENT_PRIVILEGE, _NO_SCHEMA):
            raise
        raise MigrationDenied(_missing_privilege(engine, exc, sqlstate)) from exc


def _missing_privilege(engine: Engine, exc: DBAPIError, sqlstate: str) -> str:
    try:
        with engine.connect() as conn:
            role, schema, database = conn.exec_driver_sql(
                "SELECT current_user, current_schema(), current_database()"
            ).one()
    except DBAPIError:
        role, schema, database = "this role", None, "this database"
    if sqlstate == _NO_SCHEMA or schema is None:
        return (
            f"role {role} has no schema to create the outbox tables in: no schema on its "
            f"search_path exists or grants it USAGE (GRANT USAGE, CREATE ON SCHEMA ... TO {role})"
        )
    verb = (exc.statement or "").lstrip().split(" ", 1)[0].upper()
    if verb in ("CREATE", ""):
        return (
            f"role {role} lacks the CREATE privilege on schema {schema} of database {database}: "
            f"run `GRANT CREATE ON SCHEMA {schema} TO {role}`, or migrate as the schema's owner"
        )
    # ALTER, and anything else a later migration does to an existing table, needs its owner.
    return (
        f"role {role} does not own the outbox tables in schema {schema} ({verb} needs the "
        "owner's privileges): migrate as the role that created them"
    )
