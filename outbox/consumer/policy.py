"""What becomes of a delivery whose handler failed: pure decisions, no broker, no clock.

A handler's exception is one of four things: the database was unavailable (not the message's
fault: put it back unchanged, without using an attempt), the transaction lost a race with another
one (a serialization failure or deadlock: run it again here, after a short jittered pause, a few
times; if it keeps losing, it counts as a failed attempt like any other), a reason to try again
later (through a retry queue, after a delay rounded to a tier), or a reason to give up
(dead-letter it, at once for `Reject` or a configured permanent exception, after `max_attempts`
otherwise). `decide` says which; `Processor` carries it out on the broker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, OperationalError

from outbox.dberrors import DbFailure, classify_db_error, is_conflict, sqlstate_of


class Retry(Exception):
    """Raise from a handler to try the message again later (after `delay` seconds if given).

    The attempt counts against `ConsumerPolicy.max_attempts`; past it, the message is
    dead-lettered. The delay is rounded up to a power of two seconds (each is a retry queue of
    its own); without one, the policy's backoff for this attempt is used.

    Args:
        reason: Why, recorded in the copy's `x-outbox-consumer-error` header.
        delay: Seconds to wait before the next attempt.
    """

    def __init__(self, reason: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Reject(Exception):
    """Raise from a handler to dead-letter the message now: retrying cannot help.

    The message goes to `<queue>.dead` with the exception's text in its
    `x-outbox-consumer-error` header, whatever attempts it has left.
    """


@dataclass(frozen=True, slots=True)
class ConsumerPolicy:
    """What a consumer does when a handler fails.

    Attributes:
        max_attempts: Handler runs before a failing message is dead-lettered.
        backoff_base: The first retry's delay in seconds; it doubles with each attempt.
        backoff_cap: The longest retry delay, in seconds.
        permanent: Exception types that dead-letter the message at once, as `Reject` does.
        db_unavailable_delay: Seconds before a delivery is put back while the database is
            unavailable; such a failure uses no attempt.
        conflict_retries: How many times a handler whose transaction lost a race (a
            serialization failure or a deadlock) is run again in this process before the
            failure counts as an attempt.
        conflict_backoff: The first rerun's pause in seconds; it doubles with each rerun,
            jittered.
    """

    max_attempts: int = 5  # handler runs before a failing message is dead-lettered
    backoff_base: float = 1.0  # first retry delay, seconds; doubles per attempt
    backoff_cap: float = 300.0  # longest retry delay
    permanent: tuple[type[BaseException], ...] = ()  # exception types dead-lettered at once
    db_unavailable_delay: float = 1.0  # pause before requeueing when the database is down
    conflict_retries: int = 3  # in-process reruns after a serialization failure or deadlock
    conflict_backoff: float = 0.05  # first rerun's pause, seconds; doubles per rerun, jittered

    def delay(self, attempt: int) -> int:
        """Seconds before retry number `attempt` (see `delay_tier`)."""
        return delay_tier(min(self.backoff_cap, self.backoff_base * 2 ** max(0, attempt - 1)))

    def conflict_delay(self, rerun: int, jitter: float) -> float:
        """Seconds before in-process rerun number `rerun`, `jitter` in [0, 1): between half and
        all of the doubled backoff, so two transactions that deadlocked do not meet again."""
        full = self.conflict_backoff * 2.0 ** max(0, rerun - 1)
        return full * (0.5 + 0.5 * min(max(jitter, 0.0), 1.0))


def delay_tier(seconds: float) -> int:
    """A delay rounded up to a power of two seconds: each is a retry queue of its own, because
    RabbitMQ expires per-message TTLs only at the head of a queue (a long delay would hold up a
    short one behind it), while a queue-wide TTL expires every message on time."""
    return int(2 ** math.ceil(math.log2(max(1.0, seconds))))


def retry_queue(queue: str, delay: int) -> str:
    return f"{queue}.retry.{delay}s"


def dead_queue(queue: str) -> str:
    return f"{queue}.dead"


@dataclass(frozen=True, slots=True)
class Requeue:
    """Put the delivery back unchanged, after a pause: the database failed, not the message."""

    why: str


@dataclass(frozen=True, slots=True)
class RetryLater:
    """Send a copy through the `delay`-second retry queue; it comes back as the next attempt."""

    delay: int
    why: str


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Send a copy to the dead-letter queue, with `why` in its headers."""

    why: str


@dataclass(frozen=True, slots=True)
class RunAgain:
    """Run the handler again in this process after `delay` seconds, keeping the delivery: its
    transaction lost a race (serialization failure, deadlock), which a rerun usually wins."""

    delay: float
    why: str


Decision = Requeue | RunAgain | RetryLater | DeadLetter


def decide(
    exc: Exception,
    attempt: int,
    policy: ConsumerPolicy,
    *,
    conflicts: int = 0,
    jitter: float = 0.5,
) -> Decision:
    """What to do with a delivery whose `attempt`-th handler run raised `exc`.

    `conflicts`: how many runs of this attempt already lost a race (and were run again);
    `jitter`: a random number in [0, 1) that spreads the reruns' pauses.
    """
    why = f"{type(exc).__name__}: {exc}"
    if database_unavailable(exc):
        return Requeue(why)
    if transaction_conflict(exc):
        if conflicts < policy.conflict_retries:
            return RunAgain(policy.conflict_delay(conflicts + 1, jitter), why)
        # It keeps losing the same race: a failure of this attempt, so it cannot loop forever.
        why = f"conflicted {conflicts + 1} times in a row: {why}"
    if isinstance(exc, (Reject, *policy.permanent)):
        return DeadLetter(why)
    if attempt >= policy.max_attempts:
        return DeadLetter(f"gave up after {attempt} attempts: {why}")
    if isinstance(exc, Retry) and exc.delay is not None:
        return RetryLater(delay_tier(exc.delay), why)
    return RetryLater(policy.delay(attempt), why)


def database_unavailable(exc: BaseException) -> bool:
    """The database failed (connection lost, shutting down), not the handler: told apart by
    SQLSTATE with the relay's rule (outbox.dberrors); SQLite's OperationalError (locked, I/O),
    which carries no SQLSTATE, counts too. A conflict (`transaction_conflict`) does not: the
    database is up, and requeueing it unchanged could repeat it forever."""
    failure = database_failure(exc)
    if failure is None:
        return False
    if failure.connection_lost:
        return True
    if failure.sqlstate is None:
        return failure.operational
    if is_conflict(failure.sqlstate):
        return False
    return classify_db_error(failure.sqlstate) is DbFailure.TRANSIENT


def transaction_conflict(exc: BaseException) -> bool:
    """The transaction lost a race with another one (SQLSTATE 40001 or 40P01) on a connection
    that is still good: running it again is likely to succeed."""
    failure = database_failure(exc)
    if failure is None or failure.connection_lost:
        return False
    return is_conflict(failure.sqlstate)


@dataclass(frozen=True, slots=True)
class DatabaseFailure:
    """What the policy reads of a database error.

    Attributes:
        sqlstate: The SQLSTATE, in PostgreSQL's codes (`outbox.dberrors.sqlstate_of`), or None.
        connection_lost: SQLAlchemy invalidated the connection.
        operational: An OperationalError or InterfaceError, which without a SQLSTATE means
            the connection or the database file failed, not the statement.
    """

    sqlstate: str | None
    connection_lost: bool
    operational: bool


_PEP_249 = frozenset({"DatabaseError", "InterfaceError"})  # the roots of every DB-API error
_CONNECTION_ERRORS = frozenset({"OperationalError", "InterfaceError"})


def database_failure(exc: BaseException) -> DatabaseFailure | None:
    """`exc` as a database failure, or None when it is not one: SQLAlchemy's DBAPIError (the
    driver's error its `orig`), or a DB-API error SQLAlchemy did not wrap: a driver's own, or
    Django's (`django.db.utils`: PEP 249's names, the driver's error its `__cause__`), as a
    handler writing through Django's ORM raises. Those are known by PEP 249's class names, so
    that this module imports neither Django nor any driver."""
    if isinstance(exc, DBAPIError):
        return DatabaseFailure(
            sqlstate_of(exc.orig), exc.connection_invalidated, isinstance(exc, OperationalError)
        )
    names = {cls.__name__ for cls in type(exc).__mro__}
    if not names & _PEP_249:
        return None
    sqlstate = sqlstate_of(exc)
    if sqlstate is None and exc.__cause__ is not None:
        sqlstate = sqlstate_of(exc.__cause__)
    return DatabaseFailure(sqlstate, False, bool(names & _CONNECTION_ERRORS))
