"""A dialect's statements as typed attributes: each field of a Statements class names the block of
the .sql files it is built from (queries.py), its result columns' types and the lists it binds, so
what a statement is and where it comes from stand on one line, and `outbox-relay sql` can print
the text of every one.

    @dataclass(frozen=True, slots=True)
    class PostgresStatements(Statements):
        claim: Annotated[Compiled, Query("claim", CLAIMED_COLUMNS)]

`build` compiles every field once per store configuration (the dead-key mode and the circuit
scope are written into some of them; see Dialect.__init__), never per call: the claim and mark
statements run thousands of times a second, and parsing the text and typing its binds each time
would show. A field annotated `str` holds the text itself, for what runs on a driver connection
(exec_driver_sql). A field annotated `Driven` is run on the driver's own cursor, past
SQLAlchemy's result rows (relay/store/driven.py): the hot path's few statements, where building
hundreds of rows a claim twice would show too.

Every statement of every dialect binds the same values under the same names:

- `:now` is the time to use, or NULL for the database's own clock. Production binds NULL; tests
  bind a frozen time. Every statement that reads or stamps a time goes through it.
- Durations are bound in seconds (`:lease_seconds`, `:delay_seconds`, `:within`) and added to
  the time in SQL.
- Lists (`:seqs`, `:tokens`, `:exclude`, `:states`) are bound as Dialect.bind_list makes them; a
  UUID in a list is its 32 hex digits. A dialect that names them in `lists` gets them as
  SQLAlchemy's expanding parameters (`seq IN :seqs` in its text).
- A statement that changes a leased row names `lease_token = :token AND state = 'in_flight'` in
  its WHERE clause: a relay whose lease expired (and was taken over) changes nothing.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    String,
    TextClause,
    TextualSelect,
    bindparam,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.types import TypeEngine

from outbox.schema import UUID
from relay.store.queries import Queries, QueryError

TIME = DateTime(timezone=True)

# The type of every bind that needs one, by name: the same name means the same thing in every
# statement of every dialect. Others (numbers, text, lists) go to the driver as they are.
_BIND_TYPES: Mapping[str, TypeEngine[Any]] = {
    "now": TIME,
    "token": UUID,
    "message_id": UUID,
    "after_id": UUID,
    "cutoff_id": UUID,
    "id_floor": UUID,
    "cutoff": TIME,
    "since": TIME,
    "seen_before": TIME,
    "open_until": TIME,
    "probe_until": TIME,
    "changed_at": TIME,
    "tokens_at": TIME,
    "available_at": TIME,
    "next_at": TIME,
    "started_at": TIME,
    "batch_size": Integer(),
}
_BIND = re.compile(r"(?<![:\w]):(\w+)")
_INDENT = re.compile(r"\n[ \t]+")

# Result columns whose driver value needs converting (SQLite returns times as text, UUIDs as hex).
CLAIMED_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "seq": BigInteger(),
    "id": UUID,
    "exchange": String(),
    "routing_key": String(),
    "payload": LargeBinary(),
    "content_type": String(),
    "headers": JSON().with_variant(postgresql.JSON(), "postgresql"),
    "key": String(),
    "priority": Integer(),
    "attempts": Integer(),
    "max_attempts": Integer(),
    "available_at": TIME,
    "created_at": TIME,
    "traceparent": String(),
    "tracestate": String(),
    "suspect": Boolean(),  # claimed apart (relay/core/suspects.py)
}
RESOURCE_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "resource": String(),
    "state": String(),
    "failures": Integer(),
    "opens": Integer(),
    "open_until": TIME,
    "probe_owner": String(),
    "probe_until": TIME,
    "last_error": String(),
    "changed_at": TIME,
    "tokens": Float(),
    "tokens_at": TIME,
}
LOCKED_RESOURCE_COLUMNS: Mapping[str, TypeEngine[Any]] = {**RESOURCE_COLUMNS, "now": TIME}
RELAY_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "relay_id": String(),
    "started_at": TIME,
    "last_seen": TIME,
}
# What taking a lease back reads of each row (relay/store/rescuer.py).
STUCK_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "seq": BigInteger(),
    "id": UUID,
    "lease_owner": String(),
    "lease_token": UUID,
    "suspect": String(),
    "attempts": Integer(),
    "max_attempts": Integer(),
}
# What settling in steps reads of the rows a lease still holds (relay/store/stepwise.py).
HELD_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "seq": BigInteger(),
    "id": UUID,
    "attempts": Integer(),
}
EXCHANGE_COLUMNS: Mapping[str, TypeEngine[Any]] = {
    "exchange": String(),
    "state": String(),
    "n": BigInteger(),
    "oldest": TIME,
}

# A statement ready to run: TextualSelect when its result columns are typed.
Compiled = TextClause | TextualSelect


@dataclass(frozen=True, slots=True)
class Driven:
    """A statement the driver runs itself: its text as written (`:name` binds), and the same
    in the driver's paramstyle (`%(name)s`, a literal `%` doubled). Binds go to the driver as
    they are, results come back as the driver's tuples."""

    sql: str
    pyformat: str

    @classmethod
    def of(cls, sql: str) -> Driven:
        # Without its lines' indentation: psycopg parses a statement's text on every run unless
        # it is at most 4096 characters (then it caches the parse), and the claim's indented
        # text is longer.
        sent = _INDENT.sub("\n", sql.strip())
        return cls(sql, _BIND.sub(r"%(\1)s", sent.replace("%", "%%")))


def compile_sql(
    sql: str, columns: Mapping[str, TypeEngine[Any]] | None = None, *, lists: Collection[str] = ()
) -> Compiled:
    """A statement ready to run many times: its binds typed by name (those named in `lists`
    expanding), its result columns typed."""
    names = set(_BIND.findall(sql))
    clause = text(sql)
    typed = [bindparam(n, type_=t) for n, t in _BIND_TYPES.items() if n in names]
    typed += [bindparam(n, expanding=True) for n in lists if n in names]
    if typed:
        clause = clause.bindparams(*typed)
    return clause.columns(**columns) if columns else clause


def sql_of(statement: Compiled | Driven | str) -> str:
    """A statement's text, as the database receives it (expanding lists aside)."""
    if isinstance(statement, str):
        return statement
    if isinstance(statement, Driven):
        return statement.sql
    clause = statement.element if isinstance(statement, TextualSelect) else statement
    assert isinstance(clause, TextClause)
    return clause.text


@dataclass(frozen=True, slots=True)
class Query:
    """Where one statement comes from: the block of its dialect's .sql files, its result
    columns' types (None: untyped), literal SQL its placeholders take beside the store's
    configuration (queries.py), and which of its binds expand as lists (None: the dialect's)."""

    block: str
    columns: Mapping[str, TypeEngine[Any]] | None = None
    fill: Mapping[str, str] = field(default_factory=dict)
    lists: Collection[str] | None = None


@dataclass(frozen=True, slots=True)
class Statements:
    """The statements every dialect has: SqlStore runs them as they are, and so do counting.py,
    retention.py and admin.py. The same names, binds and result columns in every dialect; what
    takes several statements on some database is a Dialect method, its statements a subclass's
    fields."""

    has_ready: Annotated[Compiled, Query("has_ready")]  # (only, now) -> one boolean
    release: Annotated[Compiled, Query("release")]  # (token, seqs, delay_seconds, error, now)
    extend_leases: Annotated[Compiled, Query("extend_leases")]  # (tokens, lease_seconds, now)
    unpark_sweep: Annotated[Compiled, Query("unpark_sweep")]  # rowcount
    # The resource and relay rows' statements bind no list, and one name means a number there:
    # a bucket's `:tokens` (update_resource), not extend_leases' list of lease tokens.
    resources: Annotated[Compiled, Query("list_resources", RESOURCE_COLUMNS, lists=())]
    ensure_resource: Annotated[Compiled, Query("ensure_resource")]  # (resource)
    # (resource, now) -> LOCKED_RESOURCE_COLUMNS, under a lock
    lock_resource: Annotated[Compiled, Query("lock_resource", LOCKED_RESOURCE_COLUMNS)]
    update_resource: Annotated[Compiled, Query("update_resource", lists=())]
    heartbeat: Annotated[Compiled, Query("heartbeat")]  # (relay_id, now)
    beat: Annotated[Compiled, Query("beat", lists=())]  # (relay_id, started_at, now); rowcount
    # (relay_id, now) -> started_at, where the database returns it (Dialect.register_relay)
    register_relay: Annotated[Compiled, Query("register_relay", {"started_at": TIME}, lists=())]
    forget_relay: Annotated[Compiled, Query("forget_relay", lists=())]  # (relay_id)
    relays: Annotated[Compiled, Query("relays", RELAY_COLUMNS)]  # (within, now)
    # (now) -> (ready, delayed, oldest ready age in seconds)
    pending_summary: Annotated[Compiled, Query("pending_summary")]
    count_open: Annotated[Compiled, Query("count_open")]  # -> (state, count)
    count_settled: Annotated[Compiled, Query("count_settled")]  # -> (state, count)
    exchange_open: Annotated[Compiled, Query("exchange_open", EXCHANGE_COLUMNS)]  # (now)
    exchange_settled: Annotated[Compiled, Query("exchange_settled")]  # -> (exchange, state, n)
    # (states, cutoff, cutoff_id, after_id) -> count
    count_eligible: Annotated[Compiled, Query("count_eligible")]
    published_per_minute: Annotated[Compiled, Query("published_per_minute")]  # (since, id_floor)
    failed_per_minute: Annotated[Compiled, Query("failed_per_minute")]  # (since)
    ping: Annotated[Compiled, Query("ping", lists=())]
    # Taking leases back (relay/store/rescuer.py), in one transaction: the time, read once; the
    # stuck rows, locked; the dead relays, locked (then forget_relay for each); the decisions and
    # their attempt records, each one statement for every row (relay/store/transitions.py).
    read_now: Annotated[Compiled, Query("read_now", {"now": TIME})]  # (now) -> now
    stuck_expired: Annotated[Compiled, Query("stuck_expired", STUCK_COLUMNS)]  # (now)
    stuck_abandoned: Annotated[Compiled, Query("stuck_abandoned", STUCK_COLUMNS)]  # (token)
    stuck_owned: Annotated[Compiled, Query("stuck_owned", STUCK_COLUMNS, lists=())]  # (owner)
    dead_relays: Annotated[Compiled, Query("dead_relays", lists=())]  # (seen_before, relay_id)
    transition_rows: Annotated[Compiled, Query("update_rows")]  # (rows, now); rowcount
    record_attempts: Annotated[Compiled, Query("record_attempts")]  # (records, relay_id, now)

    def items(self) -> Iterator[tuple[str, Compiled | Driven | str]]:
        """Every statement, by name, in the order its class declares them."""
        for f in fields(self):
            yield f.name, getattr(self, f.name)


S = TypeVar("S")


def queries_of(cls: type[Any]) -> dict[str, tuple[Query, type]]:
    """Each field's Query (a dataclass's fields annotated `Annotated[Compiled, Query(...)]`), and
    what the field holds: a statement (Compiled), its text (`str`) or a Driven one."""
    hints = typing.get_type_hints(cls, include_extras=True)
    found: dict[str, tuple[Query, type]] = {}
    for f in fields(cls):
        hint = hints[f.name]
        query = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Query)), None)
        if query is None:
            raise QueryError(f"{cls.__name__}.{f.name} names no Query")
        origin = hint.__origin__
        found[f.name] = (query, origin if origin in (str, Driven) else TextClause)
    return found


def build(
    cls: type[S], queries: Queries, config: Mapping[str, str], lists: Collection[str] = ()
) -> S:
    """Every statement of `cls` (Statements, or another dataclass of such fields) built from
    `queries` with this configuration, and compiled."""
    built: dict[str, Compiled | Driven | str] = {}
    configured: set[str] = set()
    for name, (query, kind) in queries_of(cls).items():
        sql, taken = queries.expand(query.block, query.fill, config)
        configured |= taken
        wanted = lists if query.lists is None else query.lists
        if kind is str:
            built[name] = sql
        elif kind is Driven:
            built[name] = Driven.of(sql)
        else:
            built[name] = compile_sql(sql, query.columns, lists=wanted)
    unused = sorted(set(config) - configured)
    if unused:
        raise QueryError(f"no statement takes the configuration's {unused}")
    return cls(**built)
