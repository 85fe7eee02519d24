"""Circuit breaker transitions and the token bucket: pure functions, fixed clocks and seeds."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from relay.core import bucket, circuit
from relay.core.circuit import Circuit, CircuitSettings, CircuitState
from relay.core.failures import Classified
from relay.core.failures import FailureClass as FC
from relay.core.outcome import Fate, Outcome
from relay.core.policy import DEFAULT_PERMANENT

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
S = CircuitSettings(threshold=3, cooldown=10.0, max_cooldown=80.0, probe_timeout=60.0)
R = "127.0.0.1:5672/%2F/orders"


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def rec(
    c: Circuit, *results: str | None, now: float = 0.0, seed: int = 1
) -> tuple[Circuit, list[bool], list[circuit.Transition]]:
    return circuit.record(c, results, at(now), S, random.Random(seed))


def opened(now: float = 0.0) -> Circuit:
    c, _, _ = rec(Circuit(R), "404", "404", "404", now=now)
    assert c.state is CircuitState.OPEN
    return c


def test_failures_below_the_threshold_burn_and_count_and_a_success_resets_them() -> None:
    c, burns, changes = rec(Circuit(R), "404", "404")
    assert (c.state, c.failures, burns, changes) == (CircuitState.CLOSED, 2, [True, True], [])
    c, burns, _ = rec(c, None)
    assert (c.state, c.failures, c.opens, burns) == (CircuitState.CLOSED, 0, 0, [])
    assert c.pristine


def test_the_threshold_opens_the_circuit_once_and_later_failures_are_free() -> None:
    c, burns, changes = rec(Circuit(R), "a", "b", "c", "d", "e")
    assert c.state is CircuitState.OPEN
    # the failures up to the threshold may still be the message's fault; after that, not
    assert burns == [True, True, True, False, False]
    assert len(changes) == 1
    t = changes[0]
    assert (t.before, t.after, t.resource) == (CircuitState.CLOSED, CircuitState.OPEN, R)
    assert "3 consecutive failures: c" in t.reason
    assert c.last_error == "e"
    assert c.open_until is not None
    assert at(5) <= c.open_until <= at(10)


def test_a_late_success_while_open_proves_nothing() -> None:
    c = opened()
    after, burns, changes = rec(c, None)
    assert after == c
    assert burns == []
    assert changes == []


def test_one_probe_after_the_cooldown_and_only_one_relay_gets_it() -> None:
    c = opened()
    assert c.open_until is not None
    assert not c.probe_due(c.open_until - dt.timedelta(seconds=1))
    same, t = circuit.begin_probe(c, c.open_until - dt.timedelta(seconds=1), "relay-a", S)
    assert same == c
    assert t is None
    now = c.open_until
    probing, t = circuit.begin_probe(c, now, "relay-a", S)
    assert probing.state is CircuitState.HALF_OPEN
    assert probing.probe_owner == "relay-a"
    assert t is not None
    assert t.after is CircuitState.HALF_OPEN
    assert probing.blocks  # the main claim still passes it by; the probe is claimed alone
    # a second relay reading the row after the first (the row lock orders them) does not probe
    again, t2 = circuit.begin_probe(probing, now, "relay-b", S)
    assert again == probing
    assert t2 is None
    # ...unless the prober vanished and its probe deadline passed
    late = now + dt.timedelta(seconds=S.probe_timeout)
    taken, t3 = circuit.begin_probe(probing, late, "relay-b", S)
    assert taken.probe_owner == "relay-b"
    assert t3 is not None


def test_a_confirmed_probe_closes_and_a_failed_one_reopens_for_longer() -> None:
    c = opened()
    assert c.open_until is not None
    probing, _ = circuit.begin_probe(c, c.open_until, "relay-a", S)
    closed, burns, changes = rec(probing, None, now=20)
    assert closed.state is CircuitState.CLOSED
    assert closed.pristine
    assert burns == []
    assert [(t.before, t.after) for t in changes] == [(CircuitState.HALF_OPEN, CircuitState.CLOSED)]

    reopened, burns, changes = rec(probing, "still 404", now=20)
    assert reopened.state is CircuitState.OPEN
    assert burns == [False]
    assert reopened.opens == 2
    assert changes[0].before is CircuitState.HALF_OPEN
    assert "the probe failed" in changes[0].reason
    assert reopened.open_until is not None
    assert at(20 + 10) <= reopened.open_until <= at(20 + 20)  # the window doubled to 20


def test_cooldowns_double_up_to_the_cap_with_half_of_each_jittered() -> None:
    c = opened()
    for n in range(2, 9):
        assert c.open_until is not None
        probing, _ = circuit.begin_probe(c, c.open_until, "r", S)
        c, _, _ = circuit.record(probing, ["x"], c.open_until, S, random.Random(n))
        window = min(S.max_cooldown, S.cooldown * 2 ** (n - 1))
        assert probing.open_until is not None
        assert c.open_until is not None
        wait = (c.open_until - probing.open_until).total_seconds()
        assert window / 2 <= wait <= window
        assert c.opens == n


def test_jitter_spreads_relays_that_saw_the_same_outage() -> None:
    untils = {opened_with(seed).open_until for seed in range(20)}
    assert len(untils) > 10


def opened_with(seed: int) -> Circuit:
    c, _, _ = rec(Circuit(R), "a", "b", "c", seed=seed)
    return c


def test_nothing_to_probe_closes_only_the_probers_own_probe() -> None:
    c = opened()
    assert c.open_until is not None
    probing, _ = circuit.begin_probe(c, c.open_until, "relay-a", S)
    unchanged, t = circuit.nothing_to_probe(probing, c.open_until, "relay-b")
    assert unchanged == probing
    assert t is None
    closed, t = circuit.nothing_to_probe(probing, c.open_until, "relay-a")
    assert closed.state is CircuitState.CLOSED
    assert closed.pristine
    assert t is not None


def test_an_operator_reset_closes_and_keeps_the_last_error_for_the_record() -> None:
    c = opened()
    closed, t = circuit.reset(c, at(1), "operator")
    assert closed.pristine
    assert closed.last_error == c.last_error
    assert t is not None
    assert t.reason == "reset by operator"
    _, nothing = circuit.reset(closed, at(2), "operator")
    assert nothing is None


@pytest.mark.parametrize(
    ("outcome", "cls", "counts"),
    [
        (Outcome(1, Fate.DESTINATION_MISSING, "404"), FC.DESTINATION_MISSING, True),
        (Outcome(1, Fate.REJECTED, "nack"), FC.REJECTED, True),
        (Outcome(1, Fate.UNCONFIRMED, "timeout"), FC.AMBIGUOUS, True),
        # the whole connection went: the reconnect handles it, every circuit would open for nothing
        (Outcome(1, Fate.UNCONFIRMED, "closed", connection_lost=True), FC.AMBIGUOUS, False),
        (Outcome(1, Fate.NOT_SENT, "no channel"), FC.NEVER_SENT, False),
        (Outcome(1, Fate.NOT_SENT, "blocked", while_blocked=True), FC.BACKPRESSURE, False),
        # permanent by default: the message is dead, and says nothing about the destination
        (Outcome(1, Fate.UNROUTABLE, "312"), FC.UNROUTABLE, False),
        (Outcome(1, Fate.NOT_SENT, "bad", malformed=True), FC.MALFORMED, False),
    ],
)
def test_what_counts_against_a_resource(outcome: Outcome, cls: FC, counts: bool) -> None:
    failure = Classified(cls, outcome.detail)
    assert circuit.is_resource_failure(outcome, failure, DEFAULT_PERMANENT) is counts


def test_unroutable_counts_when_it_is_not_configured_permanent() -> None:
    outcome = Outcome(1, Fate.UNROUTABLE, "312")
    failure = Classified(FC.UNROUTABLE, "312")
    assert circuit.is_resource_failure(outcome, failure, frozenset({FC.MALFORMED}))


# ----------------------------------------------------------------- token bucket


def test_a_new_bucket_is_full_and_grants_whole_tokens_up_to_the_burst() -> None:
    b, granted = bucket.take(bucket.Bucket(), T0, rate=10, burst=10, want=25)
    assert granted == 10
    assert b.tokens == 0
    assert b.at == T0


def test_tokens_refill_at_the_rate_and_never_beyond_the_burst() -> None:
    b, _ = bucket.take(bucket.Bucket(), T0, rate=10, burst=10, want=10)
    b, granted = bucket.take(b, at(0.35), rate=10, burst=10, want=10)
    assert granted == 3
    assert b.tokens == pytest.approx(0.5)
    b, granted = bucket.take(b, at(100), rate=10, burst=10, want=100)
    assert granted == 10


def test_a_clock_stepping_back_adds_no_tokens() -> None:
    b, _ = bucket.take(bucket.Bucket(), T0, rate=10, burst=10, want=10)
    b, granted = bucket.take(b, at(-5), rate=10, burst=10, want=10)
    assert granted == 0


def test_unused_tokens_go_back_capped_at_the_burst() -> None:
    b, _ = bucket.take(bucket.Bucket(), T0, rate=5, burst=5, want=4)
    assert bucket.refund(b, 3, burst=5).tokens == 4
    assert bucket.refund(b, 30, burst=5).tokens == 5


def test_wait_for_says_when_the_next_token_comes() -> None:
    b, _ = bucket.take(bucket.Bucket(), T0, rate=4, burst=4, want=4)
    assert bucket.wait_for(b, rate=4) == pytest.approx(0.25)
    assert bucket.wait_for(bucket.Bucket(), rate=4) == 0


def test_many_takers_together_keep_to_the_rate() -> None:
    # three relays drawing in turn every 10 ms for 10 s get rate * 10 s (+ the first burst)
    b = bucket.Bucket()
    total = 0
    for step in range(1000):
        b, granted = bucket.take(b, at(step / 100), rate=50, burst=50, want=500)
        total += granted
    assert 50 * 10 <= total <= 50 * 10 + 50
