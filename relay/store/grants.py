"""Least privilege on PostgreSQL: what each role needs of the outbox tables, as GRANT statements,
and which of those a role lacks. The one source of truth for `outbox-relay grants`, the grants
shown in docs/guides/roles.md and the CLI's "permission denied" messages. SQLite has no roles:
none of this applies.

Each *capability* lists the privileges its statements need (read from the statements themselves:
outbox/enqueue.py, outbox/consumer/inbox.py, postgres.py, common.py, admin.py, retention.py); a
role gets the union of its capabilities. Privileges are table-wide, so the columns a later
migration adds are covered, except where a column list is the point: the application may read
only `id` and `idempotency_key` of the outbox, never another producer's payloads.

The tables belong to the role that ran `outbox-relay migrate`; only that owner (or a superuser)
can grant on them, and it needs nothing listed here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Table, text
from sqlalchemy.dialects.postgresql.base import RESERVED_WORDS

from outbox import schema

MESSAGE = schema.message.name
ATTEMPT = schema.attempt.name
RESOURCE = schema.resource.name
RELAY = schema.relay_instance.name
INBOX = schema.inbox.name
VERSION = schema.schema_version.name


def _serial(table: Table) -> str:
    """The sequence behind a table's bigserial key (PostgreSQL names it table_column_seq)."""
    (column,) = table.primary_key.columns
    return f"{table.name}_{column.name}_seq"


MESSAGE_SEQ = _serial(schema.message)
ATTEMPT_SEQ = _serial(schema.attempt)


@dataclass(frozen=True, slots=True)
class Privilege:
    """One privilege on one table (all of its columns, or `columns`) or sequence."""

    privilege: str  # SELECT, INSERT, UPDATE, DELETE; USAGE for a sequence
    on: str  # the table's or sequence's name, unqualified
    columns: tuple[str, ...] = ()  # column-level when given
    sequence: bool = False

    def describe(self) -> str:
        cols = f" ({', '.join(self.columns)})" if self.columns else ""
        return f"{self.privilege}{cols} on {'sequence' if self.sequence else 'table'} {self.on}"


def _table(on: str, *privileges: str) -> tuple[Privilege, ...]:
    return tuple(Privilege(p, on) for p in privileges)


def _usage(sequence: str) -> Privilege:
    return Privilege("USAGE", sequence, sequence=True)


@dataclass(frozen=True, slots=True)
class Capability:
    name: str
    what: str  # for the comments of the printed grants
    privileges: tuple[Privilege, ...]


# outbox.enqueue: one INSERT (the key from the bigserial's sequence). With an idempotency key,
# INSERT ... ON CONFLICT (idempotency_key) DO NOTHING RETURNING id, then, when the key was taken,
# SELECT id WHERE idempotency_key = ...: both read those two columns and no other. pg_notify
# needs nothing. No UPDATE, no DELETE: an application cannot change or remove a message.
ENQUEUE = Capability(
    "enqueue",
    "outbox.enqueue inserts messages; reads only id and idempotency_key",
    (
        Privilege("INSERT", MESSAGE),
        Privilege("SELECT", MESSAGE, ("id", "idempotency_key")),
        _usage(MESSAGE_SEQ),
    ),
)

# outbox.Consumer / process_once: INSERT ... ON CONFLICT DO NOTHING RETURNING consumer; purging
# its expired rows is a DELETE whose victims are chosen FOR UPDATE SKIP LOCKED, and PostgreSQL
# lets only a role with UPDATE lock rows (nothing here ever updates an inbox row).
INBOX_USE = Capability(
    "inbox",
    "outbox.Consumer, process_once and purge_inbox use the inbox",
    _table(INBOX, "SELECT", "INSERT", "UPDATE", "DELETE"),
)

# outbox-relay run: claims (UPDATE ... FROM a SELECT FOR UPDATE SKIP LOCKED), settlements and
# lease upkeep (UPDATE), attempt records (INSERT), retention (DELETE of messages and their
# attempts: off with --retain-published forever --retain-failed forever, and then DELETE is not
# used), circuits and rate buckets (INSERT, SELECT FOR UPDATE, UPDATE), heartbeats (INSERT ...
# ON CONFLICT DO UPDATE, DELETE on a clean stop), the schema version check (SELECT), gauges
# (SELECT). LISTEN needs no privilege; the relay runs no DDL.
RELAY_RUN = Capability(
    "relay",
    "outbox-relay run: claims, settles, retention, circuits, rate limits, heartbeats",
    (
        *_table(MESSAGE, "SELECT", "UPDATE", "DELETE"),
        *_table(ATTEMPT, "SELECT", "INSERT", "DELETE"),
        _usage(ATTEMPT_SEQ),
        *_table(RESOURCE, "SELECT", "INSERT", "UPDATE"),
        *_table(RELAY, "SELECT", "INSERT", "UPDATE", "DELETE"),
        *_table(VERSION, "SELECT"),
    ),
)

# status, messages, show, circuits and the console's pages: reads only. The console also shows
# the relays alive (their heartbeats) and checks the schema version.
VIEW = Capability(
    "view",
    "status, messages, show, circuits, console pages (reads only)",
    (
        *_table(MESSAGE, "SELECT"),
        *_table(ATTEMPT, "SELECT"),
        *_table(RESOURCE, "SELECT"),
        *_table(RELAY, "SELECT"),
        *_table(VERSION, "SELECT"),
    ),
)

# replay, discard, cancel, reschedule, prioritize (and the console's same actions): one guarded
# UPDATE (and the unpark sweep, an UPDATE) plus one attempt record per changed message.
CHANGE = Capability(
    "change",
    "replay, discard, cancel, reschedule, prioritize",
    (*_table(MESSAGE, "SELECT", "UPDATE"), *_table(ATTEMPT, "INSERT"), _usage(ATTEMPT_SEQ)),
)

# purge: retention's batches, DELETE of rows locked FOR UPDATE SKIP LOCKED (hence UPDATE).
PURGE = Capability(
    "purge",
    "purge",
    (*_table(MESSAGE, "SELECT", "UPDATE", "DELETE"), *_table(ATTEMPT, "SELECT", "DELETE")),
)

# circuits reset: the same short transaction a relay runs on a resource row.
RESET = Capability(
    "reset",
    "circuits reset",
    _table(RESOURCE, "SELECT", "INSERT", "UPDATE"),
)


@dataclass(frozen=True, slots=True)
class RoleKind:
    """A kind of role `outbox-relay grants` has an option for."""

    option: str  # the command's flag
    title: str
    capabilities: tuple[Capability, ...]


ROLE_KINDS: tuple[RoleKind, ...] = (
    RoleKind("--app", "application", (ENQUEUE,)),
    RoleKind("--consumer", "consumer", (INBOX_USE,)),
    RoleKind("--relay", "relay", (RELAY_RUN,)),
    RoleKind("--viewer", "viewer", (VIEW,)),
    RoleKind("--operator", "operator", (VIEW, CHANGE, PURGE, RESET)),
)


def _merged(capabilities: Iterable[Capability]) -> list[Privilege]:
    """Every privilege once, in first-mentioned order; a table-wide one absorbs the column-level
    one of the same privilege and table, and column lists of the same privilege merge."""
    found: dict[tuple[str, str], Privilege] = {}
    for capability in capabilities:
        for p in capability.privileges:
            key = (p.on, p.privilege)
            before = found.get(key)
            if before is None:
                found[key] = p
            elif before.columns and p.columns:
                columns = before.columns + tuple(c for c in p.columns if c not in before.columns)
                found[key] = Privilege(p.privilege, p.on, columns, p.sequence)
            elif before.columns:
                found[key] = p
    return list(found.values())


_BARE = re.compile(r"[a-z_][a-z0-9_$]*")


def quote(name: str) -> str:
    """An identifier as SQL writes it: bare when it can be, else double-quoted (case kept)."""
    if _BARE.fullmatch(name) and name not in RESERVED_WORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: longer names are silently truncated


def check_identifier(name: str) -> str:
    """`name` if PostgreSQL can take it as a role or schema name; ValueError saying why not
    (without the name: a mistyped argument may be a password)."""
    if not name.strip():
        raise ValueError("a name is needed")
    if not name.isprintable():
        # A newline would end the comment the name is printed in, and run what follows.
        raise ValueError("contains a control character")
    if len(name.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
        raise ValueError(f"longer than {MAX_IDENTIFIER_BYTES} bytes, PostgreSQL's limit")
    if name.lower().startswith("pg_"):
        raise ValueError("names starting with pg_ are PostgreSQL's own")
    return name


def check_role(name: str) -> str:
    check_identifier(name)
    if name.lower() == "public":
        # GRANT ... TO public would give every role of the cluster these privileges.
        raise ValueError("'public' is every role, not one role")
    return name


def grant_statements(schema_name: str, roles: Sequence[tuple[RoleKind, str]]) -> list[str]:
    """The GRANT statements (and a comment before each role's) for `roles` on the outbox tables
    in `schema_name`: to be run by the tables' owner, again after each `outbox-relay migrate`.

    A role named more than once (say --app and --consumer) gets one block with everything."""
    check_identifier(schema_name)
    by_role: dict[str, list[RoleKind]] = {}
    for kind, role in roles:
        by_role.setdefault(check_role(role), []).append(kind)
    schema_sql = quote(schema_name)
    lines: list[str] = []
    for role, kinds in by_role.items():
        capabilities = [c for k in kinds for c in k.capabilities]
        titles = " and ".join(k.title for k in kinds)
        whats = "; ".join(dict.fromkeys(c.what for c in capabilities))
        role_sql = quote(role)
        lines.append(f"-- {role_sql} ({titles}): {whats}")
        lines.append(f"GRANT USAGE ON SCHEMA {schema_sql} TO {role_sql};")
        lines += _grants(schema_sql, role_sql, _merged(capabilities))
    return lines


# The order GRANTs are printed in: each table, then its sequence.
_ORDER = (MESSAGE, MESSAGE_SEQ, ATTEMPT, ATTEMPT_SEQ, RESOURCE, RELAY, INBOX, VERSION)


def _grants(schema_sql: str, role_sql: str, privileges: list[Privilege]) -> list[str]:
    """One GRANT per object and column list: GRANT SELECT, UPDATE ON TABLE s.t TO r."""
    grouped: dict[tuple[bool, str, tuple[str, ...]], list[str]] = {}
    for p in sorted(privileges, key=lambda p: _ORDER.index(p.on)):
        grouped.setdefault((p.sequence, p.on, p.columns), []).append(p.privilege)
    out = []
    for (sequence, on, columns), names in grouped.items():
        cols = f" ({', '.join(quote(c) for c in columns)})" if columns else ""
        kind = "SEQUENCE" if sequence else "TABLE"
        what = ", ".join(f"{n}{cols}" for n in names)
        out.append(f"GRANT {what} ON {kind} {schema_sql}.{quote(on)} TO {role_sql};")
    return out


# ------------------------------------------------------------------------ what a role lacks

# Each check resolves the name as the role's own statements do (its search_path); NULL when the
# object cannot be found (then the check says nothing).
_HAS_TABLE = "SELECT has_table_privilege(to_regclass(:on), :privilege)"
_HAS_COLUMN = "SELECT has_column_privilege(to_regclass(:on), :column, :privilege)"
_HAS_SEQUENCE = "SELECT has_sequence_privilege(to_regclass(:on), :privilege)"
CURRENT_ROLE = "SELECT current_user"


def missing(conn: Connection, capabilities: Iterable[Capability]) -> list[Privilege]:
    """The privileges of `capabilities` that this connection's role does not have."""
    lacking = []
    for p in _merged(capabilities):
        if p.sequence:
            checks = [conn.execute(text(_HAS_SEQUENCE), {"on": p.on, "privilege": p.privilege})]
        elif p.columns:
            checks = [
                conn.execute(text(_HAS_COLUMN), {"on": p.on, "column": c, "privilege": p.privilege})
                for c in p.columns
            ]
        else:
            checks = [conn.execute(text(_HAS_TABLE), {"on": p.on, "privilege": p.privilege})]
        if any(found.scalar() is False for found in checks):
            lacking.append(p)
    return lacking


def describe(privileges: Iterable[Privilege]) -> str:
    """Privileges as a sentence names them: "UPDATE, DELETE on table t; USAGE on sequence s"."""
    grouped: dict[tuple[bool, str, tuple[str, ...]], list[str]] = {}
    for p in privileges:
        grouped.setdefault((p.sequence, p.on, p.columns), []).append(p.privilege)
    return "; ".join(
        Privilege(", ".join(names), on, columns, sequence).describe()
        for (sequence, on, columns), names in grouped.items()
    )


def current_role(conn: Connection) -> str:
    return str(conn.execute(text(CURRENT_ROLE)).scalar_one())
