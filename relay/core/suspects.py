"""Crash isolation, row by row: which of a claim's candidates are taken, what taking a lease back
does to a row, what giving a row back does to its stamp, and the reasons recorded. Pure values
and functions; MySQL and SQLite read their rows, call these and apply the results, and
PostgreSQL's single statements are checked against them on generated cases
(tests/integration/test_suspects_match_core.py).

SUSPECTS. A row whose lease ended without a settlement (its relay died, or crashed, holding it)
may be what killed the relay, or may have been in flight beside it. Such a row goes back to
pending as a *suspect*: its lease_expires_at stays set (every other pending row has none).
Suspects are isolated in two steps, each published with nothing else in flight on its relay:

1. A suspect is claimed with other suspects only, at most `group` of them, and stamped GROUPED
   in last_error (which nothing else writes while a row is in flight). Nearly always its relay
   was simply killed or restarted, and the whole group is delivered at once.
2. If a relay dies again holding a group, each of its rows becomes SOLITARY (last_error, while
   pending): claimed alone, stamped ALONE. A row claimed alone whose lease ends unsettled is
   charged the attempt (and dies past its attempts); any other row is charged nothing.

So a message that kills every relay that claims it dead-letters itself alone, after one crash in
a batch, one in a group and then its attempts alone; the rows beside it are delivered. Two steps
rather than halving the group at each crash: a crash costs a restart (seconds, and a growing
back-off under an orchestrator), publishing one row alone costs milliseconds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

# The stamps, in last_error.
GROUPED = "claimed with other suspects only: the last lease on it ended before it settled"
SOLITARY = "to be claimed alone: its relay died while it was in flight with other suspects"
ALONE = "claimed alone: the last lease on it ended before it settled (its relay died)"

# ------------------------------------------------------------------------ reasons

# Why a lease was taken back, as the attempt record (and a row that is not a suspect's
# last_error) says it. Templates, so that PostgreSQL's statements can build the same text in SQL
# (relay/store/common.py, reason_sql); the functions below fill them in Python.
EXPIRED = "lease held by {owner} expired before it settled"
EARLIER_RUN = "lease held by an earlier run of {relay}, which stopped before it settled"
DEAD_RELAY = "relay {owner} stopped beating (no heartbeat for {seconds} s) before it settled"
CRASHED = "relay {relay} crashed before it settled: {why}"
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


def crashed(relay_id: str, why: str) -> str:
    """The rows a crashing relay gives up (abandon)."""
    return CRASHED.format(relay=relay_id, why=why)


def seconds(value: float) -> str:
    """A number of seconds as PostgreSQL writes a float8 as text: shortest, no trailing .0."""
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


# ------------------------------------------------------------------------ claiming


@dataclass(frozen=True, slots=True)
class Candidate:
    """A ready row a claim may take, as the claim read it."""

    seq: int
    key: str | None
    suspect: bool  # pending with a lease_expires_at: its last lease ended unsettled
    solitary: bool  # a suspect stamped SOLITARY: to be claimed alone


@dataclass(frozen=True, slots=True)
class Choice:
    """The rows a claim takes, in claim order, and the stamp it writes on them."""

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
    """A row in flight whose lease is being taken back (or given back), as read."""

    seq: int
    last_error: str | None  # its stamp, if it is a suspect claimed as one
    attempts: int  # counting the claim that leased it
    max_attempts: int | None  # the row's own; None: the relay's default


@dataclass(frozen=True, slots=True)
class Record:
    """The attempt record (outbox_attempt) of a lease taken back; its class is ambiguous."""

    attempt: int
    outcome: Outcome
    error: str
    next_attempt_at: dt.datetime | None


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """What taking a lease back does to a row. The lease (owner, token) is cleared and
    last_failed_at is `now`; lease_expires_at stays, the suspect's mark; available_at stays,
    so the row keeps its place in line."""

    seq: int
    state: Literal["pending", "dead"]
    attempts: int
    last_error: str
    record: Record

    @property
    def change(self) -> tuple[str, int, str]:
        """The columns it writes: rows with the same change are written by one statement."""
        return self.state, self.attempts, self.last_error


def reclaim(row: Leased, *, reason: str, max_attempts: int, now: dt.datetime) -> Reclaimed:
    """Take back a row whose lease ended unsettled. Which message killed the relay is unknown
    unless it was alone: a row claimed alone is charged the attempt and goes to dead once it
    has used up its attempts (its own max_attempts, else `max_attempts`, the relay's default);
    any other is charged nothing (the claim's attempt is given back). Every row not dead is a
    suspect now: one that was in a group or alone becomes solitary, the rest stay suspects to be
    claimed in groups, their last_error the reason."""
    alone = row.last_error == ALONE
    if alone:
        dies = row.attempts >= (row.max_attempts if row.max_attempts is not None else max_attempts)
        outcome: Outcome = "dead" if dies else "retry"
        return Reclaimed(
            seq=row.seq,
            state="dead" if dies else "pending",
            attempts=row.attempts,
            last_error=reason if dies else SOLITARY,
            record=Record(row.attempts, outcome, reason, None if dies else now),
        )
    attempts = max(row.attempts - 1, 0)
    return Reclaimed(
        seq=row.seq,
        state="pending",
        attempts=attempts,
        last_error=SOLITARY if row.last_error == GROUPED else reason,
        record=Record(attempts + 1, "deferred", reason, now),
    )


def by_change(reclaimed: Iterable[Reclaimed]) -> dict[tuple[str, int, str], list[int]]:
    """The seqs of each distinct change, in the order first met: rows taken back together
    mostly change alike (one relay's rows, claimed once), so these are few statements."""
    changes: dict[tuple[str, int, str], list[int]] = {}
    for r in reclaimed:
        changes.setdefault(r.change, []).append(r.seq)
    return changes


# ------------------------------------------------------------------------ giving rows back


@dataclass(frozen=True, slots=True)
class Released:
    """What giving a row back unsent does to it: pending again, the claim's attempt given back
    (it never happened). A suspect stays one (`suspect`: lease_expires_at is set, to now), and
    one claimed alone stays solitary; any other row's last_error is the reason given."""

    attempts: int
    last_error: str
    suspect: bool


def release(row: Leased, *, error: str) -> Released:
    return Released(
        attempts=max(row.attempts - 1, 0),
        last_error=SOLITARY if row.last_error == ALONE else error,
        suspect=row.last_error in (ALONE, GROUPED),
    )
