"""Circuit breakers per broker resource: the states and every transition, as pure functions.

A resource (by default broker endpoint + vhost + exchange) is what fails together. Its circuit
is one row shared by every relay; the store reads it under a row lock, applies one of these
functions and writes the result back, so the rules live here and nowhere else.

    closed --(threshold consecutive failures)--> open --(cooldown over, one relay wins)--> half_open
    half_open --(the probe is confirmed)--> closed
    half_open --(the probe fails)--> open, with a longer cooldown
    half_open --(the prober vanished: probe deadline passed)--> half_open, taken by another relay

Failures while closed count against the message's attempts (they may be the message's fault
until the threshold says otherwise); failures while open or half-open cost no attempt: the
resource is known to be broken, so the message is not.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from relay.core.failures import Classified, FailureClass
from relay.core.outcome import Outcome


class CircuitState(StrEnum):
    CLOSED = "closed"  # messages flow; consecutive failures are counted
    OPEN = "open"  # nothing is claimed for the resource until open_until
    HALF_OPEN = "half_open"  # one relay sends one message to find out


@dataclass(frozen=True, slots=True)
class CircuitSettings:
    threshold: int = 5  # consecutive resource failures that open the circuit
    cooldown: float = 5.0  # the first open period, seconds
    max_cooldown: float = 300.0  # open periods double while the resource keeps failing, to this
    probe_timeout: float = 60.0  # a probe not settled by then may be retried by any relay


@dataclass(frozen=True, slots=True)
class Circuit:
    resource: str
    state: CircuitState = CircuitState.CLOSED
    failures: int = 0  # consecutive failures (closed), or the failures that opened it
    opens: int = 0  # openings since the last success: sets the next cooldown
    open_until: dt.datetime | None = None
    probe_owner: str | None = None
    probe_until: dt.datetime | None = None
    last_error: str | None = None
    changed_at: dt.datetime | None = None

    @property
    def blocks(self) -> bool:
        """Claims must pass this resource by (the probe is claimed on its own)."""
        return self.state is not CircuitState.CLOSED

    @property
    def pristine(self) -> bool:
        """Closed with nothing counted: a success changes nothing worth writing."""
        return self.state is CircuitState.CLOSED and self.failures == 0 and self.opens == 0

    def probe_due(self, now: dt.datetime) -> bool:
        if self.state is CircuitState.OPEN:
            return self.open_until is None or self.open_until <= now
        if self.state is CircuitState.HALF_OPEN:
            return self.probe_until is None or self.probe_until <= now
        return False


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of state, to be logged once by the relay that made it."""

    resource: str
    before: CircuitState
    after: CircuitState
    reason: str
    until: dt.datetime | None = None


# Failures that say the destination is unwell rather than that one message is wrong. A failure
# class configured as permanent dead-letters its message and says nothing about the resource.
RESOURCE_FAILURES = frozenset(
    {
        FailureClass.DESTINATION_MISSING,
        FailureClass.REJECTED,
        FailureClass.AMBIGUOUS,
        FailureClass.UNROUTABLE,
    }
)


def is_resource_failure(
    outcome: Outcome, failure: Classified | None, permanent: frozenset[FailureClass]
) -> bool:
    # A lost connection fails every resource at once; the publisher's reconnect (with its own
    # backoff) handles that, and opening every circuit would only delay recovery.
    return (
        failure is not None
        and not outcome.connection_lost
        and failure.cls in RESOURCE_FAILURES
        and failure.cls not in permanent
    )


def _cooldown(opens: int, settings: CircuitSettings, rng: random.Random) -> float:
    # Doubling per consecutive opening, with half of it jittered so relays that saw the same
    # outage do not all come back at the same instant.
    window = min(settings.max_cooldown, settings.cooldown * 2.0 ** max(0, opens - 1))
    return window / 2 + rng.uniform(0, window / 2)


def _closed(c: Circuit, changed_at: dt.datetime | None) -> Circuit:
    """Closed with nothing counted; the last error stays for the record."""
    return replace(
        c,
        state=CircuitState.CLOSED,
        failures=0,
        opens=0,
        open_until=None,
        probe_owner=None,
        probe_until=None,
        changed_at=changed_at,
    )


def _open(
    c: Circuit, now: dt.datetime, error: str, settings: CircuitSettings, rng: random.Random
) -> Circuit:
    opens = c.opens + 1
    until = now + dt.timedelta(seconds=_cooldown(opens, settings, rng))
    return replace(
        c,
        state=CircuitState.OPEN,
        opens=opens,
        open_until=until,
        probe_owner=None,
        probe_until=None,
        last_error=error,
        changed_at=now,
    )


def record(
    c: Circuit,
    results: Sequence[str | None],
    now: dt.datetime,
    settings: CircuitSettings,
    rng: random.Random,
) -> tuple[Circuit, list[bool], list[Transition]]:
    """Apply publish results in order: None is a confirm, a string a resource failure's detail.

    Returns the new circuit, for each failure whether it burns an attempt, and the transitions.
    """
    burns: list[bool] = []
    changes: list[Transition] = []
    for result in results:
        before = c.state
        if result is None:
            # While open a success can only be a late confirm of something sent before the
            # circuit opened: it proves nothing about now, so only the probe closes a circuit.
            if before is CircuitState.OPEN or c.pristine:
                continue
            c = _closed(c, now if before is not CircuitState.CLOSED else c.changed_at)
            if before is CircuitState.HALF_OPEN:
                changes.append(Transition(c.resource, before, c.state, "the probe was confirmed"))
            continue
        if before is CircuitState.CLOSED:
            burns.append(True)
            c = replace(c, failures=c.failures + 1, last_error=result)
            if c.failures >= settings.threshold:
                c = _open(c, now, result, settings, rng)
                reason = f"{c.failures} consecutive failures: {result}"
                changes.append(Transition(c.resource, before, c.state, reason, c.open_until))
        elif before is CircuitState.HALF_OPEN:
            burns.append(False)
            c = _open(c, now, result, settings, rng)
            reason = f"the probe failed: {result}"
            changes.append(Transition(c.resource, before, c.state, reason, c.open_until))
        else:
            burns.append(False)
            c = replace(c, last_error=result)
    return c, burns, changes


def begin_probe(
    c: Circuit, now: dt.datetime, owner: str, settings: CircuitSettings
) -> tuple[Circuit, Transition | None]:
    """Let `owner` probe if the cooldown is over (or the last prober vanished); else no change."""
    if not c.probe_due(now):
        return c, None
    probing = replace(
        c,
        state=CircuitState.HALF_OPEN,
        probe_owner=owner,
        probe_until=now + dt.timedelta(seconds=settings.probe_timeout),
        changed_at=now,
    )
    reason = f"cooldown over, {owner} probes with one message"
    return probing, Transition(c.resource, c.state, probing.state, reason, probing.probe_until)


def nothing_to_probe(c: Circuit, now: dt.datetime, owner: str) -> tuple[Circuit, Transition | None]:
    """The prober found no message waiting for the resource: nothing is at risk, so close."""
    if c.state is not CircuitState.HALF_OPEN or c.probe_owner != owner:
        return c, None
    closed = _closed(c, now)
    return closed, Transition(c.resource, c.state, closed.state, "no message waiting to probe")


def reset(c: Circuit, now: dt.datetime, who: str) -> tuple[Circuit, Transition | None]:
    """An operator closes the circuit by hand."""
    closed = _closed(c, now)
    if c.pristine:
        return closed, None
    return closed, Transition(c.resource, c.state, closed.state, f"reset by {who}")
