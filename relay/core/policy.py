"""The retry policy and the decision it makes for each settled message.

A failed attempt's decision is a value (`Retry` or `Dead`) that the store applies in one batched
UPDATE guarded by the lease token; confirmed messages need no decision (relay/core/settlement.py).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from relay.core import backoff
from relay.core.failures import Classified, FailureClass

# A missing exchange is not here: it is how a deleted-then-recreated destination looks, and the
# circuit breaker (relay/core/circuit.py) stops it burning attempts while it lasts.
DEFAULT_PERMANENT = frozenset({FailureClass.UNROUTABLE, FailureClass.MALFORMED})
# Failures that are not the message's fault and say nothing about whether it can ever succeed.
_FREE = frozenset({FailureClass.NEVER_SENT, FailureClass.BACKPRESSURE})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base: float = 1.0  # first backoff window, seconds
    cap: float = 3600.0  # longest backoff window
    floor: float = 0.5  # shortest backoff
    max_attempts: int = 10  # default when the message sets none
    max_attempts_by_exchange: Mapping[str, int] = field(default_factory=dict)
    max_age: float | None = 7 * 86400.0  # give up on a message this old at its next failure
    permanent: frozenset[FailureClass] = DEFAULT_PERMANENT
    backpressure_delay: float = 5.0  # wait this long (jittered) while the broker pushes back
    requeue_delay: float = 0.5  # at most this long for messages the broker never saw
    # An unroutable message (a permanent class by default) is deferred, no attempt charged, while
    # its exchange and routing key have been unroutable for less than this: queues declared by
    # consumers that start after the relay catch their messages. 0: dead at once.
    unroutable_grace: float = 300.0

    def attempts_allowed(self, exchange: str, message_max: int | None) -> int:
        if message_max is not None:
            return message_max
        return self.max_attempts_by_exchange.get(exchange, self.max_attempts)


@dataclass(frozen=True, slots=True)
class Retry:
    seq: int
    at: dt.datetime
    burn: bool  # does this failure count against max_attempts?
    failure: Classified

    @property
    def kind(self) -> str:
        """How the attempt ended, as metrics, spans and the attempt log name it."""
        return "retry" if self.burn else "deferred"


@dataclass(frozen=True, slots=True)
class Dead:
    seq: int
    failure: Classified
    reason: str

    @property
    def kind(self) -> str:
        return "dead"


Decision = Retry | Dead


@dataclass(frozen=True, slots=True)
class Attempted:
    """What the decision needs to know about the message."""

    seq: int
    exchange: str
    attempts: int  # including the attempt that just ended
    max_attempts: int | None
    created_at: dt.datetime


def decide(
    msg: Attempted,
    failure: Classified,
    *,
    policy: RetryPolicy,
    now: dt.datetime,
    rng: random.Random,
    blameless: bool = False,
    unroutable_since: dt.datetime | None = None,
) -> Decision:
    """What to do with a message after a failed attempt.

    `blameless`: the failure is not the message's (its resource's circuit was open or probing,
    or the whole connection was lost): no attempt is burned and it is retried within
    `requeue_delay` (max age still applies).

    `unroutable_since`: when this relay first saw the message's exchange and routing key
    unroutable (None: now); a permanent unroutable failure waits out `policy.unroutable_grace`
    from then (see `grace_wait`).
    """
    cls = failure.cls
    if cls is FailureClass.UNROUTABLE and cls in policy.permanent and policy.unroutable_grace > 0:
        waited = max(0.0, (now - (unroutable_since or now)).total_seconds())
        age = (now - msg.created_at).total_seconds()
        if policy.max_age is not None and age >= policy.max_age:
            reason = f"older than max age ({policy.max_age:.0f} s): {failure.detail}"
            return Dead(msg.seq, failure, reason)
        if waited < policy.unroutable_grace:
            wait = grace_wait(policy, waited, rng)
            return Retry(msg.seq, now + dt.timedelta(seconds=wait), False, failure)
        reason = (
            f"unroutable (permanent): {failure.detail} (unroutable for {waited:.0f} s, "
            f"past the {policy.unroutable_grace:g} s grace)"
        )
        return Dead(msg.seq, failure, reason)
    if cls is FailureClass.MALFORMED or cls in policy.permanent:
        return Dead(msg.seq, failure, f"{cls.value} (permanent): {failure.detail}")
    if cls in _FREE:
        wait = (
            policy.backpressure_delay if cls is FailureClass.BACKPRESSURE else policy.requeue_delay
        )
        return Retry(msg.seq, now + dt.timedelta(seconds=rng.uniform(0, wait)), False, failure)
    age = (now - msg.created_at).total_seconds()
    too_old = policy.max_age is not None and age >= policy.max_age
    if blameless and not too_old:
        at = now + dt.timedelta(seconds=rng.uniform(0, policy.requeue_delay))
        return Retry(msg.seq, at, False, failure)
    allowed = policy.attempts_allowed(msg.exchange, msg.max_attempts)
    if msg.attempts >= allowed and not blameless:
        return Dead(msg.seq, failure, f"gave up after {msg.attempts} attempts: {failure.detail}")
    if too_old:
        return Dead(
            msg.seq, failure, f"older than max age ({policy.max_age:.0f} s): {failure.detail}"
        )
    wait = backoff.delay(msg.attempts, rng, base=policy.base, cap=policy.cap, floor=policy.floor)
    return Retry(msg.seq, now + dt.timedelta(seconds=wait), True, failure)


def grace_wait(policy: RetryPolicy, waited: float, rng: random.Random) -> float:
    """How long an unroutable message waits before it is tried again, `waited` seconds into the
    grace: a jittered window growing with the wait (half of it), at most a tenth of the grace
    (30 s for the default 5 minutes), so a queue declared late is found soon after it appears
    and a relay with many such messages does not try them all every half second."""
    top = max(policy.floor, policy.unroutable_grace / 10)
    window = min(top, max(policy.floor, waited / 2))
    return rng.uniform(min(policy.floor, window), window)
