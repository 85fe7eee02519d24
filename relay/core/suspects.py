"""Crash isolation, row by row: which of a claim's candidates are taken, what taking a lease back
does to a row, and the reasons recorded. Pure values and functions: every store reads the rows
whose lease it takes back, calls `reclaim` for each and writes the results back with two batched
statements, the rows and their attempt records (relay/store/rescuer.py); the SQL holds no
policy.

SUSPECTS. A row whose lease ended without a settlement (its relay died, or crashed, holding it)
may be what killed the relay, or may have been in flight beside it. Such a row goes back to
pending as a *suspect* (its `suspect` column, outbox.states.Suspect). Suspects are isolated in two
steps, each published with nothing else in flight on its relay:

1. A suspect is claimed with other suspects only, at most `group` of them (Suspect.GROUP). Nearly
   always its relay was simply killed or restarted, and the whole group is delivered at once.
2. If a relay dies again holding a group, each of its rows is claimed alone next
   (Suspect.ALONE). A row claimed alone whose lease ends unsettled is charged the attempt (and
   dies past its attempts); any other row is charged nothing.

So a message that kills every relay that claims it dead-letters itself alone, after one crash in
a batch, one in a group and then its attempts alone; the rows beside it are delivered. Two steps
rather than halving the group at each crash: a crash costs a restart (seconds, and a growing
back-off under an orchestrator), publishing one row alone costs milliseconds.

A claim leaves the suspect column as it is, so while a row is in flight it says how the row was
claimed; settling a row (published, retried, dead by a settlement) clears it. Beside the column,
rows carry what relays of schema 6 read (outbox.states, STAMP_*): `Choice.stamp` and the
`last_error` of `Reclaimed` are those texts where such a relay needs them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from outbox.states import STAMP_ALONE, STAMP_GROUPED, STAMP_SOLITARY, Suspect

# The texts written beside the suspect column for relays of schema 6 (see the module's docstring).
GROUPED = STAMP_GROUPED
SOLITARY = STAMP_SOLITARY
ALONE = STAMP_ALONE

# The failure class of every attempt a lease taken back records: the broker may or may not have
# the message.
AMBIGUOUS = "ambiguous"

# ------------------------------------------------------------------------ reasons

# Why a lease was taken back, as the attempt record (and the row's last_error) says it.
EXPIRED = "lease held by {owner} expired before it settled"
EARLIER_RUN = "lease held by an earlier run of {relay}, which stopped before it settled"
DEAD_RELAY = "relay {owner} stopped beating (no heartbeat for {seconds} s) before it settled"
CRASHED = "relay {relay} crashed before it settled: {why}"
STRAY = "lease held by {relay} under a claim whose answer a database failure lost"
UNKNOWN_OWNER = "?"  # a row in flight with no lease_owner (never written so; said plainly)


def expired(owner: str | None) -> str:
    """An expired lease (reclaim_expired)."""
    return EXPIRED.format(owner=UNKNOWN_OWNER if owner is None else owner)


def earlier_run(relay_id: str) -> str:
    """A lease left by an earlier run of this relay id (reclaim_owner)."""
    return EARLIER_RUN.format(relay=relay_id)


def dead_relay(owner: str | None, dead_after: float) -> str:
    """A relay that stopped beating (reclaim_dead)."""
    return DEAD_RELAY.format(
        owner=UNKNOWN_OWNER if owner is None else owner, seconds=seconds(dead_after)
    )


def stray(relay_id: str) -> str:
    """A lease of this relay's it never heard of (reclaim_strays)."""
    return STRAY.format(relay=relay_id)


def crashed(relay_id: str, why: str) -> str:
    """The rows a crashing relay gives up (abandon)."""
    return CRASHED.format(relay=relay_id, why=why)


def seconds(value: float) -> str:
    """A number of seconds, shortest: no trailing .0 (3, 0.5, 2.25)."""
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def suspect_of(stored: str | None) -> Suspect | None:
    """A row's suspect column as read (an unknown value counts as none)."""
    return Suspect(stored) if stored in (Suspect.GROUP.value, Suspect.ALONE.value) else None


# ------------------------------------------------------------------------ claiming


@dataclass(frozen=True, slots=True)
class Candidate:
    """A ready row a claim may take, as the claim read it."""

    seq: int
    key: str | None
    suspect: bool  # its suspect column is set: its last lease ended unsettled
    solitary: bool  # a suspect to be claimed alone (Suspect.ALONE)


@dataclass(frozen=True, slots=True)
class Choice:
    """The rows a claim takes, in claim order, and the text it writes in their last_error for
    relays of schema 6."""

    chosen: tuple[Candidate, ...]
    stamp: str | None  # ALONE or GROUPED when suspects are taken; None: last_error is kept

    @property
    def seqs(self) -> list[int]:
        return [c.seq for c in self.chosen]

    @property
    def suspects(self) -> bool:
        return self.stamp is not None

    @property
    def heads(self) -> tuple[Candidate, ...]:
        """The keyed rows a run may follow: every keyed row taken, unless suspects are."""
        return () if self.suspects else tuple(c for c in self.chosen if c.key is not None)


def choose(best: Sequence[Candidate], *, group: int) -> Choice:
    """Of a claim's best candidates (in claim order, at most its limit), those it takes: the
    first solitary suspect alone; else the suspects, at most `group`; else all of them."""
    if group < 1:
        raise ValueError(f"group must be at least 1, not {group}")
    solitary = [c for c in best if c.solitary][:1]
    if solitary:
        return Choice(tuple(solitary), ALONE)
    suspects = [c for c in best if c.suspect][:group]
    if suspects:
        return Choice(tuple(suspects), GROUPED)
    return Choice(tuple(best), None)


# ------------------------------------------------------------------------ taking leases back

Outcome = Literal["deferred", "retry", "dead"]


@dataclass(frozen=True, slots=True)
class Leased:
    """A row in flight whose lease is being taken back, as read."""

    seq: int
    suspect: Suspect | None  # how it was claimed, if as a suspect
    attempts: int  # counting the claim that leased it
    max_attempts: int | None  # the row's own; None: the relay's default


@dataclass(frozen=True, slots=True)
class Record:
    """The attempt record (outbox_attempt) of a lease taken back; its class is AMBIGUOUS."""

    attempt: int
    outcome: Outcome
    error: str
    next_attempt_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """What taking a lease back does to a row. The lease (owner, token) is cleared and
    last_failed_at is `now`; available_at stays, so the row keeps its place in line, and so does
    lease_expires_at, a pending suspect's mark for relays of schema 6."""

    seq: int
    state: Literal["pending", "dead"]
    attempts: int
    suspect: Suspect  # how it is claimed next (a dead one, if an operator replays it)
    last_error: str  # the reason; SOLITARY (schema 6's mark) for a suspect to be claimed alone
    record: Record


def reclaim(row: Leased, *, reason: str, max_attempts: int, now: dt.datetime) -> Reclaimed:
    """Take back a row whose lease ended unsettled. Which message killed the relay is unknown
    unless it was alone: a row claimed alone is charged the attempt and goes to dead once it
    has used up its attempts (its own max_attempts, else `max_attempts`, the relay's default);
    any other is charged nothing (the claim's attempt is refunded). Every row taken back is a
    suspect: one that was in a group or alone is claimed alone next, the rest in groups; one
    that dies is a suspect in groups again if an operator replays it."""
    if row.suspect is Suspect.ALONE:
        allowed = row.max_attempts if row.max_attempts is not None else max_attempts
        if row.attempts >= allowed:
            record = Record(row.attempts, "dead", reason, None)
            return Reclaimed(row.seq, "dead", row.attempts, Suspect.GROUP, reason, record)
        record = Record(row.attempts, "retry", reason, now)
        return Reclaimed(row.seq, "pending", row.attempts, Suspect.ALONE, SOLITARY, record)
    attempts = max(row.attempts - 1, 0)
    record = Record(attempts + 1, "deferred", reason, now)
    if row.suspect is Suspect.GROUP:
        return Reclaimed(row.seq, "pending", attempts, Suspect.ALONE, SOLITARY, record)
    return Reclaimed(row.seq, "pending", attempts, Suspect.GROUP, reason, record)
