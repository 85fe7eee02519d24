"""Classification, backoff and retry decisions: table tests, fixed seed, frozen clock."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tenacity import Retrying, stop_after_attempt
from tenacity.wait import wait_exponential

from relay.core import backoff
from relay.core.failures import (
    Classified,
    DbFailure,
    FailureClass,
    classify,
    classify_db_error,
)
from relay.core.outcome import Fate, Outcome
from relay.core.policy import Attempted, Dead, Retry, RetryPolicy, decide

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
FC = FailureClass


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Outcome(1, Fate.CONFIRMED), None),
        (Outcome(1, Fate.NOT_SENT, "no channel"), FC.NEVER_SENT),
        (Outcome(1, Fate.UNCONFIRMED, "connection lost"), FC.AMBIGUOUS),
        (Outcome(1, Fate.REJECTED, "nack"), FC.REJECTED),
        (Outcome(1, Fate.UNROUTABLE, "312 NO_ROUTE"), FC.UNROUTABLE),
        (Outcome(1, Fate.DESTINATION_MISSING, "404"), FC.DESTINATION_MISSING),
        (Outcome(1, Fate.UNCONFIRMED, "timeout", while_blocked=True), FC.BACKPRESSURE),
        (Outcome(1, Fate.NOT_SENT, "blocked", while_blocked=True), FC.BACKPRESSURE),
        # A nack while blocked is still a nack: the broker answered.
        (Outcome(1, Fate.REJECTED, "nack", while_blocked=True), FC.REJECTED),
        (Outcome(1, Fate.NOT_SENT, "bad headers", malformed=True), FC.MALFORMED),
    ],
)
def test_classification_table(outcome: Outcome, expected: FailureClass | None) -> None:
    found = classify(outcome)
    assert (found.cls if found else None) == expected


@pytest.mark.parametrize(
    ("sqlstate", "expected"),
    [
        (None, DbFailure.TRANSIENT),  # no SQLSTATE: the connection itself failed
        ("08006", DbFailure.TRANSIENT),  # connection_failure
        ("08001", DbFailure.TRANSIENT),  # sqlclient_unable_to_establish_sqlconnection
        ("57P01", DbFailure.TRANSIENT),  # admin_shutdown
        ("57P03", DbFailure.TRANSIENT),  # cannot_connect_now (starting up)
        ("53300", DbFailure.TRANSIENT),  # too_many_connections
        ("40001", DbFailure.TRANSIENT),  # serialization_failure
        ("40P01", DbFailure.TRANSIENT),  # deadlock_detected
        ("25006", DbFailure.TRANSIENT),  # read_only_sql_transaction (failover)
        ("42P01", DbFailure.PERMANENT),  # undefined_table
        ("42501", DbFailure.PERMANENT),  # insufficient_privilege
        ("22P02", DbFailure.PERMANENT),  # invalid_text_representation
        ("23505", DbFailure.PERMANENT),  # unique_violation
    ],
)
def test_database_errors_by_sqlstate(sqlstate: str | None, expected: DbFailure) -> None:
    assert classify_db_error(sqlstate) is expected


def test_backoff_windows_double_up_to_the_cap() -> None:
    windows = [backoff.window(a, base=1, cap=60, floor=0.5) for a in range(1, 10)]
    assert windows == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_backoff_is_reproducible_with_a_seed() -> None:
    first = [backoff.delay(a, random.Random(42), base=1, cap=60, floor=0.5) for a in range(1, 8)]
    again = [backoff.delay(a, random.Random(42), base=1, cap=60, floor=0.5) for a in range(1, 8)]
    assert first == again


def test_backoff_stays_jittered_at_the_cap() -> None:
    rng = random.Random(7)
    delays = {round(backoff.delay(50, rng, base=1, cap=60, floor=0.5), 3) for _ in range(200)}
    assert len(delays) > 150  # relays retrying one outage do not come back in lockstep
    assert min(delays) >= 0.5
    assert max(delays) <= 60


def _tenacity_waits(attempts: int, *, base: float, cap: float, floor: float) -> list[float]:
    """The waits tenacity's own Retrying sleeps between `attempts` failing attempts."""
    sleeps: list[float] = []
    retrying = Retrying(
        wait=wait_exponential(multiplier=base, max=cap, min=floor),
        stop=stop_after_attempt(attempts + 1),
        sleep=sleeps.append,
        reraise=True,
    )
    with pytest.raises(ZeroDivisionError):
        retrying(lambda: 1 / 0)
    return sleeps


@given(
    st.sampled_from([0.1, 0.5, 1.0, 3.0]),
    st.sampled_from([0.0, 0.05, 0.5]),
    st.sampled_from([2.0, 60.0, 3600.0]),
)
def test_backoff_windows_are_tenacitys_exponential_waits(
    base: float, floor: float, cap: float
) -> None:
    theirs = _tenacity_waits(40, base=base, cap=cap, floor=floor)
    ours = [backoff.window(a, base=base, cap=cap, floor=floor) for a in range(1, 41)]
    assert ours == pytest.approx(theirs)


@given(st.integers(min_value=1, max_value=10_000), st.integers(min_value=0, max_value=2**32))
def test_backoff_is_full_jitter_within_the_window(attempt: int, seed: int) -> None:
    ours = backoff.delay(attempt, random.Random(seed), base=1, cap=300, floor=0.5)
    high = min(300.0, 2.0 ** min(attempt - 1, 60))
    assert 0.5 <= ours <= max(0.5, high)
    # The same draw as uniform(floor, window): the distribution persisted delays always had.
    window = backoff.window(attempt, base=1, cap=300, floor=0.5)
    assert ours == random.Random(seed).uniform(0.5, window)


def _msg(attempts: int = 1, **kw: object) -> Attempted:
    fields: dict[str, object] = {
        "seq": 7,
        "exchange": "orders",
        "attempts": attempts,
        "max_attempts": None,
        "created_at": NOW - dt.timedelta(minutes=1),
    }
    fields.update(kw)
    return Attempted(**fields)  # type: ignore[arg-type]


def _f(cls: FailureClass) -> Classified:
    return Classified(cls, "boom")


POLICY = RetryPolicy(max_attempts=3, max_attempts_by_exchange={"audit": 5}, max_age=3600)


@pytest.mark.parametrize(
    ("msg", "failure", "kind", "burn"),
    [
        (_msg(), _f(FC.UNROUTABLE), Retry, False),  # within its grace: deferred
        (_msg(), _f(FC.DESTINATION_MISSING), Retry, True),  # a circuit matter, not permanent
        (_msg(), _f(FC.MALFORMED), Dead, None),
        (_msg(), _f(FC.REJECTED), Retry, True),
        (_msg(), _f(FC.AMBIGUOUS), Retry, True),
        (_msg(), _f(FC.NEVER_SENT), Retry, False),
        (_msg(attempts=99), _f(FC.BACKPRESSURE), Retry, False),  # never burns, never kills
        (_msg(attempts=3), _f(FC.REJECTED), Dead, None),  # max_attempts reached
        (_msg(attempts=3, exchange="audit"), _f(FC.REJECTED), Retry, True),  # per-exchange 5
        (_msg(attempts=3, max_attempts=10), _f(FC.REJECTED), Retry, True),  # per-message wins
        (_msg(created_at=NOW - dt.timedelta(hours=2)), _f(FC.REJECTED), Dead, None),  # max age
    ],
)
def test_decisions(msg: Attempted, failure: Classified, kind: type, burn: bool | None) -> None:
    decision = decide(msg, failure, policy=POLICY, now=NOW, rng=random.Random(1))
    assert isinstance(decision, kind)
    if isinstance(decision, Retry):
        assert decision.burn is burn
        assert decision.at > NOW


@pytest.mark.parametrize(
    ("msg", "kind"),
    [
        (_msg(), Retry),
        (_msg(attempts=3), Retry),  # out of attempts, but the resource is at fault: no death
        (_msg(created_at=NOW - dt.timedelta(hours=2)), Dead),  # max age still applies
    ],
)
def test_a_failure_behind_an_open_circuit_burns_no_attempt(msg: Attempted, kind: type) -> None:
    decision = decide(
        msg,
        _f(FC.DESTINATION_MISSING),
        policy=POLICY,
        now=NOW,
        rng=random.Random(1),
        blameless=True,
    )
    assert isinstance(decision, kind)
    if isinstance(decision, Retry):
        assert decision.burn is False
        assert NOW <= decision.at <= NOW + dt.timedelta(seconds=POLICY.requeue_delay)
    else:
        assert isinstance(decision, Dead)
        assert "max age" in decision.reason


def test_unroutable_waits_out_its_grace_without_burning_then_dies() -> None:
    policy = RetryPolicy(unroutable_grace=300.0)
    waits = []
    for waited in (0, 10, 60, 120, 299):
        since = NOW - dt.timedelta(seconds=waited)
        decision = decide(
            _msg(attempts=50), _f(FC.UNROUTABLE), policy=policy, now=NOW,
            rng=random.Random(waited), unroutable_since=since,
        )  # fmt: skip
        assert isinstance(decision, Retry)
        assert decision.burn is False  # out of attempts, still not dead: the grace decides
        waits.append((decision.at - NOW).total_seconds())
    # A window that grows with the wait (half of it) and stops at a tenth of the grace.
    assert waits[0] <= policy.floor
    assert all(w <= 30.0 for w in waits)
    assert max(waits[2:]) > 5
    since = NOW - dt.timedelta(seconds=300)
    dead = decide(
        _msg(), _f(FC.UNROUTABLE), policy=policy, now=NOW, rng=random.Random(1),
        unroutable_since=since,
    )  # fmt: skip
    assert isinstance(dead, Dead)
    assert dead.reason == (
        "unroutable (permanent): boom (unroutable for 300 s, past the 300 s grace)"
    )
    at_once = RetryPolicy(unroutable_grace=0.0)
    dead = decide(_msg(), _f(FC.UNROUTABLE), policy=at_once, now=NOW, rng=random.Random(1))
    assert isinstance(dead, Dead)
    assert dead.reason == "unroutable (permanent): boom"


def test_permanence_is_configurable() -> None:
    lenient = RetryPolicy(permanent=frozenset({FC.MALFORMED}))
    decision = decide(_msg(), _f(FC.UNROUTABLE), policy=lenient, now=NOW, rng=random.Random(1))
    assert isinstance(decision, Retry)
    strict = RetryPolicy(permanent=frozenset({FC.DESTINATION_MISSING}))
    decision = decide(
        _msg(), _f(FC.DESTINATION_MISSING), policy=strict, now=NOW, rng=random.Random(1)
    )
    assert isinstance(decision, Dead)
    # malformed rows are dead whatever the configuration says: retrying cannot fix them
    nothing = RetryPolicy(permanent=frozenset())
    assert isinstance(
        decide(_msg(), _f(FC.MALFORMED), policy=nothing, now=NOW, rng=random.Random(1)), Dead
    )


def test_retry_times_follow_the_backoff_with_a_fixed_seed() -> None:
    policy = RetryPolicy(max_attempts=20, base=1, cap=60, floor=0.5, max_age=None)
    times = [
        decide(_msg(attempts=a), _f(FC.REJECTED), policy=policy, now=NOW, rng=random.Random(3))
        for a in range(1, 9)
    ]
    offsets = [(d.at - NOW).total_seconds() for d in times if isinstance(d, Retry)]
    expected = [backoff.delay(a, random.Random(3), base=1, cap=60, floor=0.5) for a in range(1, 9)]
    assert offsets == pytest.approx(expected, abs=1e-6)


def test_dead_reasons_say_why() -> None:
    dead = decide(_msg(attempts=3), _f(FC.REJECTED), policy=POLICY, now=NOW, rng=random.Random(1))
    assert isinstance(dead, Dead)
    assert dead.reason == "gave up after 3 attempts: boom"
