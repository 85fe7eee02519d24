"""What the relay loop relies on from a Store (relay/ports.py), checked the same way on the
in-memory FakeStore the unit tests drive the loop with (tests/unit/fakes.py) and on the real
SqlStore on SQLite, PostgreSQL and MariaDB: the unit tests prove the loop against the fake only
as far as the fake behaves as the stores do.

Time is frozen: the real stores read it from a clock bound into every statement, the fake from its
`now`; each row's due time is set outright, so the order of due times does not depend on when the
rows were written.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest
from sqlalchemy import Engine, select, update

import outbox
from outbox.schema import message
from relay.core.bucket import Bucket
from relay.core.circuit import Circuit, CircuitState
from relay.core.failures import Classified, FailureClass
from relay.core.policy import Dead, Retry
from relay.ports import Claimed, ResourceRow, Store
from relay.store.sql_store import open_store
from tests.support.db import DB_FIXTURES, make_app_engine
from tests.support.templates import Templates
from tests.unit.fakes import FakeStore, make_claimed

pytestmark = pytest.mark.timeout(60)

# Later than any real enqueue time, and whole seconds: SQLite's clock has milliseconds only.
FROZEN = dt.datetime(2031, 5, 17, 9, 30, tzinfo=dt.UTC)
LEASE = 30.0
FAILURE = Classified(FailureClass.NEVER_SENT, "no channel")


def at(seconds: float) -> dt.datetime:
    return FROZEN + dt.timedelta(seconds=seconds)


class Subject(Protocol):
    """A store under test, with what a test needs around it: rows put in, states read out, the
    clock moved."""

    store: Store

    def add(
        self, *, due: float = 0.0, key: str | None = None, priority: int = 0, exchange: str = "ex"
    ) -> int:
        """A pending message due at at(due); its seq."""

    def state(self, seq: int) -> str: ...

    def set_time(self, seconds: float) -> None:
        """The store's clock reads at(seconds) from now on."""


class Fake:
    def __init__(self) -> None:
        self.fake = FakeStore(now=FROZEN)
        self.store: Store = self.fake
        self._seqs = itertools.count(1)

    def add(
        self, *, due: float = 0.0, key: str | None = None, priority: int = 0, exchange: str = "ex"
    ) -> int:
        seq = next(self._seqs)
        self.fake.add(
            make_claimed(seq, key=key, priority=priority, exchange=exchange, available_at=at(due))
        )
        return seq

    def state(self, seq: int) -> str:
        return self.fake.rows[seq].state

    def set_time(self, seconds: float) -> None:
        self.fake.now = at(seconds)


class Real:
    def __init__(self, db_url: str, engine: Engine) -> None:
        self.now = FROZEN
        self.store: Store = open_store(db_url, clock=lambda: self.now)
        self._engine = engine
        # PostgreSQL's column has a zone; MariaDB's and SQLite's hold UTC without one.
        self._aware = engine.dialect.name == "postgresql"

    def add(
        self, *, due: float = 0.0, key: str | None = None, priority: int = 0, exchange: str = "ex"
    ) -> int:
        when = at(due) if self._aware else at(due).replace(tzinfo=None)
        with self._engine.begin() as conn:
            message_id = outbox.enqueue(
                conn, exchange=exchange, routing_key="rk", payload={}, key=key, priority=priority
            )
            conn.execute(
                update(message).where(message.c.id == message_id).values(available_at=when)
            )
            return int(
                conn.execute(select(message.c.seq).where(message.c.id == message_id)).one()[0]
            )

    def state(self, seq: int) -> str:
        with self._engine.connect() as conn:
            return str(conn.execute(select(message.c.state).where(message.c.seq == seq)).one()[0])

    def set_time(self, seconds: float) -> None:
        self.now = at(seconds)


@pytest.fixture(
    params=[
        "fake",
        *(pytest.param(name, marks=pytest.mark.integration) for name in DB_FIXTURES),
    ]
)
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    if request.param == "fake":
        yield Fake()
        return
    db_url = str(request.getfixturevalue(DB_FIXTURES[request.param]))
    engine = make_app_engine(db_url)
    templates: Templates = request.getfixturevalue("templates")
    templates.migrate(engine)
    real = Real(db_url, engine)
    try:
        yield real
    finally:
        real.store.close()
        engine.dispose()


def claim(subject: Subject, token: uuid.UUID | None = None, **kwargs: Any) -> list[Claimed]:
    options: dict[str, Any] = {"limit": 10, "lease_seconds": LEASE, **kwargs}
    return subject.store.claim(owner="relay-a", token=token or uuid.uuid4(), **options)


def seqs(claimed: list[Claimed]) -> list[int]:
    return [c.seq for c in claimed]


# --------------------------------------------------------------------------- claiming


def test_claim_takes_the_highest_priority_then_the_longest_due_then_enqueue_order(
    subject: Subject,
) -> None:
    a = subject.add(due=-10)
    b = subject.add(due=-1, priority=5)
    c = subject.add(due=-10)
    d = subject.add(due=-20)
    assert seqs(claim(subject)) == [b, d, a, c]


def test_claim_takes_at_most_its_limit_and_leaves_the_rest_for_the_next(
    subject: Subject,
) -> None:
    rows = [subject.add() for _ in range(5)]
    assert seqs(claim(subject, limit=2)) == rows[:2]
    assert seqs(claim(subject, limit=2)) == rows[2:4]
    assert seqs(claim(subject, limit=2)) == rows[4:]
    assert claim(subject) == []


def test_a_row_is_claimed_only_once_due(subject: Subject) -> None:
    later = subject.add(due=30)
    assert claim(subject) == []
    assert not subject.store.has_ready("ex")
    subject.set_time(30)
    assert subject.store.has_ready("ex")
    assert seqs(claim(subject)) == [later]
    assert not subject.store.has_ready("ex")


def test_a_claim_leases_its_rows_and_counts_the_attempt(subject: Subject) -> None:
    row = subject.add()
    (claimed,) = claim(subject)
    assert (claimed.seq, claimed.attempts, claimed.suspect) == (row, 1, False)
    assert (claimed.exchange, claimed.routing_key, claimed.key) == ("ex", "rk", None)
    assert subject.state(row) == "in_flight"


def test_excluded_resources_are_passed_by_and_only_picks_one(subject: Subject) -> None:
    a = subject.add(exchange="a")
    b = subject.add(exchange="b")
    c = subject.add(exchange="c")
    assert seqs(claim(subject, exclude=["a", "c"])) == [b]
    assert seqs(claim(subject, only="c")) == [c]
    assert seqs(claim(subject)) == [a]


def test_a_key_gives_one_head_at_a_time_in_enqueue_order(subject: Subject) -> None:
    k1 = [subject.add(key="k1") for _ in range(3)]
    k2 = [subject.add(key="k2") for _ in range(2)]
    free = subject.add()
    token = uuid.uuid4()
    assert seqs(claim(subject, token)) == [k1[0], k2[0], free]
    assert claim(subject) == []  # each key waits for its head
    assert subject.store.mark_published(token, [k1[0]]) == 1
    assert seqs(claim(subject)) == [k1[1]]
    assert claim(subject) == []


def test_a_head_that_is_not_due_holds_its_key(subject: Subject) -> None:
    head = subject.add(key="k", due=30)
    subject.add(key="k")
    assert claim(subject) == []
    subject.set_time(30)
    assert seqs(claim(subject)) == [head]


def test_a_dead_head_holds_its_key(subject: Subject) -> None:
    head = subject.add(key="k")
    subject.add(key="k")
    token = uuid.uuid4()
    claim(subject, token)
    dead = Dead(head, FAILURE, "poison")
    assert subject.store.settle_failures(token, [dead], relay_id="relay-a") == 1
    assert subject.state(head) == "dead"
    assert claim(subject) == []


def test_a_run_follows_its_head_and_the_next_run_follows_the_chain(subject: Subject) -> None:
    line = [subject.add(key="k") for _ in range(5)]
    other = subject.add()
    token = uuid.uuid4()
    assert seqs(claim(subject, token, run=2)) == [*line[:3], other]
    more = subject.store.claim_run(
        owner="relay-a", token=token, after=line[2], limit=5, lease_seconds=LEASE
    )
    assert seqs(more) == line[3:]
    # Another token's chain cannot be extended.
    assert (
        subject.store.claim_run(
            owner="relay-b", token=uuid.uuid4(), after=line[4], limit=5, lease_seconds=LEASE
        )
        == []
    )


# --------------------------------------------------------------------------- settling


def test_mark_published_only_under_the_lease(subject: Subject) -> None:
    row = subject.add()
    token = uuid.uuid4()
    claim(subject, token)
    assert subject.store.mark_published(uuid.uuid4(), [row]) == 0  # a stale token
    assert subject.state(row) == "in_flight"
    assert subject.store.mark_published(token, [row]) == 1
    assert subject.state(row) == "published"
    assert subject.store.mark_published(token, [row]) == 0  # once only
    assert claim(subject) == []


def test_release_gives_a_row_back_without_charging_the_attempt(subject: Subject) -> None:
    row = subject.add()
    token = uuid.uuid4()
    claim(subject, token)
    stale = uuid.uuid4()
    assert subject.store.release(stale, [row], delay_seconds=0, error="stopping") == 0
    assert subject.state(row) == "in_flight"
    assert subject.store.release(token, [row], delay_seconds=0, error="stopping") == 1
    assert subject.state(row) == "pending"
    (again,) = claim(subject)
    assert (again.seq, again.attempts) == (row, 1)


def test_a_row_released_with_a_delay_comes_back_after_it(subject: Subject) -> None:
    row = subject.add()
    token = uuid.uuid4()
    claim(subject, token)
    assert subject.store.release(token, [row], delay_seconds=60, error="stopping") == 1
    subject.set_time(59)
    assert claim(subject) == []
    subject.set_time(60)
    assert seqs(claim(subject)) == [row]


def test_settle_failures_retries_or_kills_only_under_the_lease(subject: Subject) -> None:
    retried, killed, deferred = subject.add(), subject.add(), subject.add()
    token = uuid.uuid4()
    claim(subject, token)
    decisions: list[Retry | Dead] = [
        Retry(retried, at(90), burn=True, failure=FAILURE),
        Dead(killed, FAILURE, "unroutable"),
        Retry(deferred, at(30), burn=False, failure=FAILURE),
    ]
    assert subject.store.settle_failures(uuid.uuid4(), decisions, relay_id="relay-a") == 0
    assert {subject.state(s) for s in (retried, killed, deferred)} == {"in_flight"}
    assert subject.store.settle_failures(token, decisions, relay_id="relay-a") == 3
    assert [subject.state(s) for s in (retried, killed, deferred)] == [
        "pending",
        "dead",
        "pending",
    ]
    assert subject.store.settle_failures(token, decisions, relay_id="relay-a") == 0
    assert claim(subject) == []  # neither is due yet
    subject.set_time(30)
    (again,) = claim(subject)
    assert (again.seq, again.attempts) == (deferred, 1)  # a failure that does not count
    subject.set_time(90)
    (again,) = claim(subject)
    assert (again.seq, again.attempts) == (retried, 2)  # one that does


# --------------------------------------------------------------------------- leases


def test_extended_leases_run_out_later_and_only_the_holders(subject: Subject) -> None:
    row, other = subject.add(), subject.add()
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    claim(subject, mine, limit=1)
    claim(subject, theirs, limit=1)
    subject.set_time(20)
    assert subject.store.extend_leases([mine], LEASE) == 1
    assert subject.store.extend_leases([uuid.uuid4()], LEASE) == 0
    subject.set_time(31)
    assert subject.store.reclaim_expired(relay_id="relay-b") == 1  # theirs ran out at 30
    assert (subject.state(row), subject.state(other)) == ("in_flight", "pending")
    subject.set_time(51)
    assert subject.store.reclaim_expired(relay_id="relay-b") == 1  # mine, at 50
    assert subject.state(row) == "pending"
    assert subject.store.mark_published(mine, [row]) == 0  # the lease is gone


def test_a_reclaimed_row_comes_back_as_a_suspect_claimed_apart(subject: Subject) -> None:
    lost = subject.add()
    claim(subject)
    assert subject.store.reclaim_expired(relay_id="relay-b") == 0  # not expired yet
    subject.set_time(LEASE + 1)
    assert subject.store.reclaim_expired(relay_id="relay-b") == 1
    beside = subject.add(due=LEASE)
    (again,) = claim(subject)  # not with `beside`: a suspect goes with suspects only
    assert (again.seq, again.suspect, again.attempts) == (lost, True, 1)
    assert seqs(claim(subject)) == [beside]


# --------------------------------------------------------------------------- resources


def test_resources_are_created_closed_and_changed_under_the_store_time(subject: Subject) -> None:
    assert subject.store.resources() == []
    seen: list[tuple[ResourceRow, dt.datetime]] = []

    def open_it(row: ResourceRow, now: dt.datetime) -> tuple[ResourceRow, str]:
        seen.append((row, now))
        circuit = Circuit(row.circuit.resource, CircuitState.OPEN, failures=3, changed_at=now)
        return ResourceRow(circuit, row.bucket), "opened"

    assert subject.store.change_resource("ex", open_it) == "opened"
    ((first, now),) = seen
    assert first.circuit == Circuit("ex")
    assert first.bucket == Bucket()
    assert now == FROZEN
    (row,) = subject.store.resources()
    assert (row.circuit.resource, row.circuit.state, row.circuit.failures) == (
        "ex",
        CircuitState.OPEN,
        3,
    )
    assert row.circuit.changed_at == FROZEN

    keep: Callable[[ResourceRow, dt.datetime], tuple[ResourceRow, None]]
    keep = lambda row, _now: (row, None)  # noqa: E731
    subject.store.change_resource("another", keep)
    assert [r.circuit.resource for r in subject.store.resources()] == ["another", "ex"]
