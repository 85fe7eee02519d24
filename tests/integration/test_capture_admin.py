"""`outbox-relay capture setup|drop|status` against the real PostgreSQL: setup is idempotent,
status counts what waits in the slot, drop refuses while a relay reads it. Each test has a
database of its own (tests/integration/test_capture_stream.py's `capture_database`)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text

from outbox import logged
from relay.capture import admin
from relay.capture.stream import CaptureError, SlotInUse
from tests.integration.test_capture_stream import CaptureDb, capture_database
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def db(pg_admin: Engine) -> Iterator[CaptureDb]:
    with capture_database(pg_admin) as made:
        yield made


def test_this_server_lacks_nothing(db: CaptureDb) -> None:
    assert admin.problems(db.engine) == []
    assert admin.problems(db.engine, slot=db.name) == []


def test_setup_is_idempotent_and_says_what_it_did(db: CaptureDb) -> None:
    slot = f"s_{uuid.uuid4().hex[:12]}"
    publication = f"p_{uuid.uuid4().hex[:12]}"
    first = admin.setup(db.engine, slot=slot, publication=publication)
    assert first[0].startswith(f"created publication {publication}")
    assert first[1].startswith(f"created replication slot {slot} at ")
    again = admin.setup(db.engine, slot=slot, publication=publication)
    assert again == [f"found publication {publication}", again[1]]
    assert again[1].startswith(f"found replication slot {slot} (confirmed up to ")
    with db.engine.connect() as conn:
        plugin, database = conn.execute(
            text("SELECT plugin, database FROM pg_replication_slots WHERE slot_name = :s"),
            {"s": slot},
        ).one()
        tables = conn.execute(
            text("SELECT count(*) FROM pg_publication_tables WHERE pubname = :p"),
            {"p": publication},
        ).scalar_one()
    assert (plugin, database, tables) == ("pgoutput", db.name, 0)
    assert admin.drop(db.engine, slot=slot, publication=publication) == [
        f"dropped replication slot {slot}",
        f"dropped publication {publication}",
    ]


def _message(n: int, *, has_row: bool = False) -> bytes:
    """An outbox message as enqueue emits it (the database appends the time)."""
    params = {
        "id": f"00000000-0000-7000-8000-{n:012d}",
        "exchange": "x",
        "routing_key": "rk",
        "payload": b"p",
        "content_type": "text/plain",
        "headers": None,
        "key": None,
        "priority": 0,
        "max_attempts": None,
        "traceparent": None,
        "tracestate": None,
    }
    return logged.stamped(logged.pack(params, delay=None, has_row=has_row), EPOCH)


EPOCH = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def test_status_counts_the_messages_waiting_in_the_slot(db: CaptureDb) -> None:
    db.emit(_message(1), _message(2))
    db.emit(_message(3))
    db.emit(_message(4, has_row=True))  # counted with the table's pending rows instead
    db.emit(_message(5), commit=False)
    db.emit(_message(6), prefix="audit")
    db.emit(_message(7), prefix="outbox2")
    with db.engine.connect() as conn:
        conn.execute(
            text("SELECT pg_logical_emit_message(false, 'outbox', :m)"), {"m": _message(8)}
        )
        conn.commit()
    state = admin.status(db.engine, slot=db.name, publication=db.name)
    assert state.pending == 3
    assert (state.slot, state.exists, state.active, state.active_pid) == (
        db.name,
        True,
        False,
        None,
    )
    assert state.confirmed_lsn is not None
    assert "/" in state.confirmed_lsn
    assert state.lag_bytes is not None
    assert state.lag_bytes > 0
    assert state.wal_status == "reserved"
    assert state.publication_exists
    cheap = admin.slot_state(db.engine, db.name, publication=db.name)
    assert cheap.pending is None
    assert admin.status(db.engine, slot=db.name, publication=db.name, count=False).pending is None
    # Peeking consumed nothing, and left no slot behind.
    assert admin.status(db.engine, slot=db.name, publication=db.name).pending == 3
    with db.engine.connect() as conn:
        slots = conn.execute(
            text("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()")
        ).scalar_one()
    assert slots == 1


def test_status_counts_a_slot_a_relay_streams_from_too(db: CaptureDb) -> None:
    db.emit(_message(1), _message(2))
    stream = db.stream()
    stream.open()
    try:
        state = admin.status(db.engine, slot=db.name, publication=db.name)
        assert state.active
        assert state.active_pid is not None
        assert state.pending == 2  # not confirmed yet: still pending
    finally:
        stream.close()
    missing = admin.status(db.engine, slot="no_such_slot", publication="no_such_pub")
    assert missing == admin.SlotStatus(
        "no_such_slot", False, False, None, None, None, None, None, None, False
    )


def test_drop_refuses_while_a_relay_reads_the_slot_and_works_after(db: CaptureDb) -> None:
    stream = db.stream()
    stream.open()
    try:
        pid = wait_until(lambda: db.slot().active_pid, what="the slot taken")
        with pytest.raises(SlotInUse, match=f"pid {pid}"):
            admin.drop(db.engine, slot=db.name, publication=db.name)
        assert db.slot().exists
    finally:
        stream.close()
    assert admin.drop(db.engine, slot=db.name, publication=db.name) == [
        f"dropped replication slot {db.name}",
        f"dropped publication {db.name}",
    ]
    assert admin.drop(db.engine, slot=db.name, publication=db.name) == [
        f"replication slot {db.name} does not exist",
        f"publication {db.name} does not exist",
    ]
    assert not db.slot().exists


def test_a_slot_of_another_database_is_left_alone(db: CaptureDb, pg_admin: Engine) -> None:
    # `db.name`'s slot belongs to db's database; pg_admin is on another one.
    with pytest.raises(CaptureError, match="belongs to database"):
        admin.setup(pg_admin, slot=db.name, publication=f"p_{uuid.uuid4().hex[:12]}")
    with pytest.raises(CaptureError, match="belongs to database"):
        admin.drop(pg_admin, slot=db.name, publication=f"p_{uuid.uuid4().hex[:12]}")
    assert db.slot().exists


@pytest.mark.parametrize("name", ["", "Upper", "has-dash", "9lives", "x" * 64, 'a"; DROP'])
def test_names_that_would_need_quoting_are_refused(db: CaptureDb, name: str) -> None:
    with pytest.raises(ValueError, match="lower-case letters"):
        admin.setup(db.engine, slot=name)
    with pytest.raises(ValueError, match="lower-case letters"):
        admin.drop(db.engine, publication=name)
    with pytest.raises(ValueError, match="lower-case letters"):
        admin.status(db.engine, slot=name)


def test_only_postgresql_can_capture() -> None:
    engine = create_engine("sqlite://")
    try:
        with pytest.raises(CaptureError, match="needs PostgreSQL"):
            admin.problems(engine)
    finally:
        engine.dispose()
