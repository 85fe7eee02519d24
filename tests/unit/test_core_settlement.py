"""Settlement as tables: outcomes and rows in; what the circuits count, then the decisions, out."""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

import pytest

from relay.core.failures import FailureClass as FC
from relay.core.outcome import Fate, Outcome
from relay.core.policy import DEFAULT_PERMANENT, Dead, Retry, RetryPolicy
from relay.core.settlement import Triage, decisions, triage

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
POLICY = RetryPolicy(max_attempts=3, max_age=3600)


@dataclass(frozen=True)
class Row:
    seq: int
    exchange: str = "orders"
    routing_key: str = "rk"
    attempts: int = 1
    max_attempts: int | None = None
    created_at: dt.datetime = NOW - dt.timedelta(minutes=1)


def by_exchange(exchange: str, _routing_key: str) -> str:
    return exchange


def triaged(*outcomes: Outcome, rows: dict[int, Row] | None = None) -> Triage:
    rows = rows if rows is not None else {o.seq: Row(o.seq) for o in outcomes}
    return triage(outcomes, rows, part=by_exchange, permanent=DEFAULT_PERMANENT)


def decided(t: Triage, burns: dict[str, list[bool]]) -> list[tuple[int, str, FC]]:
    out = decisions(t, burns, policy=POLICY, now=NOW, rng=random.Random(1))
    return [(d.seq, d.kind, d.failure.cls) for d in out.failures]


# ----------------------------------------------------------------------------- triage


@pytest.mark.parametrize(
    ("outcome", "published", "circuit", "failed"),
    [
        # a confirm: published, and its circuit counts a success
        (Outcome(1, Fate.CONFIRMED), [1], [None], None),
        # the destination's fault (not permanent): its circuit counts the failure
        (Outcome(1, Fate.REJECTED, "nack"), [], ["nack"], (FC.REJECTED, "orders", False)),
        (
            Outcome(1, Fate.DESTINATION_MISSING, "404"),
            [],
            ["404"],
            (FC.DESTINATION_MISSING, "orders", False),
        ),
        (Outcome(1, Fate.UNCONFIRMED, ""), [], ["ambiguous"], (FC.AMBIGUOUS, "orders", False)),
        # permanent: the message's fault, so the circuit learns nothing from it
        (Outcome(1, Fate.UNROUTABLE, "312 NO_ROUTE"), [], None, (FC.UNROUTABLE, None, False)),
        (
            Outcome(1, Fate.NOT_SENT, "bad header", malformed=True),
            [],
            None,
            (FC.MALFORMED, None, False),
        ),
        # nothing reached the broker, or it pushed back: no circuit counts it
        (Outcome(1, Fate.NOT_SENT, "no channel"), [], None, (FC.NEVER_SENT, None, False)),
        (
            Outcome(1, Fate.UNCONFIRMED, "timeout", while_blocked=True),
            [],
            None,
            (FC.BACKPRESSURE, None, False),
        ),
        # a lost connection fails every resource at once: no circuit, and not the message's fault
        (
            Outcome(1, Fate.UNCONFIRMED, "closed", connection_lost=True),
            [],
            None,
            (FC.AMBIGUOUS, None, True),
        ),
    ],
)
def test_triage(
    outcome: Outcome,
    published: list[int],
    circuit: list[str | None] | None,
    failed: tuple[FC, str | None, bool] | None,
) -> None:
    t = triaged(outcome)
    assert t.published == published
    assert t.circuits == ({} if circuit is None else {"orders": circuit})
    assert [(f.failure.cls, f.part, f.connection_lost) for f in t.failed] == (
        [] if failed is None else [failed]
    )


def test_triage_keeps_the_order_per_part_and_skips_rows_no_longer_held() -> None:
    rows = {1: Row(1), 2: Row(2, exchange="audit"), 3: Row(3), 4: Row(4)}
    t = triaged(
        Outcome(1, Fate.REJECTED, "first"),
        Outcome(2, Fate.CONFIRMED),
        Outcome(9, Fate.CONFIRMED),  # its lease is gone: not this batch's to settle
        Outcome(3, Fate.CONFIRMED),
        Outcome(4, Fate.REJECTED, "second"),
        rows=rows,
    )
    assert t.published == [2, 3]
    assert t.circuits == {"orders": ["first", None, "second"], "audit": [None]}
    assert [f.row.seq for f in t.failed] == [1, 4]


def test_a_permanence_setting_moves_a_failure_out_of_the_circuits() -> None:
    strict = RetryPolicy(permanent=frozenset({FC.DESTINATION_MISSING}))
    t = triage(
        [Outcome(1, Fate.DESTINATION_MISSING, "404")],
        {1: Row(1)},
        part=by_exchange,
        permanent=strict.permanent,
    )
    assert t.circuits == {}
    [dead] = decisions(t, {}, policy=strict, now=NOW, rng=random.Random(1)).failures
    assert (dead.seq, dead.kind) == (1, "dead")


# ----------------------------------------------------------------------------- settle


@pytest.mark.parametrize(
    ("row", "outcome", "burns", "expected"),
    [
        # the circuit was closed: the failure may be the message's, so it burns an attempt
        (Row(1), Outcome(1, Fate.REJECTED, "nack"), {"orders": [True]}, "retry"),
        # the circuit was open or probing: the resource's fault, nothing burned
        (Row(1), Outcome(1, Fate.REJECTED, "nack"), {"orders": [False]}, "deferred"),
        # out of attempts: dead, unless the open circuit takes the blame
        (Row(1, attempts=3), Outcome(1, Fate.REJECTED, "nack"), {"orders": [True]}, "dead"),
        (Row(1, attempts=3), Outcome(1, Fate.REJECTED, "nack"), {"orders": [False]}, "deferred"),
        # ...but never past its max age
        (
            Row(1, created_at=NOW - dt.timedelta(hours=2)),
            Outcome(1, Fate.REJECTED, "nack"),
            {"orders": [False]},
            "dead",
        ),
        # Unroutable: deferred through its grace, counted by no circuit.
        (Row(1), Outcome(1, Fate.UNROUTABLE, "312 NO_ROUTE"), {}, "deferred"),
        (Row(1, attempts=9), Outcome(1, Fate.NOT_SENT, "no channel"), {}, "deferred"),
        (
            Row(1, attempts=3),
            Outcome(1, Fate.UNCONFIRMED, "x", connection_lost=True),
            {},
            "deferred",
        ),
        (Row(1, attempts=3), Outcome(1, Fate.UNCONFIRMED, "x"), {"orders": [True]}, "dead"),
    ],
)
def test_settle(row: Row, outcome: Outcome, burns: dict[str, list[bool]], expected: str) -> None:
    [(seq, kind, _cls)] = decided(triaged(outcome, rows={1: row}), burns)
    assert (seq, kind) == (1, expected)


def test_each_failure_of_a_part_takes_its_own_answer_from_the_circuit_in_order() -> None:
    # The third failure opened the circuit: the first three burn, the ones after it do not.
    outcomes = [Outcome(s, Fate.DESTINATION_MISSING, "404") for s in range(1, 6)]
    t = triaged(*outcomes)
    assert decided(t, {"orders": [True, True, True, False, False]}) == [
        (1, "retry", FC.DESTINATION_MISSING),
        (2, "retry", FC.DESTINATION_MISSING),
        (3, "retry", FC.DESTINATION_MISSING),
        (4, "deferred", FC.DESTINATION_MISSING),
        (5, "deferred", FC.DESTINATION_MISSING),
    ]


def test_confirmed_rows_need_no_decision_and_the_triage_is_left_as_it_was() -> None:
    t = triaged(Outcome(1, Fate.CONFIRMED), Outcome(2, Fate.REJECTED, "nack"))
    burns = {"orders": [True]}
    first = decisions(t, burns, policy=POLICY, now=NOW, rng=random.Random(1))
    again = decisions(t, burns, policy=POLICY, now=NOW, rng=random.Random(1))
    assert first == again  # pure: the same inputs, the same decisions
    assert first.published == [1]
    [retry] = first.failures
    assert isinstance(retry, Retry)
    assert retry.burn
    assert retry.at > NOW
    assert retry.kind == "retry"


def test_decision_kinds_are_named_once() -> None:
    failure = triaged(Outcome(1, Fate.UNROUTABLE, "x")).failed[0].failure
    assert Retry(1, NOW, True, failure).kind == "retry"
    assert Retry(1, NOW, False, failure).kind == "deferred"
    assert Dead(1, failure, "why").kind == "dead"
