"""Settlement: write what the broker said about each batch, where the batch's lease still holds.

The decisions are pure (relay/core/settlement.py); this runs them past the circuits, writes them
in two batched, lease-guarded statements (the confirmed rows, then the failures), logs the failures
and records the batch's metrics and span ends.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Callable

from relay.core.policy import Dead, Retry
from relay.core.settlement import Settlement, settle, triage
from relay.errors import DatabaseUnavailable
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
        """Write every batch the broker has answered; return how many were written.

        On DatabaseUnavailable the batch and those after it are kept for the next call: if a
        lease runs out first, another relay republishes (same message id), so nothing is lost.
        """
        pending, self._pending = self._pending, []
        for i, finished in enumerate(pending):
            try:
                with self._observer.loop_span("settle", messages=len(finished.outcomes)):
                    self._settle(finished, counts)
            except DatabaseUnavailable:
                self._pending[:0] = pending[i:]
                raise
        return len(pending)

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

    def _settle(self, finished: Finished, counts: Counts) -> None:
        if finished.settlement is None:
            finished.settlement = self._decide(finished)
        decided = finished.settlement
        token = finished.token
        if not finished.marked:
            published = self._store.mark_published(token, decided.published)
            finished.marked = True
            if published != len(decided.published):
                log.warning(
                    "relay.lease_lost",
                    extra={"confirmed": len(decided.published), "marked": published},
                )
            counts.published += published
        self._store.settle_failures(token, decided.failures, relay_id=self._config.relay_id)
        if decided.failures:
            _count_failures(decided.failures, counts)
        lease = self._leases.pop(token, None)
        if lease is not None:
            self._observer.settled(
                lease.rows, lease.spans, decided.published, decided.failures, self._wall()
            )


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
