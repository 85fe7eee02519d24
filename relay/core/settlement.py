"""Settlement: what a batch's outcomes mean for its rows, as pure functions.

Two steps, because the circuit breakers sit between them:

1. `triage` sorts the outcomes into confirmed rows and failures, and lists what each resource's
   circuit must count, in order (None for a confirm, the detail of a resource failure).
2. The circuits count that and say, per failure, whether it burns an attempt: a failure behind an
   open circuit is the resource's fault, not the message's (relay/core/circuit.py).
3. `settle` turns each failure into a decision (`Retry` or `Dead`, relay/core/policy.py); the
   store applies them, with the confirmed rows, where the batch's lease still holds.

Whether a decision is a retry, a deferral or a death is the decision's own `kind`.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from relay.core.circuit import is_resource_failure
from relay.core.failures import Classified, FailureClass, classify
from relay.core.outcome import Outcome
from relay.core.policy import Attempted, Dead, Retry, RetryPolicy, decide


class Row(Protocol):
    """What settlement reads of a claimed row (relay.ports.Claimed has it)."""

    @property
    def seq(self) -> int: ...
    @property
    def exchange(self) -> str: ...
    @property
    def routing_key(self) -> str: ...
    @property
    def attempts(self) -> int: ...  # including the attempt that just ended
    @property
    def max_attempts(self) -> int | None: ...
    @property
    def created_at(self) -> dt.datetime: ...


@dataclass(frozen=True, slots=True)
class Failed:
    row: Row
    failure: Classified
    part: str | None  # the resource part whose circuit counts it; None: no circuit does
    connection_lost: bool  # the whole connection failed: not the message's fault


@dataclass(frozen=True, slots=True)
class Triage:
    published: list[int]  # confirmed seqs
    failed: list[Failed]
    circuits: dict[str, list[str | None]]  # per resource part, in order: what its circuit counts
    confirmed: list[Row] = field(default_factory=list)  # the rows of `published`


@dataclass(frozen=True, slots=True)
class Settlement:
    published: list[int]  # seqs to mark published
    failures: list[Retry | Dead]


def triage(
    outcomes: Iterable[Outcome],
    rows: Mapping[int, Row],
    *,
    part: Callable[[str, str], str],
    permanent: frozenset[FailureClass],
) -> Triage:
    """Sort `outcomes` of the rows in `rows` (others are skipped: their lease is gone).

    `part(exchange, routing_key)` names a row's resource part."""
    published: list[int] = []
    failed: list[Failed] = []
    circuits: dict[str, list[str | None]] = {}
    confirmed: list[Row] = []
    for outcome in outcomes:
        row = rows.get(outcome.seq)
        if row is None:
            continue
        failure = classify(outcome)
        if failure is None:  # the common case: no policy, one entry for the circuit
            published.append(row.seq)
            confirmed.append(row)
            circuits.setdefault(part(row.exchange, row.routing_key), []).append(None)
        elif is_resource_failure(outcome, failure, permanent):
            name = part(row.exchange, row.routing_key)
            failed.append(Failed(row, failure, name, False))
            circuits.setdefault(name, []).append(failure.detail or failure.cls.value)
        else:
            failed.append(Failed(row, failure, None, outcome.connection_lost))
    return Triage(published, failed, circuits, confirmed)


def decisions(
    triaged: Triage,
    burns: Mapping[str, Sequence[bool]],
    *,
    policy: RetryPolicy,
    now: dt.datetime,
    rng: random.Random,
    unroutable_since: Mapping[tuple[str, str], dt.datetime] | None = None,
) -> Settlement:
    """The decisions for a triaged batch. `burns[part]` says, for each of the part's failures in
    order, whether its circuit lets it burn an attempt (the circuits' answer to `circuits`).
    `unroutable_since[(exchange, routing_key)]`: when that destination was first seen unroutable
    (what the grace for unroutable messages counts from)."""
    counted: dict[str, int] = {}
    failures: list[Retry | Dead] = []
    for f in triaged.failed:
        if f.part is None:
            # The reconnect has its own backoff: a lost connection costs the message nothing.
            blameless = f.connection_lost
        else:
            i = counted.get(f.part, 0)
            counted[f.part] = i + 1
            blameless = not burns[f.part][i]
        row = f.row
        attempted = Attempted(row.seq, row.exchange, row.attempts, row.max_attempts, row.created_at)
        since = None
        if unroutable_since and f.failure.cls is FailureClass.UNROUTABLE:
            since = unroutable_since.get((row.exchange, row.routing_key))
        failures.append(
            decide(
                attempted, f.failure, policy=policy, now=now, rng=rng, blameless=blameless,
                unroutable_since=since,
            )
        )  # fmt: skip
    return Settlement(triaged.published, failures)
