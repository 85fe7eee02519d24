"""Crash isolation's per-row decisions (relay/core/suspects.py): table tests, one row per case,
then properties over generated rows. What every store writes of them is
tests/integration/test_reclaim_writes_the_core.py."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.states import Suspect
from relay.core import suspects
from relay.core.suspects import (
    ALONE,
    GROUPED,
    SOLITARY,
    Candidate,
    Leased,
    Reclaimed,
    Record,
    choose,
    reclaim,
)

GROUP, BY_ITSELF = Suspect.GROUP, Suspect.ALONE

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
WHY = "lease held by r1 expired before it settled"


def row(
    seq: int, key: str | None = None, *, suspect: bool = False, solo: bool = False
) -> Candidate:
    return Candidate(seq, key, suspect=suspect or solo, solitary=solo)


# ------------------------------------------------------------------------ claiming

# (the best candidates in claim order, group, the seqs taken, the stamp, the heads runs follow)
CHOICES: list[tuple[list[Candidate], int, list[int], str | None, list[int]]] = [
    ([], 100, [], None, []),
    ([row(1), row(2, "k"), row(3)], 100, [1, 2, 3], None, [2]),
    ([row(1, "a"), row(2, "b")], 1, [1, 2], None, [1, 2]),  # group bounds suspects only
    ([row(1), row(2, suspect=True), row(3)], 100, [2], GROUPED, []),
    ([row(1, suspect=True), row(2, "k", suspect=True), row(3)], 100, [1, 2], GROUPED, []),
    ([row(1, suspect=True), row(2, suspect=True), row(3, suspect=True)], 2, [1, 2], GROUPED, []),
    ([row(1, suspect=True), row(2, solo=True), row(3, solo=True)], 100, [2], ALONE, []),
    ([row(1, "k", solo=True), row(2)], 100, [1], ALONE, []),  # a keyed one alone: no run
    ([row(1), row(2, suspect=True)], 1, [2], GROUPED, []),
]


@pytest.mark.parametrize(("best", "group", "taken", "stamp", "heads"), CHOICES)
def test_which_candidates_a_claim_takes(
    best: list[Candidate], group: int, taken: list[int], stamp: str | None, heads: list[int]
) -> None:
    choice = choose(best, group=group)
    assert choice.seqs == taken
    assert choice.stamp == stamp
    assert choice.suspects is (stamp is not None)
    assert [c.seq for c in choice.heads] == heads


def test_a_claim_takes_at_least_one_suspect_at_a_time() -> None:
    with pytest.raises(ValueError, match="group"):
        choose([row(1)], group=0)


# ------------------------------------------------------------------------ taking leases back

# (how it was claimed, attempts, its max_attempts, the relay's) -> what becomes of it
RECLAIMS: list[tuple[Suspect | None, int, int | None, int, Reclaimed]] = [
    # In a batch: charged nothing, a suspect to be claimed in a group.
    (None, 1, None, 10, Reclaimed(7, "pending", 0, GROUP, WHY, Record(1, "deferred", WHY, NOW))),
    (None, 3, None, 10, Reclaimed(7, "pending", 2, GROUP, WHY, Record(3, "deferred", WHY, NOW))),
    (None, 5, 5, 10, Reclaimed(7, "pending", 4, GROUP, WHY, Record(5, "deferred", WHY, NOW))),
    # Never below zero (a row claimed before attempts were counted, or edited by hand).
    (None, 0, None, 10, Reclaimed(7, "pending", 0, GROUP, WHY, Record(1, "deferred", WHY, NOW))),
    # Out of attempts in a batch or a group: still charged nothing, never dead.
    (None, 10, None, 10, Reclaimed(7, "pending", 9, GROUP, WHY, Record(10, "deferred", WHY, NOW))),
    (
        GROUP,
        10,
        2,
        10,
        Reclaimed(7, "pending", 9, BY_ITSELF, SOLITARY, Record(10, "deferred", WHY, NOW)),
    ),
    # In a group: alone next (and schema 6's mark for it in last_error).
    (
        GROUP,
        1,
        None,
        10,
        Reclaimed(7, "pending", 0, BY_ITSELF, SOLITARY, Record(1, "deferred", WHY, NOW)),
    ),
    # Alone: charged, and alone again while it has attempts left...
    (
        BY_ITSELF,
        1,
        None,
        10,
        Reclaimed(7, "pending", 1, BY_ITSELF, SOLITARY, Record(1, "retry", WHY, NOW)),
    ),
    (
        BY_ITSELF,
        9,
        None,
        10,
        Reclaimed(7, "pending", 9, BY_ITSELF, SOLITARY, Record(9, "retry", WHY, NOW)),
    ),
    (
        BY_ITSELF,
        2,
        3,
        10,
        Reclaimed(7, "pending", 2, BY_ITSELF, SOLITARY, Record(2, "retry", WHY, NOW)),
    ),
    # ...dead once it has used them: its own max_attempts first, else the relay's. A replay
    # makes it a suspect in groups again.
    (BY_ITSELF, 10, None, 10, Reclaimed(7, "dead", 10, GROUP, WHY, Record(10, "dead", WHY, None))),
    (BY_ITSELF, 3, 3, 10, Reclaimed(7, "dead", 3, GROUP, WHY, Record(3, "dead", WHY, None))),
    (BY_ITSELF, 3, None, 2, Reclaimed(7, "dead", 3, GROUP, WHY, Record(3, "dead", WHY, None))),
    (BY_ITSELF, 1, 1, 10, Reclaimed(7, "dead", 1, GROUP, WHY, Record(1, "dead", WHY, None))),
]


@pytest.mark.parametrize(("suspect", "attempts", "own_max", "relay_max", "expected"), RECLAIMS)
def test_what_taking_a_lease_back_does_to_a_row(
    suspect: Suspect | None, attempts: int, own_max: int | None, relay_max: int, expected: Reclaimed
) -> None:
    leased = Leased(7, suspect, attempts, own_max)
    assert reclaim(leased, reason=WHY, max_attempts=relay_max, now=NOW) == expected


@pytest.mark.parametrize(
    ("stored", "read"),
    [
        (None, None),
        ("group", GROUP),
        ("alone", BY_ITSELF),
        # A value is known by its whole text only.
        (SOLITARY, None),
        ("Alone", None),
        ("", None),
    ],
)
def test_a_suspect_column_is_read_by_its_whole_value(
    stored: str | None, read: Suspect | None
) -> None:
    assert suspects.suspect_of(stored) is read


def test_the_texts_for_relays_of_schema_6_are_outbox_states() -> None:
    from outbox import states

    assert (GROUPED, SOLITARY, ALONE) == (
        states.STAMP_GROUPED,
        states.STAMP_SOLITARY,
        states.STAMP_ALONE,
    )


# ------------------------------------------------------------------------ reasons

REASONS: list[tuple[str, str]] = [
    (suspects.expired("r1"), "lease held by r1 expired before it settled"),
    (suspects.expired(None), "lease held by ? expired before it settled"),
    (
        suspects.earlier_run("host:42"),
        "lease held by an earlier run of host:42, which stopped before it settled",
    ),
    (
        suspects.dead_relay("r1", 3.0),
        "relay r1 stopped beating (no heartbeat for 3 s) before it settled",
    ),
    (
        suspects.dead_relay(None, 0.5),
        "relay ? stopped beating (no heartbeat for 0.5 s) before it settled",
    ),
    (suspects.crashed("r1", "boom"), "relay r1 crashed before it settled: boom"),
]


@pytest.mark.parametrize(("said", "expected"), REASONS)
def test_the_reasons(said: str, expected: str) -> None:
    assert said == expected


@pytest.mark.parametrize(
    ("value", "text"), [(3, "3"), (3.0, "3"), (0.5, "0.5"), (2.25, "2.25"), (15.0, "15")]
)
def test_seconds_are_written_as_postgresql_writes_a_float(value: float, text: str) -> None:
    assert suspects.seconds(value) == text


# ------------------------------------------------------------------------ properties

suspect = st.sampled_from([None, GROUP, BY_ITSELF])
leased = st.builds(
    Leased,
    seq=st.integers(1, 10**6),
    suspect=suspect,
    attempts=st.integers(0, 30),
    max_attempts=st.none() | st.integers(1, 30),
)
relay_max = st.integers(1, 30)


@given(leased, relay_max)
def test_a_row_is_charged_an_attempt_iff_it_was_alone(row: Leased, default: int) -> None:
    after = reclaim(row, reason=WHY, max_attempts=default, now=NOW)
    if row.suspect is BY_ITSELF:
        assert after.attempts == row.attempts
        assert after.record.outcome in ("retry", "dead")
    else:
        assert after.attempts == max(row.attempts - 1, 0)
        assert after.record.outcome == "deferred"
    assert after.attempts >= 0


@given(leased, relay_max)
def test_dead_only_alone_and_out_of_attempts(row: Leased, default: int) -> None:
    after = reclaim(row, reason=WHY, max_attempts=default, now=NOW)
    allowed = row.max_attempts if row.max_attempts is not None else default
    assert (after.state == "dead") == (row.suspect is BY_ITSELF and row.attempts >= allowed)
    assert (after.record.outcome == "dead") == (after.state == "dead")
    assert (after.record.next_attempt_at is None) == (after.state == "dead")


@given(leased, relay_max)
def test_a_reclaim_never_makes_a_suspect_less_isolated(row: Leased, default: int) -> None:
    # Every row taken back stays pending as a suspect or dies; one that was in a group or alone
    # is claimed alone next, never in a group or a batch again.
    after = reclaim(row, reason=WHY, max_attempts=default, now=NOW)
    if after.state == "pending" and row.suspect is not None:
        assert after.suspect is BY_ITSELF
    if after.state == "pending" and after.suspect is BY_ITSELF:
        assert row.suspect is not None
    # Schema 6's relays read the same in last_error: SOLITARY exactly for those claimed alone.
    assert (after.last_error == SOLITARY) == (
        after.state == "pending" and after.suspect is BY_ITSELF
    )
    assert after.last_error in (SOLITARY, WHY)
    assert after.record.error == WHY
    assert after.seq == row.seq


@given(leased, relay_max)
def test_the_record_numbers_the_attempt_the_lease_was_for(row: Leased, default: int) -> None:
    after = reclaim(row, reason=WHY, max_attempts=default, now=NOW)
    assert after.record.attempt == max(row.attempts, 1 if row.suspect is not BY_ITSELF else 0)


candidates = st.lists(
    st.builds(
        Candidate,
        seq=st.integers(1, 10**6),
        key=st.none() | st.sampled_from(["a", "b", "c"]),
        suspect=st.booleans(),
        solitary=st.booleans(),
    ).map(lambda c: Candidate(c.seq, c.key, c.suspect or c.solitary, c.solitary)),
    max_size=20,
    unique_by=lambda c: c.seq,
)


@given(candidates, st.integers(1, 30))
def test_suspects_are_never_claimed_beside_anything_else(best: list[Candidate], group: int) -> None:
    choice = choose(best, group=group)
    taken = list(choice.chosen)
    assert all(c in best for c in taken)
    assert [best.index(c) for c in taken] == sorted(best.index(c) for c in taken)  # claim order
    if any(c.solitary for c in best):
        assert taken == [next(c for c in best if c.solitary)]
        assert choice.stamp == ALONE
    elif any(c.suspect for c in best):
        assert all(c.suspect for c in taken)
        assert len(taken) == min(group, sum(c.suspect for c in best))
        assert choice.stamp == GROUPED
    else:
        assert taken == best
        assert choice.stamp is None
    assert not choice.heads or not choice.suspects
