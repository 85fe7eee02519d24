"""What every store writes when it takes leases back, gives rows back and claims suspects, row by
row, against relay/core/suspects.py.

Taking a lease back is decided in the core and written back in one batched statement per database
(relay/store/rescuer.py); giving a row back and claiming are statements of their own. Generated
rows (suspect marks, attempts, max_attempts, owners, keys, priorities) are written on a real schema
(PostgreSQL, MariaDB, SQLite), the store's claim, release, reclaim_expired, abandon, reclaim_owner
and reclaim_dead run on them with a frozen clock, and every row, with its attempt record, must be
what the core says, with the marks relays of schema 6 read beside it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, event, insert, select

from outbox.schema import attempt, message, relay_instance
from outbox.states import Suspect
from relay.core import suspects
from relay.core.suspects import ALONE, GROUPED, SOLITARY, Candidate, Leased
from relay.store.sql_store import SqlStore, open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MARKS = [None, Suspect.GROUP.value, Suspect.ALONE.value]
OWNERS = ["r1", "r2"]
TOKENS = {owner: uuid.uuid4() for owner in OWNERS}
ME = "me"


@pytest.fixture
def frozen(app_engine: Engine, db_url: str) -> Iterator[tuple[Engine, SqlStore, list[dt.datetime]]]:
    """The application's engine and a store whose clock reads the last time in the list."""
    times = [dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)]
    store = open_store(db_url, clock=lambda: times[-1])
    yield app_engine, store, times
    store.close()


def utc(value: dt.datetime | None) -> dt.datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=dt.UTC)


def fresh(engine: Engine) -> None:
    with engine.begin() as conn:
        for table in (attempt, message, relay_instance):
            conn.execute(delete(table))


def put(engine: Engine, rows: Sequence[dict[str, Any]], now: dt.datetime) -> list[int]:
    """Write these rows (columns of outbox_message beyond the required ones); their seqs."""
    ids = [uuid.uuid4() for _ in rows]
    values = [
        {
            "id": message_id,
            "exchange": "ex",
            "routing_key": "rk",
            "payload": b"{}",
            "content_type": "application/json",
            "created_at": now - dt.timedelta(hours=1),
            "available_at": now - dt.timedelta(minutes=5),
            **row,
        }
        for message_id, row in zip(ids, rows, strict=True)
    ]
    with engine.begin() as conn:
        for value in values:  # one by one: seqs in this order
            conn.execute(insert(message).values(**value))
        found = {i: seq for i, seq in conn.execute(select(message.c.id, message.c.seq))}
    return [found[i] for i in ids]


def read(engine: Engine) -> dict[int, Any]:
    with engine.connect() as conn:
        return {r.seq: r for r in conn.execute(select(message))}


def records(engine: Engine) -> dict[uuid.UUID, list[Any]]:
    found: dict[uuid.UUID, list[Any]] = {}
    with engine.connect() as conn:
        for r in conn.execute(select(attempt).order_by(attempt.c.id)):
            found.setdefault(r.message_id, []).append(r)
    return found


def stamp_of(mark: str | None) -> str | None:
    """What a relay that claimed a row so wrote in its last_error for relays of schema 6."""
    return {Suspect.GROUP.value: GROUPED, Suspect.ALONE.value: ALONE}.get(mark or "")


# ------------------------------------------------------------------------ taking leases back


@dataclass(frozen=True)
class InFlight:
    owner: str
    mark: str | None  # how it was claimed, if as a suspect
    attempts: int
    max_attempts: int | None
    expired: bool


in_flight = st.builds(
    InFlight,
    owner=st.sampled_from(OWNERS),
    mark=st.sampled_from(MARKS),
    attempts=st.integers(0, 4),
    max_attempts=st.none() | st.integers(1, 4),
    expired=st.booleans(),
)


@EXAMPLES
@given(
    rows=st.lists(in_flight, min_size=1, max_size=8),
    how=st.sampled_from(["expired", "abandon", "owner", "dead"]),
    default=st.integers(1, 4),
    dead_after=st.sampled_from([3.0, 0.5, 2.25, 15]),
)
def test_a_lease_taken_back_is_what_the_core_says(
    frozen: tuple[Engine, SqlStore, list[dt.datetime]],
    rows: list[InFlight],
    how: str,
    default: int,
    dead_after: float,
) -> None:
    engine, store, times = frozen
    fresh(engine)
    now = times[-1]
    lease_ends = {True: now - dt.timedelta(minutes=1), False: now + dt.timedelta(minutes=1)}
    seqs = put(
        engine,
        [
            {
                "state": "in_flight",
                "lease_owner": r.owner,
                "lease_token": TOKENS[r.owner],
                "lease_expires_at": lease_ends[r.expired],
                "suspect": r.mark,
                "last_error": stamp_of(r.mark),
                "attempts": r.attempts,
                "max_attempts": r.max_attempts,
            }
            for r in rows
        ],
        now,
    )
    before = read(engine)
    if how == "expired":
        taken = store.reclaim_expired(relay_id=ME, max_attempts=default)
        picked = [r.expired for r in rows]
    elif how == "abandon":
        taken = store.abandon(TOKENS["r1"], error="crashed", relay_id=ME, max_attempts=default)
        picked = [r.owner == "r1" for r in rows]
    elif how == "owner":
        taken = store.reclaim_owner("r1", max_attempts=default)
        picked = [r.owner == "r1" for r in rows]
    else:
        with engine.begin() as conn:
            long_ago = now - dt.timedelta(seconds=dead_after + 10)
            conn.execute(
                insert(relay_instance),
                [
                    {"relay_id": "r1", "started_at": long_ago, "last_seen": long_ago},
                    {"relay_id": "r2", "started_at": now, "last_seen": now},
                ],
            )
        dead, taken = store.reclaim_dead(relay_id=ME, dead_after=dead_after, max_attempts=default)
        assert dead == ["r1"]
        picked = [r.owner == "r1" for r in rows]

    reasons: dict[str, Callable[[str | None], str]] = {
        "expired": suspects.expired,
        "abandon": lambda _: "crashed",
        "owner": lambda _: suspects.earlier_run("r1"),
        "dead": lambda owner: suspects.dead_relay(owner, dead_after),
    }
    assert taken == sum(picked)
    after = read(engine)
    history = records(engine)
    for seq, r, was_picked in zip(seqs, rows, picked, strict=True):
        old, new = before[seq], after[seq]
        if not was_picked:
            assert tuple(new) == tuple(old)
            assert old.id not in history
            continue
        want = suspects.reclaim(
            Leased(seq, suspects.suspect_of(r.mark), r.attempts, r.max_attempts),
            reason=reasons[how](r.owner),
            max_attempts=default,
            now=now,
        )
        assert (new.state, new.attempts, new.suspect, new.last_error) == (
            want.state,
            want.attempts,
            want.suspect.value,
            want.last_error,
        ), r
        assert (new.lease_owner, new.lease_token) == (None, None)
        # Schema 6's mark of a suspect stays: a relay of that release claims it apart too.
        assert utc(new.lease_expires_at) == utc(old.lease_expires_at)
        assert utc(new.last_failed_at) == now
        assert utc(new.available_at) == utc(old.available_at)
        (record,) = history[old.id]
        recorder = "r1" if how == "owner" else ME  # reclaim_owner: the relay id restarting
        assert (record.failure_class, record.relay_id, utc(record.at)) == (
            "ambiguous",
            recorder,
            now,
        )
        assert (record.attempt, record.outcome, record.error) == (
            want.record.attempt,
            want.record.outcome,
            want.record.error,
        ), r
        assert utc(record.next_attempt_at) == want.record.next_attempt_at


def test_every_lease_taken_back_at_once_is_one_statement_whatever_each_becomes(
    frozen: tuple[Engine, SqlStore, list[dt.datetime]],
) -> None:
    engine, store, times = frozen
    now = times[-1]
    expired = now - dt.timedelta(minutes=1)
    # In a batch, in a group, alone with attempts left, alone and out of them: four decisions.
    marks = [
        (None, 1),
        (Suspect.GROUP.value, 1),
        (Suspect.ALONE.value, 1),
        (Suspect.ALONE.value, 9),
    ]
    put(
        engine,
        [
            {
                "state": "in_flight",
                "lease_owner": "r1",
                "lease_token": TOKENS["r1"],
                "lease_expires_at": expired,
                "suspect": mark,
                "attempts": attempts,
            }
            for mark, attempts in marks
        ],
        now,
    )
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(" ".join(statement.split()))

    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        assert store.reclaim_expired(relay_id=ME, max_attempts=9) == 4
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    assert sum(s.startswith("UPDATE outbox_message") for s in statements) == 1
    assert sum(s.startswith("INSERT INTO outbox_attempt") for s in statements) == 1
    assert {r.state for r in read(engine).values()} == {"pending", "dead"}


# ------------------------------------------------------------------------ giving rows back


def held_by_r1(
    mark: str | None, attempts: int, now: dt.datetime, *, error: str | None = None
) -> dict[str, Any]:
    """A row relay r1 holds, claimed as `mark` says (schema 6's text for it in last_error)."""
    return {
        "state": "in_flight",
        "lease_owner": "r1",
        "lease_token": TOKENS["r1"],
        "lease_expires_at": now + dt.timedelta(minutes=1),
        "suspect": mark,
        "last_error": stamp_of(mark) or error,
        "attempts": attempts,
    }


# (its mark, its attempts) -> (attempts after, last_error after, a suspect still)
RELEASES: list[tuple[str | None, int, tuple[int, str, bool]]] = [
    (None, 1, (0, "stopping", False)),
    (None, 4, (3, "stopping", False)),
    (None, 0, (0, "stopping", False)),
    (Suspect.GROUP.value, 2, (1, "stopping", True)),  # still a suspect, in groups
    (Suspect.ALONE.value, 2, (1, SOLITARY, True)),  # still to be claimed alone
]


@pytest.mark.parametrize(("mark", "attempts", "expected"), RELEASES)
def test_what_giving_a_row_back_unsent_does_to_it(
    frozen: tuple[Engine, SqlStore, list[dt.datetime]],
    mark: str | None,
    attempts: int,
    expected: tuple[int, str, bool],
) -> None:
    engine, store, times = frozen
    now = times[-1]
    token = TOKENS["r1"]
    (seq,) = put(engine, [held_by_r1(mark, attempts, now, error="an old error")], now)
    assert store.release(token, [seq], delay_seconds=0, error="stopping") == 1
    row = read(engine)[seq]
    left, error, suspect = expected
    assert (row.state, row.attempts, row.last_error) == ("pending", left, error)
    assert row.suspect == mark  # claimed as before
    # Schema 6's mark: a suspect's lease_expires_at set.
    assert utc(row.lease_expires_at) == (now if suspect else None)
    assert (row.lease_owner, row.lease_token) == (None, None)
    assert utc(row.available_at) == now


@EXAMPLES
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(MARKS), st.integers(0, 4), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_a_row_given_back_keeps_its_mark_and_its_attempt(
    frozen: tuple[Engine, SqlStore, list[dt.datetime]],
    rows: list[tuple[str | None, int, bool]],
) -> None:
    engine, store, times = frozen
    fresh(engine)
    now = times[-1]
    token = TOKENS["r1"]
    seqs = put(engine, [held_by_r1(mark, attempts, now) for mark, attempts, _ in rows], now)
    given_back = [seq for seq, (_, _, back) in zip(seqs, rows, strict=True) if back]
    before = read(engine)
    assert store.release(token, given_back, delay_seconds=0, error="stopping") == len(given_back)
    after = read(engine)
    for seq, (mark, attempts, back) in zip(seqs, rows, strict=True):
        old, new = before[seq], after[seq]
        if not back:
            assert tuple(new) == tuple(old)
            continue
        assert (new.state, new.attempts, new.suspect) == ("pending", max(attempts - 1, 0), mark)
        assert new.last_error == (SOLITARY if mark == Suspect.ALONE.value else "stopping")
        assert utc(new.lease_expires_at) == (now if mark is not None else None)
        assert (new.lease_owner, new.lease_token) == (None, None)
        assert utc(new.available_at) == now


# ------------------------------------------------------------------------ claiming


@dataclass(frozen=True)
class Ready:
    keyed: bool
    priority: int
    waited: int  # minutes due
    mark: str | None
    last_error: str | None


ready_rows = st.builds(
    Ready,
    keyed=st.booleans(),
    priority=st.integers(0, 2),
    waited=st.integers(1, 3),
    mark=st.sampled_from(MARKS),
    # Nothing in last_error makes a row a suspect, schema 6's texts included.
    last_error=st.sampled_from([None, SOLITARY, GROUPED, "a nack"]),
)


@EXAMPLES
@given(
    rows=st.lists(ready_rows, max_size=10),
    limit=st.integers(1, 6),
    group=st.integers(1, 4),
)
def test_a_claim_takes_what_the_core_chooses(
    frozen: tuple[Engine, SqlStore, list[dt.datetime]],
    rows: list[Ready],
    limit: int,
    group: int,
) -> None:
    engine, store, times = frozen
    fresh(engine)
    now = times[-1]
    # Every key its own, so every keyed row is its key's head: which rows are ready, and in
    # what order, is the claim's own business (tests/integration/test_ordering.py and others).
    seqs = put(
        engine,
        [
            {
                "key": uuid.uuid4().hex if r.keyed else None,
                "priority": r.priority,
                "available_at": now - dt.timedelta(minutes=r.waited),
                "lease_expires_at": now - dt.timedelta(minutes=1) if r.mark else None,
                "suspect": r.mark,
                "last_error": r.last_error,
                "attempts": 1,
            }
            for r in rows
        ],
        now,
    )
    order = sorted(
        zip(seqs, rows, strict=True), key=lambda sr: (-sr[1].priority, -sr[1].waited, sr[0])
    )
    best = [
        Candidate(seq, "k" if r.keyed else None, r.mark is not None, r.mark == Suspect.ALONE.value)
        for seq, r in order[:limit]
    ]
    choice = suspects.choose(best, group=group)
    before = read(engine)

    token = uuid.uuid4()
    claimed = store.claim(
        owner=ME, token=token, limit=limit, lease_seconds=30, suspect_group=group, run=5
    )

    assert sorted(c.seq for c in claimed) == sorted(choice.seqs)
    assert all(c.suspect == choice.suspects for c in claimed)
    after = read(engine)
    for seq in seqs:
        old, new = before[seq], after[seq]
        if seq not in choice.seqs:
            assert tuple(new) == tuple(old)
            continue
        assert (new.state, new.lease_token, new.attempts) == ("in_flight", token, 2)
        assert new.suspect == old.suspect  # a claim leaves the mark as it is
        assert new.last_error == (choice.stamp if choice.suspects else old.last_error)
