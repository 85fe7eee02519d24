"""Settlement: write what the broker said about each chunk, where its lease still holds.

The decisions are pure (relay/core/settlement.py); this runs them past the circuits and writes
them lease-guarded: the confirmed rows of every chunk answered since the last pass in one UPDATE
per lease, so rows are marked published as their confirms arrive (a relay killed a moment later
leaves few confirmed rows unmarked to be published again), then the failures. It logs the
failures and records the metrics and span ends.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relay.core.failures import FailureClass
from relay.core.policy import Dead, Retry
from relay.core.settlement import Settlement, Triage, decisions, triage
from relay.loop.circuits import ResourceGuard
from relay.loop.counts import Counts
from relay.loop.leases import Answer, Leases
from relay.loop.observer import Observer
from relay.loop.settings import LoopSettings
from relay.ports import Holder, Store

log = logging.getLogger("relay")


@dataclass(slots=True, eq=False)
class _Writing:
    """A chunk's outcomes being written, and how far that got: each step is done once, so a
    database failure half way through takes up where it stopped at the next pass."""

    answer: Answer
    holder: Holder  # where its rows are settled (the lease's)
    # Decided once (the circuits have counted these outcomes), kept if the database fails.
    settlement: Settlement | None = None
    # What the circuits answered so far, per resource part: a part already counted is not
    # counted again when the database fails half way through and the chunk is decided again.
    burns: dict[str, list[bool]] = field(default_factory=dict)
    marked: bool = False  # confirmed rows already marked
    failures_written: bool = False  # failure decisions already written

    @property
    def written(self) -> bool:
        return self.marked and self.failures_written

    @property
    def decided(self) -> Settlement:
        assert self.settlement is not None, "decided before it is written"
        return self.settlement


class Settler:
    def __init__(
        self,
        store: Store,
        config: LoopSettings,
        *,
        guard: ResourceGuard,
        observer: Observer,
        leases: Leases,
        wall: Callable[[], dt.datetime],
        rng: random.Random,
    ) -> None:
        self._store = store
        self._config = config
        self._guard = guard
        self._observer = observer
        self._leases = leases
        self._wall = wall
        self._rng = rng
        self._pending: list[_Writing] = []
        # (exchange, routing key) -> when first and last seen unroutable, while it lasts: the
        # grace for unroutable messages counts from the first (relay/core/policy.py).
        self._unroutable: dict[tuple[str, str], tuple[dt.datetime, dt.datetime]] = {}

    def add(self, answer: Answer) -> None:
        lease = self._leases.get(answer.token)
        holder = self._store if lease is None or lease.holder is None else lease.holder
        self._pending.append(_Writing(answer, holder))

    def settle(self, counts: Counts) -> int:
        """Write every chunk the broker has answered; return how many of those were written
        that may let new rows be claimed (Answer.frees).

        On DatabaseUnavailable what is not written yet is kept for the next call (each chunk
        remembers how far it got): if a lease runs out first, another relay republishes (same
        message id), so nothing is lost.
        """
        pending, self._pending = self._pending, []
        if not pending:
            return 0
        try:
            messages = sum(len(w.answer.outcomes) for w in pending)
            with self._observer.loop_span("settle", messages=messages):
                for writing in pending:
                    if writing.settlement is None:
                        writing.settlement = self._decide(writing)
                self._mark(pending, counts)
                for writing in pending:
                    self._write_failures(writing, counts)
        finally:
            self._pending[:0] = [w for w in pending if not w.written]
            for writing in pending:
                if writing.written:
                    self._done(writing)
        return sum(1 for w in pending if w.answer.frees and w.written)

    def _decide(self, writing: _Writing) -> Settlement:
        answer = writing.answer
        lease = self._leases.get(answer.token)
        config, guard = self._config, self._guard
        triaged = triage(
            answer.outcomes,
            lease.rows if lease is not None else {},
            part=guard.naming.part,
            permanent=config.policy.permanent,
        )
        # The circuits count first: whether a failure burns an attempt depends on its circuit.
        burns = guard.record(triaged.circuits, writing.burns) if triaged.circuits else {}
        now = self._wall()
        since = self._track_unroutable(triaged, now)
        return decisions(
            triaged, burns, policy=config.policy, now=now, rng=self._rng, unroutable_since=since
        )

    def _track_unroutable(self, triaged: Triage, now: dt.datetime) -> dict[tuple[str, str], Any]:
        """Note the destinations seen unroutable (logged once each, when first seen) and forget
        those that routed again or have not been seen for a grace period; return when each
        still unroutable was first seen."""
        seen = self._unroutable
        unroutable = {
            (f.row.exchange, f.row.routing_key)
            for f in triaged.failed
            if f.failure.cls is FailureClass.UNROUTABLE
        }
        if seen and triaged.published:
            routed = {(r.exchange, r.routing_key) for r in triaged.confirmed}
            for pair in routed - unroutable:
                seen.pop(pair, None)
        if not unroutable:
            return {pair: first for pair, (first, _) in seen.items()}
        grace = self._config.policy.unroutable_grace
        stale = now - dt.timedelta(seconds=grace)
        for pair in [p for p, (_, last) in seen.items() if last < stale]:
            del seen[pair]  # not seen for a grace period: a new episode starts afresh
        for pair in unroutable:
            first = seen[pair][0] if pair in seen else None
            if (
                first is None
                and grace > 0
                and FailureClass.UNROUTABLE in self._config.policy.permanent
            ):
                log.warning(
                    "relay.unroutable_waiting",
                    extra={"exchange": pair[0], "routing_key": pair[1], "grace_s": grace},
                )
            seen[pair] = (first or now, now)
        return {pair: first for pair, (first, _) in seen.items()}

    def _mark(self, pending: list[_Writing], counts: Counts) -> None:
        """Mark the confirmed rows of every chunk not marked yet: one statement per lease."""
        by_token: dict[uuid.UUID, list[_Writing]] = {}
        for writing in pending:
            if not writing.marked:
                by_token.setdefault(writing.answer.token, []).append(writing)
        for token, chunks in by_token.items():
            seqs = [seq for w in chunks for seq in w.decided.published]
            if seqs:
                marked = chunks[0].holder.mark_published(token, seqs)
                if marked != len(seqs):
                    lost = {"confirmed": len(seqs), "marked": marked}
                    log.warning("relay.lease_lost", extra=lost)
                counts.published += marked
            for writing in chunks:
                writing.marked = True

    def _write_failures(self, writing: _Writing, counts: Counts) -> None:
        if writing.failures_written:
            return
        failures = writing.decided.failures
        if failures:
            token = writing.answer.token
            writing.holder.settle_failures(token, failures, relay_id=self._config.relay_id)
            _count_failures(failures, counts)
        writing.failures_written = True

    def _done(self, writing: _Writing) -> None:
        """The chunk's rows leave its lease (the lease goes with its last row)."""
        answer = writing.answer
        lease = self._leases.get(answer.token)
        if lease is None:
            return  # released meanwhile
        lease.chunks.pop(answer.chunk, None)  # its room in the window is free again
        rows, spans = {}, {}
        for outcome in answer.outcomes:
            row = lease.rows.pop(outcome.seq, None)
            if row is not None:
                rows[outcome.seq] = row
            span = lease.spans.pop(outcome.seq, None)
            if span is not None:
                spans[outcome.seq] = span
        decided = writing.decided
        self._observer.settled(rows, spans, decided.published, decided.failures, self._wall())
        if not lease.rows:
            del self._leases[answer.token]


def _count_failures(failures: list[Retry | Dead], counts: Counts) -> None:
    """Count the failures, and log them once per kind and failure class."""
    groups: dict[tuple[str, str], list[Retry | Dead]] = {}
    for d in failures:
        groups.setdefault((d.kind, d.failure.cls.value), []).append(d)
    for (kind, cls), group in groups.items():
        counts.failures[cls] = counts.failures.get(cls, 0) + len(group)
        first = group[0]
        detail = first.reason if isinstance(first, Dead) else first.failure.detail
        extra = {"count": len(group), "class": cls, "error": detail}
        if kind == "dead":
            counts.dead += len(group)
            log.error("relay.dead_lettered", extra=extra)
        elif kind == "deferred":
            counts.deferred += len(group)
            if cls != FailureClass.UNROUTABLE.value:
                # An unroutable destination is logged once (relay.unroutable_waiting).
                log.warning("relay.deferred", extra=extra)
        else:
            counts.retried += len(group)
            log.warning("relay.retry", extra=extra)
