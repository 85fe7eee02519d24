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

from relay.core.policy import Dead, Retry
from relay.core.settlement import Settlement, settle, triage
from relay.loop.circuits import ResourceGuard
from relay.loop.counts import Counts
from relay.loop.leases import Finished, Leases
from relay.loop.observer import Observer
from relay.loop.settings import LoopSettings
from relay.ports import Store

log = logging.getLogger("relay")


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
        self._pending: list[Finished] = []

    def add(self, finished: Finished) -> None:
        self._pending.append(finished)

    def settle(self, counts: Counts) -> int:
        """Write every chunk the broker has answered; return how many of those were written
        that may let new rows be claimed (Finished.frees).

        On DatabaseUnavailable what is not written yet is kept for the next call (each chunk
        remembers how far it got): if a lease runs out first, another relay republishes (same
        message id), so nothing is lost.
        """
        pending, self._pending = self._pending, []
        if not pending:
            return 0
        try:
            with self._observer.loop_span("settle", messages=sum(len(f.outcomes) for f in pending)):
                for finished in pending:
                    if finished.settlement is None:
                        finished.settlement = self._decide(finished)
                self._mark(pending, counts)
                for finished in pending:
                    self._write_failures(finished, counts)
        finally:
            self._pending[:0] = [f for f in pending if not f.written]
            for finished in pending:
                if finished.written:
                    self._done(finished)
        return sum(1 for f in pending if f.frees and f.written)

    def _decide(self, finished: Finished) -> Settlement:
        lease = self._leases.get(finished.token)
        config, guard = self._config, self._guard
        triaged = triage(
            finished.outcomes,
            lease.rows if lease is not None else {},
            part=guard.naming.part,
            permanent=config.policy.permanent,
        )
        # The circuits count first: whether a failure burns an attempt depends on its circuit.
        burns = guard.record(triaged.circuits, finished.burns) if triaged.circuits else {}
        return settle(triaged, burns, policy=config.policy, now=self._wall(), rng=self._rng)

    def _mark(self, pending: list[Finished], counts: Counts) -> None:
        """Mark the confirmed rows of every chunk not marked yet: one statement per lease."""
        by_token: dict[uuid.UUID, list[Finished]] = {}
        for finished in pending:
            if not finished.marked:
                by_token.setdefault(finished.token, []).append(finished)
        for token, chunks in by_token.items():
            seqs = [seq for f in chunks for seq in _decided(f).published]
            if seqs:
                marked = self._store.mark_published(token, seqs)
                if marked != len(seqs):
                    lost = {"confirmed": len(seqs), "marked": marked}
                    log.warning("relay.lease_lost", extra=lost)
                counts.published += marked
            for finished in chunks:
                finished.marked = True

    def _write_failures(self, finished: Finished, counts: Counts) -> None:
        if finished.failures_written:
            return
        failures = _decided(finished).failures
        if failures:
            self._store.settle_failures(finished.token, failures, relay_id=self._config.relay_id)
            _count_failures(failures, counts)
        finished.failures_written = True

    def _done(self, finished: Finished) -> None:
        """The chunk's rows leave its lease (the lease goes with its last row)."""
        lease = self._leases.get(finished.token)
        if lease is None:
            return  # given back meanwhile
        lease.chunks.pop(finished.chunk, None)  # its room in the window is free again
        rows, spans = {}, {}
        for outcome in finished.outcomes:
            row = lease.rows.pop(outcome.ref, None)
            if row is not None:
                rows[outcome.ref] = row
            span = lease.spans.pop(outcome.ref, None)
            if span is not None:
                spans[outcome.ref] = span
        decided = _decided(finished)
        self._observer.settled(rows, spans, decided.published, decided.failures, self._wall())
        if not lease.rows:
            del self._leases[finished.token]


def _decided(finished: Finished) -> Settlement:
    assert finished.settlement is not None, "decided before it is written"
    return finished.settlement


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
        else:
            counts.retried += len(group)
            log.warning(f"relay.{kind}", extra=extra)
