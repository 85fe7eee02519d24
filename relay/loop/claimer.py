"""Claiming: lease ready rows and hand them to the publisher, and pace the claims.

Each claim is the main claim (every resource but those with an open circuit or a rate limit),
then one probe per circuit whose cooldown is over and each rate-limited resource's share of
tokens. Claims are pipelined: while one batch waits for its confirms the next is claimed and
published, up to `max_in_flight` messages.

A suspect (a row whose relay died holding it; the store claims one alone) is quarantined: it is
published only once nothing else is in flight, and nothing else is claimed until it settles. If
it kills this relay too, it is the only row that dies with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from relay.core.outcome import Fate, Outcome
from relay.loop.circuits import ResourceGuard
from relay.loop.counts import Counts
from relay.loop.leases import Finished, Lease, Leases
from relay.loop.observer import Observer
from relay.loop.settings import LoopSettings
from relay.ports import Claimed, MalformedRow, Outgoing, Publisher, Store

DB_BACKOFF_MAX = 5.0  # seconds: the longest pause in claiming while the database fails


class Claimer:
    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        config: LoopSettings,
        *,
        guard: ResourceGuard,
        observer: Observer,
        leases: Leases,
        finished: Callable[[Finished], None],  # takes outcomes, from the publisher's thread
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._config = config
        self._guard = guard
        self._observer = observer
        self._leases = leases
        self._finished = finished
        self._clock = clock
        self._next_claim = 0.0
        self._empty = 0  # consecutive claims that found nothing
        self._db_backoff = 0.0
        self._suspect: Lease | None = None  # a quarantined suspect, sent or waiting to be

    # ----------------------------------------------------------------- pacing

    def claim_soon(self) -> None:
        """Claim at the next turn (a notification, or a settlement that may have freed rows)."""
        self._next_claim = 0.0
        self._empty = 0

    def back_off(self) -> None:
        """The database failed: pause claiming, longer each time, until a claim succeeds."""
        self._db_backoff = min(DB_BACKOFF_MAX, max(0.1, self._db_backoff * 2))
        self._next_claim = self._clock() + self._db_backoff

    def next_turn(self, now: float) -> float:
        """The clock time the loop should next call `claim` (an outcome wakes it sooner)."""
        config, publisher = self._config, self._publisher
        if not publisher.ready:
            return now + 0.1
        if (
            publisher.blocked
            or self._suspect is not None  # a settlement (an inbox event) moves it on
            or self._leases.in_flight >= config.max_in_flight
        ):
            # Nothing to claim until a batch settles or the broker unblocks. Returning `now`
            # here would spin and starve the publisher thread of the GIL.
            return now + config.poll_interval
        until = max(self._next_claim, now)
        tokens_due = self._guard.next_token_due()
        if tokens_due is not None:  # a rate-limited resource may draw tokens again then
            until = min(until, max(tokens_due, now + config.min_poll_interval))
        return until

    # ----------------------------------------------------------------- claims

    def claim(self, counts: Counts, now: float) -> None:
        """Claim as much as there is room for, if a claim is due. May raise DatabaseUnavailable."""
        publisher, config = self._publisher, self._config
        if not publisher.ready or now < self._next_claim:
            return
        if publisher.blocked:
            return  # the broker is pushing back (resource alarm): claim nothing new
        if self._quarantined(now):
            return
        room = config.max_in_flight - self._leases.in_flight
        limit = min(config.batch_size, room)
        if limit <= 0:
            return
        guard = self._guard
        guard.refresh()
        claimed = self._claim(counts, limit, now, exclude=guard.exclude())
        counts.full_batch = claimed == limit and self._suspect is None
        if self._suspect is None:
            claimed += self._claim_guarded(counts, room - claimed, now)
        self._db_backoff = 0.0
        if claimed:
            self._empty = 0
            return
        # Adaptive polling: right after work, look again within milliseconds (more is probably
        # coming); each empty look doubles the wait, up to poll_interval.
        wait = min(config.poll_interval, config.min_poll_interval * 2**self._empty)
        self._empty = min(self._empty + 1, 30)
        self._next_claim = now + wait

    def _claim(
        self,
        counts: Counts,
        limit: int,
        now: float,
        *,
        exclude: Sequence[str] = (),
        only: str | None = None,
    ) -> int:
        token = uuid.uuid4()
        with self._observer.loop_span("claim", limit=limit) as span:
            rows = self._store.claim(
                owner=self._config.relay_id,
                token=token,
                limit=limit,
                lease_seconds=self._config.lease_seconds,
                exclude=exclude,
                only=only,
            )
            if span is not None:
                span.set_attribute("outbox.claimed", len(rows))
        if rows:
            counts.claimed += len(rows)
            self._observer.claimed(len(rows))
            self._send(token, rows, now)
        return len(rows)

    def _claim_guarded(self, counts: Counts, room: int, now: float) -> int:
        """Claims the main claim passes by: one probe per circuit whose cooldown is over (the
        relay that wins it), and each rate-limited resource's share of tokens."""
        guard = self._guard
        claimed = 0
        for part in guard.probes_due():
            if claimed >= room or self._suspect is not None:
                return claimed
            # Only probe with a message in hand: an idle resource keeps its circuit open (its
            # cooldown over), and its next message is the probe.
            if self._store.has_ready(part) and guard.try_probe(part):
                got = self._claim(counts, 1, now, only=part)
                if not got:
                    guard.probe_found_nothing(part)
                claimed += got
        for part in guard.rate_parts_due():
            want = min(self._config.batch_size, room - claimed)
            if want <= 0 or self._suspect is not None:
                break
            granted = guard.take_tokens(part, want)
            if granted:
                got = self._claim(counts, granted, now, only=part)
                guard.give_back(part, granted - got)
                claimed += got
        return claimed

    def _quarantined(self, now: float) -> bool:
        """Whether a suspect holds claiming: it waits for the rest to settle, then goes alone."""
        lease = self._suspect
        if lease is None:
            return False
        if self._leases.get(lease.token) is not lease:  # settled, or given back
            self._suspect = None
            return False
        if lease.sent_at is None and self._leases.in_flight == len(lease.rows):
            self._publish(lease, now)
        return True

    def _send(self, token: uuid.UUID, rows: list[Claimed], now: float) -> None:
        lease = self._leases[token] = Lease(token, {r.seq: r for r in rows}, now)
        if len(rows) == 1 and rows[0].suspect:  # the store claims a suspect alone
            lease.suspect = True
            self._suspect = lease
            self._quarantined(now)  # at once if nothing else is in flight
            return
        self._publish(lease, now)

    def _publish(self, lease: Lease, now: float) -> None:
        lease.sent_at = now
        token, rows = lease.token, list(lease.rows.values())
        items: list[Outgoing] = []
        broken: list[Outcome] = []
        encode = self._publisher.encode
        observer = self._observer
        traced = observer.tracer is not None
        for row in rows:
            try:
                if traced:
                    span, parent, state = observer.start_send(row)
                    if span is not None:
                        lease.spans[row.seq] = span
                    items.append(encode(row, traceparent=parent, tracestate=state))
                else:
                    items.append(encode(row))
            except MalformedRow as exc:
                broken.append(
                    Outcome(row.seq, Fate.NOT_SENT, f"malformed row: {exc}", malformed=True)
                )
        finished = self._finished

        def done(outcomes: list[Outcome]) -> None:
            finished(Finished(token, outcomes + broken))

        if items:
            with observer.loop_span("publish", messages=len(items)):
                self._publisher.publish(items, done)
        else:
            done([])
