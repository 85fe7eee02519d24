"""What becomes of a delivery whose handler failed: pure decisions, no broker, no clock.

A handler's exception is one of three things: the database was unavailable (not the message's
fault: put it back unchanged), a reason to try again later (through a retry queue, after a delay
rounded to a tier), or a reason to give up (dead-letter it, at once for `Reject` or a configured
permanent exception, after `max_attempts` otherwise). `decide` says which; `Processor` carries it
out on the broker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, OperationalError

from outbox.dberrors import DbFailure, classify_db_error


class Retry(Exception):
    """Raise from a handler to try the message again later (after `delay` seconds if given)."""

    def __init__(self, reason: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Reject(Exception):
    """Raise from a handler to dead-letter the message now: retrying cannot help."""


@dataclass(frozen=True, slots=True)
class ConsumerPolicy:
    max_attempts: int = 5  # handler runs before a failing message is dead-lettered
    backoff_base: float = 1.0  # first retry delay, seconds; doubles per attempt
    backoff_cap: float = 300.0  # longest retry delay
    permanent: tuple[type[BaseException], ...] = ()  # exception types dead-lettered at once
    db_unavailable_delay: float = 1.0  # pause before requeueing when the database is down

    def delay(self, attempt: int) -> int:
        """Seconds before retry number `attempt` (see `delay_tier`)."""
        return delay_tier(min(self.backoff_cap, self.backoff_base * 2 ** max(0, attempt - 1)))


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


Decision = Requeue | RetryLater | DeadLetter


def decide(exc: Exception, attempt: int, policy: ConsumerPolicy) -> Decision:
    """What to do with a delivery whose `attempt`-th handler run raised `exc`."""
    why = f"{type(exc).__name__}: {exc}"
    if database_unavailable(exc):
        return Requeue(why)
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
    which carries no SQLSTATE, counts too."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate is None:
        return isinstance(exc, OperationalError)
    return classify_db_error(sqlstate) is DbFailure.TRANSIENT
