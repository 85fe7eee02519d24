"""What `outbox-relay capture setup|drop|status` do: the replication slot and the publication the
relay's stream reads through, what the server lacks for them, and how far behind the slot is.

The slot keeps every WAL segment from its confirmed position on, so a slot no relay reads fills
the disk: `status` shows how much it holds (`lag_bytes`, `safe_wal_size`), and `drop` removes it.
The publication has no tables: the stream wants only the logical decoding messages applications
emit, and pgoutput sends those whatever a publication holds.

Every statement runs in a transaction of its own: PostgreSQL refuses to create a logical slot in
a transaction that has written anything.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from outbox import logged
from outbox.dberrors import sqlstate_of
from relay.capture.stream import CaptureError, SlotInUse, checked_name

DEFAULT_SLOT = "outbox_relay"
DEFAULT_PUBLICATION = "outbox_relay"

_DUPLICATE_OBJECT = "42710"  # a concurrent setup created it first
_OBJECT_IN_USE = "55006"  # a walsender streams from the slot
_NOT_IN_PREREQUISITE_STATE = "55000"  # the slot was invalidated
_CONFIGURATION_LIMIT = "53400"  # every replication slot is taken: no room for the copy
_UNCOUNTABLE = frozenset({_OBJECT_IN_USE, _NOT_IN_PREREQUISITE_STATE, _CONFIGURATION_LIMIT})

# -- settings: what logical capture needs of the server and of the role. Free slots only matter
# while the relay's slot does not exist yet.
_SETTINGS = text(
    "SELECT current_setting('wal_level'), current_user,"
    " (SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user),"
    " current_setting('max_replication_slots')::int,"
    " (SELECT count(*) FROM pg_replication_slots),"
    " current_setting('max_wal_senders')::int,"
    " EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = :slot)"
)
# -- publication: whether it exists, and whether it also publishes tables (whose changes the
# stream then receives only to skip them).
_PUBLICATION = text(
    "SELECT p.puballtables OR EXISTS (SELECT FROM pg_publication_rel r WHERE r.prpubid = p.oid)"
    " FROM pg_publication p WHERE p.pubname = :publication"
)
_PUBLICATION_EXISTS = text("SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = :p)")
# -- slot: a slot is the server's, not a database's: one of the same name may belong to another
# database, where this one's stream cannot use it.
_SLOT = text(
    "SELECT database, plugin, active_pid, wal_status, confirmed_flush_lsn::text,"
    " current_database()"
    " FROM pg_replication_slots WHERE slot_name = :slot"
)
_CREATE_SLOT = text("SELECT lsn::text FROM pg_create_logical_replication_slot(:slot, 'pgoutput')")
_DROP_SLOT = text("SELECT pg_drop_replication_slot(:slot)")
# -- state: cheap, for a gauge read every few seconds. The lag is the WAL written since the
# confirmed position: what the server must keep for the slot.
_STATE = text(
    "SELECT s.active, s.active_pid, s.confirmed_flush_lsn::text,"
    " pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint,"
    " s.wal_status, s.safe_wal_size,"
    " EXISTS (SELECT FROM pg_publication WHERE pubname = :publication)"
    " FROM (SELECT) AS one LEFT JOIN pg_replication_slots AS s ON s.slot_name = :slot"
)
# -- pending: the relay's messages waiting in the slot, decoded without consuming them, from a
# temporary copy of the slot at its confirmed position (a slot a relay streams from cannot be
# peeked at; its copy can, and goes with the session). A pgoutput message record is 'M' (77), its
# flags (1: transactional), an Int64 position, the NUL-terminated prefix from byte 11 on, an Int32
# length, then the message: its version, then its flags, whose ROW bit marks one that has a row
# in the table (counted there already).
_COPY = text("SELECT pg_copy_logical_replication_slot(:slot, :copy, true)")
_DROP_COPY = text("SELECT pg_drop_replication_slot(:copy)")
_PENDING = text(
    "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(:copy, NULL, NULL,"
    " 'proto_version', '1', 'publication_names', :publication, 'messages', 'true') AS c"
    " WHERE get_byte(c.data, 0) = 77 AND get_byte(c.data, 1) = 1"
    " AND substring(c.data FROM 11 FOR :prefix_length) = :prefix"
    " AND get_byte(c.data, 15 + :prefix_length) & 1 = 0"
)


class CaptureSetupError(CaptureError):
    """The server or the role lacks what logical capture needs (`problems` says what)."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        lines = "\n".join(f"- {p.detail}" for p in problems)
        super().__init__(f"logical capture cannot be set up on this server:\n{lines}")


@dataclass(frozen=True)
class Problem:
    """Something logical capture needs and the server or role lacks, in one line each."""

    setting: str
    detail: str


@dataclass(frozen=True)
class SlotStatus:
    """The slot as the server sees it (all None but `slot`, `exists` False: no such slot)."""

    slot: str
    exists: bool
    active: bool
    active_pid: int | None
    confirmed_lsn: str | None
    lag_bytes: int | None  # WAL the server keeps for the slot
    wal_status: str | None  # reserved, extended, unreserved or lost
    safe_wal_size: int | None  # bytes that can still be written before the slot is lost
    pending: int | None  # the relay's messages waiting in it (None: not counted)
    publication_exists: bool


@contextmanager
def _autocommit(engine: Engine) -> Iterator[Connection]:
    if engine.dialect.name != "postgresql":
        raise CaptureError(f"logical capture needs PostgreSQL, not {engine.dialect.name}")
    with engine.connect() as conn:
        yield conn.execution_options(isolation_level="AUTOCOMMIT")


def problems(engine: Engine, *, slot: str = DEFAULT_SLOT) -> list[Problem]:
    """What logical capture lacks on this server and for this role (nothing: it can run)."""
    with _autocommit(engine) as conn:
        row = conn.execute(_SETTINGS, {"slot": checked_name("slot", slot)}).one()
    wal_level, role, may_replicate, max_slots, used_slots, max_senders, slot_exists = row
    found = []
    if wal_level != "logical":
        found.append(
            Problem(
                "wal_level",
                f"wal_level is {wal_level}; logical capture needs wal_level = logical "
                "(ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL)",
            )
        )
    if not may_replicate:
        found.append(
            Problem(
                "replication",
                f'role "{role}" has neither REPLICATION nor superuser; logical capture needs '
                f'one (ALTER ROLE "{role}" REPLICATION)',
            )
        )
    if not slot_exists and used_slots >= max_slots:
        found.append(
            Problem(
                "max_replication_slots",
                f"max_replication_slots is {max_slots} and all are taken; logical capture needs "
                f"one more (ALTER SYSTEM SET max_replication_slots = {used_slots + 1}; then "
                "restart PostgreSQL)",
            )
        )
    if max_senders == 0:
        found.append(
            Problem(
                "max_wal_senders",
                "max_wal_senders is 0; logical capture needs at least 1 "
                "(ALTER SYSTEM SET max_wal_senders = 10; then restart PostgreSQL)",
            )
        )
    return found


def setup(
    engine: Engine, *, slot: str = DEFAULT_SLOT, publication: str = DEFAULT_PUBLICATION
) -> list[str]:
    """Create the publication and the slot unless they exist; what was created or found, a line
    each. CaptureSetupError when the server lacks something (`problems`); CaptureError when a
    slot of that name exists but this database cannot use it."""
    checked_name("slot", slot)
    checked_name("publication", publication)
    lacking = problems(engine, slot=slot)
    if lacking:
        raise CaptureSetupError(lacking)
    with _autocommit(engine) as conn:
        return [_setup_publication(conn, publication), _setup_slot(conn, slot)]


def _setup_publication(conn: Connection, publication: str) -> str:
    tables = conn.execute(_PUBLICATION, {"publication": publication}).scalar_one_or_none()
    if tables is None:
        try:
            conn.exec_driver_sql(f'CREATE PUBLICATION "{publication}"')
        except DBAPIError as exc:
            if sqlstate_of(exc.orig) != _DUPLICATE_OBJECT:
                raise
            return f"found publication {publication}"
        return f"created publication {publication} (no tables: it carries only messages)"
    if tables:
        return (
            f"found publication {publication} (it publishes tables too: the relay receives "
            "their changes only to skip them)"
        )
    return f"found publication {publication}"


def _setup_slot(conn: Connection, slot: str) -> str:
    found = conn.execute(_SLOT, {"slot": slot}).one_or_none()
    if found is None:
        try:
            lsn = conn.execute(_CREATE_SLOT, {"slot": slot}).scalar_one()
        except DBAPIError as exc:
            if sqlstate_of(exc.orig) != _DUPLICATE_OBJECT:
                raise
            found = conn.execute(_SLOT, {"slot": slot}).one()
        else:
            return (
                f"created replication slot {slot} at {lsn}: the server keeps the messages "
                "emitted from now on until a relay reads them"
            )
    database, plugin, _, wal_status, confirmed, current = found
    if database != current:
        raise CaptureError(
            f'replication slot "{slot}" belongs to database "{database}": choose another name '
            "for this database's slot"
        )
    if plugin != "pgoutput":
        raise CaptureError(
            f'replication slot "{slot}" exists but does not decode with pgoutput (plugin '
            f"{plugin}): drop it or choose another name"
        )
    if wal_status == "lost":
        raise CaptureError(
            f'replication slot "{slot}" exists but was invalidated (its WAL was removed): drop '
            "it (outbox-relay capture drop) and set it up again"
        )
    return f"found replication slot {slot} (confirmed up to {confirmed})"


def drop(
    engine: Engine, *, slot: str = DEFAULT_SLOT, publication: str = DEFAULT_PUBLICATION
) -> list[str]:
    """Drop the slot (and the messages it still holds) and the publication, those present; a
    line each. SlotInUse while a stream reads the slot; CaptureError for another database's."""
    checked_name("slot", slot)
    checked_name("publication", publication)
    said = []
    with _autocommit(engine) as conn:
        found = conn.execute(_SLOT, {"slot": slot}).one_or_none()
        if found is None:
            said.append(f"replication slot {slot} does not exist")
        else:
            database, _, pid, _, _, current = found
            if database != current:
                raise CaptureError(
                    f'replication slot "{slot}" belongs to database "{database}": drop it '
                    "from there"
                )
            if pid is not None:
                raise _in_use(slot, pid)
            try:
                conn.execute(_DROP_SLOT, {"slot": slot})
            except DBAPIError as exc:
                if sqlstate_of(exc.orig) != _OBJECT_IN_USE:
                    raise
                raise _in_use(slot, _active_pid(conn, slot)) from None
            said.append(f"dropped replication slot {slot}")
        if conn.execute(_PUBLICATION_EXISTS, {"p": publication}).scalar_one():
            conn.exec_driver_sql(f'DROP PUBLICATION IF EXISTS "{publication}"')
            said.append(f"dropped publication {publication}")
        else:
            said.append(f"publication {publication} does not exist")
    return said


def _in_use(slot: str, pid: int | None) -> SlotInUse:
    who = "a relay" if pid is None else f"a relay (pid {pid})"
    return SlotInUse(f'replication slot "{slot}" is being read by {who}: stop it first')


def _active_pid(conn: Connection, slot: str) -> int | None:
    found = conn.execute(_SLOT, {"slot": slot}).one_or_none()
    return None if found is None else found[2]


def status(
    engine: Engine,
    *,
    slot: str = DEFAULT_SLOT,
    publication: str = DEFAULT_PUBLICATION,
    count: bool = True,
) -> SlotStatus:
    """The slot's state; with `count`, also the relay's messages waiting in it, decoded from
    the WAL it holds (this reads all of it: use `slot_state` for something cheap)."""
    state = slot_state(engine, slot, publication=publication)
    if not count or not state.exists or state.wal_status == "lost":
        return state
    if not state.publication_exists:  # pgoutput fails on the first table change it sees
        return state
    prefix = logged.PREFIX.encode() + b"\0"
    copy = f"{slot[:40]}_count_{secrets.token_hex(4)}"
    params = {
        "slot": slot,
        "copy": copy,
        "publication": publication,
        "prefix": prefix,
        "prefix_length": len(prefix),
    }
    with _autocommit(engine) as conn:
        try:
            conn.execute(_COPY, params)
            try:
                pending = conn.execute(_PENDING, params).scalar_one()
            finally:
                conn.execute(_DROP_COPY, params)
        except DBAPIError as exc:
            # No free slot for the copy, or the server invalidated the slot: not countable.
            if sqlstate_of(exc.orig) not in _UNCOUNTABLE:
                raise
            return slot_state(engine, slot, publication=publication)
    return dataclasses.replace(state, pending=int(pending))


def slot_state(engine: Engine, slot: str, *, publication: str = DEFAULT_PUBLICATION) -> SlotStatus:
    """The slot's state without counting what it holds: one cheap query."""
    checked_name("slot", slot)
    checked_name("publication", publication)
    with _autocommit(engine) as conn:
        row = conn.execute(_STATE, {"slot": slot, "publication": publication}).one()
    active, pid, confirmed, lag, wal_status, safe, publication_exists = row
    return SlotStatus(
        slot=slot,
        exists=active is not None,
        active=bool(active),
        active_pid=pid,
        confirmed_lsn=confirmed,
        lag_bytes=None if lag is None else int(lag),
        wal_status=wal_status,
        safe_wal_size=None if safe is None else int(safe),
        pending=None,
        publication_exists=bool(publication_exists),
    )
