"""What the consumer does with a failed handler run: table tests of the pure decision."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from outbox.consumer.policy import (
    ConsumerPolicy,
    DeadLetter,
    Decision,
    Reject,
    Requeue,
    Retry,
    RetryLater,
    RunAgain,
    database_unavailable,
    decide,
    delay_tier,
    transaction_conflict,
)


class DriverError(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


def db_error(kind: type[DBAPIError], sqlstate: str | None, *, invalidated: bool = False) -> Any:
    return kind("SELECT 1", {}, DriverError(sqlstate), connection_invalidated=invalidated)


class NotFound(Exception):
    pass


POLICY = ConsumerPolicy(max_attempts=3, backoff_base=1.0, backoff_cap=10.0, permanent=(NotFound,))


@pytest.mark.parametrize(
    ("exc", "attempt", "expected"),
    [
        (ValueError("boom"), 1, RetryLater(1, "ValueError: boom")),
        (ValueError("boom"), 2, RetryLater(2, "ValueError: boom")),
        (ValueError("boom"), 3, DeadLetter("gave up after 3 attempts: ValueError: boom")),
        (Reject("no such order"), 1, DeadLetter("Reject: no such order")),
        (NotFound("gone"), 1, DeadLetter("NotFound: gone")),  # a configured permanent type
        (Retry("later", delay=3), 1, RetryLater(4, "Retry: later")),  # its own delay, tiered
        (Retry("later"), 2, RetryLater(2, "Retry: later")),  # no delay: the policy's
        (Retry("later", delay=3), 3, DeadLetter("gave up after 3 attempts: Retry: later")),
    ],
)
def test_decide(exc: Exception, attempt: int, expected: Decision) -> None:
    assert decide(exc, attempt, POLICY) == expected


def test_an_unavailable_database_requeues_whatever_the_attempt() -> None:
    # Not the message's fault: it goes back unchanged, even past max_attempts.
    decision = decide(db_error(OperationalError, "57P01"), 3, POLICY)
    assert isinstance(decision, Requeue)
    assert decision.why.startswith("OperationalError: ")


@pytest.mark.parametrize(
    ("exc", "unavailable"),
    [
        (db_error(OperationalError, "08006"), True),  # connection_failure
        (db_error(OperationalError, "57P01"), True),  # admin_shutdown
        (db_error(DBAPIError, "40P01"), False),  # deadlock_detected: a conflict, the db is up
        (db_error(OperationalError, "40001"), False),  # serialization_failure: likewise
        (db_error(OperationalError, "40001", invalidated=True), True),  # ...on a dead connection
        (db_error(IntegrityError, "23505"), False),  # unique_violation: the handler's doing
        (db_error(DBAPIError, "42P01"), False),  # undefined_table: waiting will not help
        (db_error(OperationalError, None), True),  # SQLite: locked, disk I/O
        (db_error(DBAPIError, None), False),  # no SQLSTATE and not operational
        (db_error(IntegrityError, "23505", invalidated=True), True),  # the connection died
        (ValueError("not a database error"), False),
    ],
)
def test_database_unavailable(exc: BaseException, unavailable: bool) -> None:
    assert database_unavailable(exc) is unavailable


@pytest.mark.parametrize(
    ("seconds", "tier"), [(0, 1), (0.5, 1), (1, 1), (1.5, 2), (3, 4), (4, 4), (300, 512)]
)
def test_delays_round_up_to_a_power_of_two(seconds: float, tier: int) -> None:
    assert delay_tier(seconds) == tier


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [POLICY.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 16, 16]


DEADLOCK = db_error(OperationalError, "40P01")
CONFLICTS = ConsumerPolicy(max_attempts=3, conflict_retries=2, conflict_backoff=0.1)


@pytest.mark.parametrize(
    ("exc", "conflict"),
    [
        (db_error(OperationalError, "40001"), True),
        (db_error(DBAPIError, "40P01"), True),
        (db_error(OperationalError, "40P01", invalidated=True), False),  # connection lost
        (db_error(OperationalError, "57P01"), False),
        (db_error(OperationalError, None), False),
        (ValueError("40001"), False),
    ],
)
def test_transaction_conflict(exc: BaseException, conflict: bool) -> None:
    assert transaction_conflict(exc) is conflict


def rerun_delay(conflicts: int, jitter: float) -> float:
    decision = decide(DEADLOCK, 1, CONFLICTS, conflicts=conflicts, jitter=jitter)
    assert isinstance(decision, RunAgain)
    return decision.delay


def test_a_conflict_runs_again_in_process_with_jittered_doubling_pauses() -> None:
    assert decide(DEADLOCK, 1, CONFLICTS, conflicts=0, jitter=0.0) == RunAgain(
        0.05, f"OperationalError: {DEADLOCK}"
    )
    assert rerun_delay(0, 0.999) == pytest.approx(0.1, abs=1e-3)
    assert rerun_delay(1, 0.0) == pytest.approx(0.1)


def test_a_conflict_that_keeps_repeating_uses_an_attempt_and_ends_dead() -> None:
    # Before: a deadlock counted as "database down", requeued forever without using an attempt.
    retried = decide(DEADLOCK, 1, CONFLICTS, conflicts=2)
    assert isinstance(retried, RetryLater)
    assert retried.delay == CONFLICTS.delay(1)
    assert retried.why.startswith("conflicted 3 times in a row: OperationalError: ")
    dead = decide(DEADLOCK, 3, CONFLICTS, conflicts=2)
    assert isinstance(dead, DeadLetter)
    assert dead.why.startswith("gave up after 3 attempts: conflicted 3 times in a row: ")


def test_no_conflict_reruns_goes_straight_to_the_retry_path() -> None:
    policy = ConsumerPolicy(conflict_retries=0)
    assert isinstance(decide(DEADLOCK, 1, policy), RetryLater)
