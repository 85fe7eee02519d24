"""The replication stream against the real PostgreSQL (wal_level = logical): messages emitted in
transactions come back as whole commits in commit order, positions confirmed survive a reconnect,
and each way the slot can be unusable is its own error.

Every test has a database of its own, with a slot and publication named after it: a slot
decodes the WAL of its database only, so the messages other tests emit never reach it.
"""

from __future__ import annotations

import functools
import select
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url

from relay.capture import admin
from relay.capture.conninfo import conninfo_of
from relay.capture.pgoutput import parse_lsn
from relay.capture.stream import (
    Commit,
    ReplicationStream,
    SlotInUse,
    SlotMissing,
    StreamBroken,
)
from tests.support.db import PG_ADMIN_URL
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

EMIT = text("SELECT pg_logical_emit_message(:transactional, :prefix, :content)::text")
CURRENT_LSN = text("SELECT pg_current_wal_lsn()::text")


@dataclass(frozen=True)
class CaptureDb:
    """A database of the test's own, set up for capture: slot and publication both `name`."""

    name: str
    url: str
    engine: Engine

    def stream(
        self, *, status_interval: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> ReplicationStream:
        return ReplicationStream(
            conninfo_of(self.url, replication=True),
            slot=self.name,
            publication=self.name,
            status_interval=status_interval,
            clock=clock,
        )

    def emit(self, *contents: bytes, prefix: str = "outbox", commit: bool = True) -> int:
        """Emit `contents` in one transaction; the WAL position just before it commits."""
        with self.engine.connect() as conn, conn.begin() as tx:
            for content in contents:
                conn.execute(EMIT, {"transactional": True, "prefix": prefix, "content": content})
            before = parse_lsn(conn.execute(CURRENT_LSN).scalar_one())
            if not commit:
                tx.rollback()
        return before

    def lsn(self) -> int:
        with self.engine.connect() as conn:
            return parse_lsn(conn.execute(CURRENT_LSN).scalar_one())

    def slot(self) -> admin.SlotStatus:
        return admin.slot_state(self.engine, self.name, publication=self.name)


@contextmanager
def capture_database(pg_admin: Engine) -> Iterator[CaptureDb]:
    """A fresh database with a slot and publication named after it; all three dropped after
    (a walsender still reading the slot is ended first)."""
    name = f"cap_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url, pool_size=2, connect_args={"connect_timeout": 5})
    try:
        admin.setup(engine, slot=name, publication=name)
        yield CaptureDb(name, url, engine)
    finally:
        engine.dispose()
        with pg_admin.connect() as conn:
            # Only this database's slots: the one named after it, and any a test made there.
            mine = text(
                "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = :d"
            )
            for slot, pid in conn.execute(mine, {"d": name}).all():
                if pid is not None:
                    conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                wait_until(functools.partial(_released, conn, slot), what=f"{slot} released")
                conn.execute(text("SELECT pg_drop_replication_slot(:s)"), {"s": slot})
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')


def _released(conn: Connection, slot: str) -> bool:
    released = text("SELECT NOT active FROM pg_replication_slots WHERE slot_name = :s")
    return bool(conn.execute(released, {"s": slot}).scalar_one())


@pytest.fixture
def db(pg_admin: Engine) -> Iterator[CaptureDb]:
    with capture_database(pg_admin) as made:
        yield made


@pytest.fixture
def stream(db: CaptureDb) -> Iterator[ReplicationStream]:
    opened = db.stream()
    opened.open()
    yield opened
    opened.close()


def read_commits(stream: ReplicationStream, count: int, *, timeout: float = 10.0) -> list[Commit]:
    """Read until `count` commits have come (fails after `timeout` seconds)."""
    got: list[Commit] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"{len(got)} of {count} commits after {timeout} s: {got}")
        select.select([stream.fileno()], [], [], min(left, 0.2))
        got.extend(stream.read())
    assert len(got) == count, got
    return got


def read_until_past(stream: ReplicationStream, lsn: int, *, timeout: float = 10.0) -> None:
    """Read until the server has told the stream of a position at or past `lsn`."""
    deadline = time.monotonic() + timeout
    while stream.received_lsn < lsn:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"the stream did not reach {lsn:X} in {timeout} s")
        stream.flush_status(reply=True)  # a keepalive says where the server is
        select.select([stream.fileno()], [], [], min(left, 0.2))
        assert stream.read() == []


def test_committed_messages_come_whole_in_commit_order(
    db: CaptureDb, stream: ReplicationStream
) -> None:
    # The first transaction to emit commits last: the order is the commits'.
    with db.engine.connect() as late:
        late.begin()
        late.execute(EMIT, {"transactional": True, "prefix": "outbox", "content": b"late"})
        first = db.emit(b"a", b"b\x00\xff")
        db.emit(b"rolled back", commit=False)
        db.emit(b"not ours", prefix="audit")
        with db.engine.connect() as conn:  # non-transactional: outside any commit, not ours
            conn.execute(EMIT, {"transactional": False, "prefix": "outbox", "content": b"now"})
            conn.commit()
        late_before = parse_lsn(late.execute(CURRENT_LSN).scalar_one())
        late.commit()
    after = db.lsn()
    commits = read_commits(stream, 2)
    assert [c.messages for c in commits] == [[b"a", b"b\x00\xff"], [b"late"]]
    assert first < commits[0].end_lsn <= late_before < commits[1].end_lsn <= after
    assert all(c.commit_time.tzinfo is not None for c in commits)
    sentinel = db.emit(b"sentinel")  # nothing else arrives before it: the rollback gave nothing
    assert [c.messages for c in read_commits(stream, 1)] == [[b"sentinel"]]
    assert stream.received_lsn > sentinel


def test_a_reopened_stream_resumes_after_the_confirmed_commit(db: CaptureDb) -> None:
    for content in (b"1", b"2", b"3"):
        db.emit(content)
    stream = db.stream()
    stream.open()
    try:
        first, _, _ = read_commits(stream, 3)
        stream.confirm(first.end_lsn)
    finally:
        stream.close()
    assert db.slot().confirmed_lsn is not None
    assert parse_lsn(db.slot().confirmed_lsn or "") == first.end_lsn
    stream.open()  # at once: close() let the slot go before it returned
    try:
        again = read_commits(stream, 2)
        assert [c.messages for c in again] == [[b"2"], [b"3"]]  # not confirmed: they come again
        stream.confirm(again[1].end_lsn)
        stream.confirm(first.end_lsn)  # lower: ignored
        assert stream.confirmed_lsn == again[1].end_lsn
    finally:
        stream.close()
        stream.close()  # idempotent
    stream.open()
    try:
        db.emit(b"4")
        assert [c.messages for c in read_commits(stream, 1)] == [[b"4"]]
    finally:
        stream.close()


def test_a_second_reader_of_the_slot_is_refused_naming_the_first(
    db: CaptureDb, stream: ReplicationStream
) -> None:
    pid = wait_until(lambda: db.slot().active_pid, what="the slot taken")
    with pytest.raises(SlotInUse, match=f"pid {pid}"):
        db.stream().open()


def test_a_missing_slot_or_publication_says_to_run_setup(db: CaptureDb) -> None:
    conninfo = conninfo_of(db.url, replication=True)
    no_slot = ReplicationStream(conninfo, slot="no_such_slot", publication=db.name)
    with pytest.raises(SlotMissing, match=r"no_such_slot.*capture setup"):
        no_slot.open()
    no_publication = ReplicationStream(conninfo, slot=db.name, publication="no_such_pub")
    with pytest.raises(SlotMissing, match=r"no_such_pub.*capture setup"):
        no_publication.open()
    assert not db.slot().active


def test_a_terminated_walsender_breaks_the_stream(db: CaptureDb, stream: ReplicationStream) -> None:
    pid = wait_until(lambda: db.slot().active_pid, what="the slot taken")
    with db.engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    with pytest.raises(StreamBroken):
        read_commits(stream, 1)
    with pytest.raises(StreamBroken, match="not open"):
        stream.read()
    stream.close()


def test_idle_lets_the_server_free_what_carried_nothing_for_the_relay(
    db: CaptureDb, stream: ReplicationStream
) -> None:
    start = parse_lsn(db.slot().confirmed_lsn or "")
    db.emit(b"someone else's", prefix="audit")
    target = db.lsn()
    read_until_past(stream, target)
    stream.idle()
    assert stream.confirmed_lsn >= target > start
    stream.flush_status()
    wait_until(
        lambda: parse_lsn(db.slot().confirmed_lsn or "") >= target,
        what="confirmed_flush_lsn past the foreign message",
    )


def test_status_updates_go_out_on_their_own_when_due(db: CaptureDb) -> None:
    now = [0.0]
    stream = db.stream(status_interval=5.0, clock=lambda: now[0])
    stream.open()
    try:
        db.emit(b"x")
        (commit,) = read_commits(stream, 1)
        stream.confirm(commit.end_lsn)
        stream.read()  # not due yet
        assert parse_lsn(db.slot().confirmed_lsn or "") < commit.end_lsn
        now[0] = 5.0
        stream.read()
        wait_until(
            lambda: parse_lsn(db.slot().confirmed_lsn or "") == commit.end_lsn,
            what="the periodic status update",
        )
    finally:
        stream.close()


def test_a_large_transaction_is_read_whole_across_reads(
    db: CaptureDb, stream: ReplicationStream
) -> None:
    contents = [f"m{i}".encode() * 10 for i in range(3000)]
    db.emit(*contents)
    db.emit(b"next")
    got: list[Commit] = []
    deadline = time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < deadline:
        select.select([stream.fileno()], [], [], 0.2)
        got.extend(stream.read(max_commits=1))
    assert [c.messages for c in got] == [contents, [b"next"]]
