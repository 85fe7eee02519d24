"""A healthy exchange beside a broken one: the relay's in-process drain of the same messages
twice, alone and with a broken neighbour, both from the run's own backlog.

Beside: one row in EVERY of the backlog (by seq, so interleaved with the others) goes to an
exchange that does not exist. Its messages fail (the broker closes their channel, 404) until its
circuit opens, after the default threshold of consecutive failures; from then on the claims pass
them by, and the healthy messages flow past them. The figure is the healthy messages over the
seconds until the last of them is marked published. Alone: the same backlog with those rows
removed, so the same healthy messages in the same order, nothing broken beside them.

The ratio of the two is what a broken neighbour costs the healthy flow: the failures before the
circuit opens, the claims passing the held rows by, a probe now and then. The integration test
(tests/integration/test_circuits.py) counts what the circuit does; the pace is judged here, on
an idle machine, against targets.BESIDE_BROKEN.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import delete, func, select, update

from benchmarks.drain import DrainResult, drain_in_process
from benchmarks.fixtures import BenchBroker, BenchDatabase
from benchmarks.results import FIGURES, Results, add_drain, say, settle
from outbox.schema import attempt, message, resource

NEIGHBOUR_ROWS = 24_000  # rows each drain starts from, at most (--messages when fewer)
EVERY = 6  # one row in EVERY goes to the broken exchange (the circuit test's 600 in 3,600)
# What the relay logs for each failure of the broken exchange's messages: this phase's purpose,
# summed up by Held, not a line each on the report's terminal.
EXPECTED = frozenset({"broker.destination_missing", "relay.retry", "relay.deferred"})


class NeighbourError(RuntimeError):
    """The drain beside the broken exchange lost, published or dead-lettered its messages."""


@dataclass(frozen=True, slots=True)
class Held:
    """What became of the broken exchange's messages by the end of the healthy drain."""

    messages: int
    states: dict[str, int]  # the rows' states
    outcomes: dict[str, int]  # their failed attempts by outcome: retry (charged), deferred (free)

    @property
    def problem(self) -> str | None:
        """Why the run is wrong, or None: every message still there, none published or dead."""
        if sum(self.states.values()) != self.messages:
            return f"{sum(self.states.values())} of {self.messages} rows left"
        if self.states.get("published") or self.states.get("dead") or self.outcomes.get("dead"):
            return f"states {self.states}, attempts {self.outcomes}"
        return None

    def describe(self) -> str:
        charged, free = self.outcomes.get("retry", 0), self.outcomes.get("deferred", 0)
        return (
            f"the broken exchange's {self.messages} messages held: {charged} attempts charged "
            f"before its circuit opened, {free} free (sent before it opened, or probes)"
        )


def prepare(db: BenchDatabase, limit: int, broken: str | None) -> tuple[int, int]:
    """The first `limit` rows of the backlog, every EVERY-th of them (by seq) sent to `broken`,
    or with None removed; no circuit and no attempt left from an earlier run. Returns the rows
    left on the healthy exchange (the same ones either way) and the rows set aside."""
    assert db.engine is not None
    db.restore(limit=limit)
    aside = func.mod(message.c.seq, EVERY) == 0
    with db.engine.begin() as conn:
        conn.execute(delete(resource))  # an earlier round's open circuit would greet this one
        conn.execute(delete(attempt))
        moved = conn.execute(select(func.count()).select_from(message).where(aside)).scalar_one()
        if broken is None:
            conn.execute(delete(message).where(aside))
        else:
            conn.execute(update(message).where(aside).values(exchange=broken))
    db.analyze()
    return db.restored - int(moved), int(moved)


def held(db: BenchDatabase, broken: str, messages: int) -> Held:
    """The states of `broken`'s `messages` rows, and every failed attempt by outcome (only its
    messages fail: the table of attempts was emptied by prepare())."""
    assert db.engine is not None
    with db.engine.connect() as conn:
        states = conn.execute(
            select(message.c.state, func.count())
            .where(message.c.exchange == broken)
            .group_by(message.c.state)
        ).all()
        outcomes = conn.execute(
            select(attempt.c.outcome, func.count()).group_by(attempt.c.outcome)
        ).all()
    return Held(
        messages, {str(s): int(n) for s, n in states}, {str(o): int(n) for o, n in outcomes}
    )


@contextlib.contextmanager
def expected_failures_unlogged() -> Iterator[None]:
    """The relay's warnings and errors on stderr, as Python prints them when nothing configured
    logging, but for the EXPECTED ones."""
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.addFilter(lambda record: record.getMessage() not in EXPECTED)
    logger = logging.getLogger("relay")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def measure(
    tag: str, args: argparse.Namespace, db: BenchDatabase, broker: BenchBroker, results: Results
) -> None:
    """Alone, then beside the broken exchange, each from the same restored backlog; the two
    rows `neighbour-alone` and `neighbour`, the second with what its neighbour's messages went
    through. The broken exchange is a name nobody declares, so there is nothing to remove."""
    limit = min(NEIGHBOUR_ROWS, db.loaded)
    broken = f"{broker.exchange}-missing"
    try:
        for key, neighbour in (("neighbour-alone", None), ("neighbour", broken)):
            healthy, aside = prepare(db, limit, neighbour)
            settle()
            say(f"{FIGURES[key]}, {healthy} messages, in-process{tag} ...")
            drain = functools.partial(
                drain_in_process, db, args.amqp, timeout=args.timeout, expected=healthy
            )
            with expected_failures_unlogged():
                r: DrainResult = broker.purged(drain, healthy, key)
            states = db.by_state()
            if states.get("published", 0) != healthy or (neighbour is None and len(states) > 1):
                raise NeighbourError(f"{key}: {states}, expected {healthy} published")
            if neighbour is not None:
                found = held(db, neighbour, aside)
                r.notes.append(found.describe())
                if found.problem is not None:
                    raise NeighbourError(f"{key}: {found.problem}")
            add_drain(results, key, r)
    finally:
        assert db.engine is not None
        with db.engine.begin() as conn:  # the open circuit is no business of the next phase
            conn.execute(delete(resource))
            conn.execute(delete(attempt))
