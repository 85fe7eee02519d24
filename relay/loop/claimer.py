"""Claiming: lease ready rows, hand them to the publisher as its window allows, and pace the
claims.

Each claim is the main claim (every resource but those with an open circuit or a rate limit),
then one probe per circuit whose cooldown is over and each rate-limited resource's share of
tokens. One limit bounds it all: the relay holds at most `max_in_flight` rows (claimed and not
settled); each claim takes what room that leaves (`claim_max` rows a statement at most). Claimed
rows go to the publisher in chunks while fewer than the window's size (below `max_in_flight`,
relay/core/window.py) are sent and not yet settled (`pump`), and the next claim is made while
one is still being sent: the broker always has work, and few messages are sent and unsettled at
any moment, so a relay killed mid-drain leaves little for the next one to send again.

A claim's hot keys come as chains, handed over whole and extended before they end
(`extend_runs`): relay/loop/chains.py. Suspects (rows whose relay died holding them) are
quarantined: relay/loop/suspects.py.

Nothing is claimed or sent while the relay's heartbeat is not fresh (`fresh`): others may be
about to take its leases over (relay/loop/pulse.py).
"""

from __future__ import annotations

import itertools
import logging
import math
import uuid
from collections import deque
from collections.abc import Callable, Sequence

from relay.core.outcome import Fate, Outcome
from relay.core.window import Window
from relay.loop import chains, suspects
from relay.loop.circuits import ResourceGuard
from relay.loop.counts import Counts
from relay.loop.leases import Answer, Chunk, Lease, Leases
from relay.loop.observer import Observer
from relay.loop.settings import LoopSettings
from relay.ports import Claimed, MalformedRow, Outgoing, Publisher, Store
from relay.reconnect import Backoff

log = logging.getLogger("relay")

# Seconds: the longest pause in claiming while the database fails (jittered: relay/reconnect.py).
DB_BACKOFF_MAX = 2.0
# Seconds the loop goes on looking again within milliseconds of work after the last claim that
# found rows no notification had announced (NOTIFY rationed by a busy writer, a writer that
# sends none, no LISTEN, a retry come due): more such rows are probably coming, and only a look
# finds them. While each row comes with its notification, the next one will too, and looks
# between notifications find nothing: with one loop per database, those looks would be most of
# what a trickle costs.
UNANNOUNCED_MEMORY = 10.0
# Rows handed to the publisher at a time: small enough that confirms come back (and are marked)
# continuously, several to a window; large enough that handing over costs little.
CHUNK_MAX = 64


def _always_fresh(_now: float) -> bool:
    return True


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
        answered: Callable[[Answer], None],  # takes a chunk's answer (in Publisher.wait)
        clock: Callable[[], float],
        fresh: Callable[[float], bool] = _always_fresh,  # the heartbeat allows claims
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._config = config
        self._guard = guard
        self._observer = observer
        self._leases = leases
        self._answered = answered
        self._clock = clock
        self._fresh = fresh
        self._next_claim = 0.0
        self._empty = 0  # consecutive claims that found nothing
        self._notified = 0  # notifications since the last claim that found rows
        self._unannounced_at = -math.inf  # the last claim that found rows none announced
        self._db_backoff = Backoff(first=0.1, cap=DB_BACKOFF_MAX, floor=0.05)
        self._db_retry_at = 0.0  # the end of the pause after a database failure
        self._chunks = itertools.count(1)
        # Sent and not yet settled, at most: sized to the broker's confirm round, under
        # max_in_flight (relay/core/window.py).
        self.window = Window(config.max_in_flight)

    # ----------------------------------------------------------------- pacing

    def claim_soon(self) -> None:
        """Claim at the next turn (a notification, or a settlement that may have freed rows)."""
        self._next_claim = 0.0
        self._empty = 0

    def notified(self) -> None:
        """A notification (LISTEN): a message was committed. Claim at the next turn."""
        self._notified += 1
        self.claim_soon()

    def back_off(self) -> float:
        """The database failed: pause claiming, longer each time (jittered), until a claim
        succeeds. Returns the pause."""
        wait = self._db_backoff.failed()
        self._next_claim = self._db_retry_at = self._clock() + wait
        return wait

    def resting(self, now: float) -> bool:
        """Whether the database failed and its pause has not run out: the loop's other writes
        (settling) wait for it too, rather than fail, and be logged, at every turn."""
        return self._db_backoff.attempt > 0 and now < self._db_retry_at

    @property
    def db_attempt(self) -> int:
        """Database failures in a row, since the last claim that succeeded."""
        return self._db_backoff.attempt

    def next_turn(self, now: float) -> float:
        """The clock time the loop should next call `claim` (an outcome wakes it sooner)."""
        config, publisher = self._config, self._publisher
        if not publisher.ready:
            return now + 0.1
        leases = self._leases
        if (
            publisher.blocked
            or suspects.quarantined(leases)  # a settlement (an inbox event) moves it on
            or leases.in_flight >= config.max_in_flight
            or leases.unsent >= config.claim_max  # the window is full: an answer frees it
            or not self._fresh(now)  # the heartbeat wakes the loop when it is fresh again
        ):
            # Nothing to claim until an answer comes, the broker unblocks or the heartbeat is
            # fresh (each of those ends the wait early). Returning `now` here would spin.
            return now + config.poll_interval
        until = max(self._next_claim, now)
        tokens_due = self._guard.next_token_due()
        if tokens_due is not None:  # a rate-limited resource may draw tokens again then
            until = min(until, max(tokens_due, now + config.min_poll_interval))
        return until

    # ----------------------------------------------------------------- claims

    def claim(self, counts: Counts, now: float) -> None:
        """Claim as much as there is room for, if a claim is due. May raise DatabaseUnavailable."""
        publisher, config, leases = self._publisher, self._config, self._leases
        if not publisher.ready or now < self._next_claim:
            return
        if publisher.blocked:
            return  # the broker is pushing back (resource alarm): claim nothing new
        if not self._fresh(now):
            return
        if suspects.quarantined(leases):
            self.pump(now)  # they go once what was in flight beside them has settled
            return
        if leases.unsent >= config.claim_max:
            return  # a claim waits for the window already: claim the next as it goes out
        room = config.max_in_flight - leases.in_flight
        limit = min(config.claim_max, room)
        if limit <= 0:
            return
        guard = self._guard
        guard.refresh()
        # Hot keys' runs come on top of the heads: within the room, as much again at most.
        follow = min(limit, room - limit)
        claimed = self._claim(counts, limit, now, exclude=guard.exclude(), follow=follow)
        quarantined = suspects.quarantined(leases)  # suspects were claimed: nothing else
        counts.full_batch = claimed == limit and not quarantined
        if not quarantined:
            claimed += self._claim_guarded(counts, room - claimed, now)
        self._db_backoff.succeeded()
        if claimed:
            if claimed > self._notified:
                self._unannounced_at = now
            self._notified = 0
            self._empty = 0
            if claimed == limit:
                return  # a full batch: claim again at once
        self._next_claim = now + self._next_look(config, now)

    def _next_look(self, config: LoopSettings, now: float) -> float:
        """How long after a claim that took all there was to look again (a notification, or a
        settlement that may have freed a key's next message, ends the wait sooner).

        While rows come that no notification announced: right after work the shortest wait,
        each look that finds nothing twice as long, up to poll_interval (a look at once would
        find nothing, and cost a query while the confirms come in). Otherwise poll_interval:
        looks between notifications would find nothing either."""
        if now - self._unannounced_at >= UNANNOUNCED_MEMORY:
            return config.poll_interval
        wait = min(config.poll_interval, config.min_poll_interval * 2.0**self._empty)
        self._empty = min(self._empty + 1, 30)
        return wait

    def _claim(
        self,
        counts: Counts,
        limit: int,
        now: float,
        *,
        exclude: Sequence[str] = (),
        only: str | None = None,
        follow: int = 0,
    ) -> int:
        """Claim `limit` rows at most, and `follow` more in hot keys' runs. Returns how many."""
        token = uuid.uuid4()
        with self._observer.loop_span("claim", limit=limit) as span:
            started = self._clock()
            rows = self._store.claim(
                owner=self._config.relay_id,
                token=token,
                limit=limit,
                lease_seconds=self._config.lease_seconds,
                exclude=exclude,
                only=only,
                suspect_group=suspects.SUSPECT_GROUP,
                # A probe or a rate limit's share is counted in messages: no runs there.
                run=chains.RUN if follow > 0 else 0,
                follow=follow,
            )
            self._observer.claim_took(self._clock() - started)
            if span is not None:
                span.set_attribute("outbox.claimed", len(rows))
        if rows:
            counts.claimed += len(rows)
            self._observer.claimed(len(rows))
            self._hold(token, rows, now)
        return len(rows)

    def _claim_guarded(self, counts: Counts, room: int, now: float) -> int:
        """Claims the main claim passes by: one probe per circuit whose cooldown is over (the
        relay that wins it), and each rate-limited resource's share of tokens."""
        guard, leases = self._guard, self._leases
        claimed = 0
        for part in guard.probes_due():
            if claimed >= room or suspects.quarantined(leases):
                return claimed
            # Only probe with a message in hand: an idle resource keeps its circuit open (its
            # cooldown over), and its next message is the probe.
            if self._store.has_ready(part) and guard.try_probe(part):
                got = self._claim(counts, 1, now, only=part)
                if not got:
                    guard.probe_found_nothing(part)
                claimed += got
        for part in guard.rate_parts_due():
            want = min(self._config.claim_max, room - claimed)
            if want <= 0 or suspects.quarantined(leases):
                break
            granted = guard.take_tokens(part, want)
            if granted:
                got = self._claim(counts, granted, now, only=part)
                guard.refund(part, granted - got)
                claimed += got
        return claimed

    def _hold(self, token: uuid.UUID, rows: list[Claimed], now: float) -> None:
        singles, runs = chains.split(rows)
        self._leases[token] = Lease(
            token,
            {r.seq: r for r in rows},
            now,
            unsent=deque(singles),
            chains=runs,
            tails=chains.tails(runs),
            suspect=suspects.claimed_apart(rows),
        )
        self.pump(now)

    def extend_runs(self, counts: Counts, now: float) -> None:
        """Claim the next run of every chain that came full and is about to run out, under the
        chain's own lease (chains.extend). May raise DatabaseUnavailable."""
        publisher, config, leases = self._publisher, self._config, self._leases
        if not publisher.ready or publisher.blocked or not self._fresh(now):
            return
        if suspects.quarantined(leases):
            return  # nothing else goes until the suspects settle
        exclude: Sequence[str] | None = None

        def claim_run(lease: Lease, tail: int, limit: int) -> list[Claimed]:
            nonlocal exclude
            if exclude is None:
                exclude = self._guard.exclude()
            with self._observer.loop_span("claim", limit=limit) as span:
                rows = self._store.claim_run(
                    owner=config.relay_id,
                    token=lease.token,
                    after=tail,
                    limit=limit,
                    lease_seconds=config.lease_seconds,
                    exclude=exclude,
                )
                if span is not None:
                    span.set_attribute("outbox.claimed", len(rows))
            if rows:
                counts.claimed += len(rows)
                self._observer.claimed(len(rows))
            return rows

        chains.extend(
            leases, room=lambda: config.max_in_flight - leases.in_flight, claim_run=claim_run
        )

    # ----------------------------------------------------------------- sending

    def pump(self, now: float) -> None:
        """Hand claimed rows to the publisher, in claim order, while fewer than the window
        (relay/core/window.py) are sent and not yet written. Suspects go only once nothing else
        is in flight.

        Chains go first, each taking one chunk, and are held to the window's ceiling only, not
        to its size: a chain's chunk takes one broker confirm per message, so its round is long
        by design, not because the broker queues; held to a window sized by rounds, many keys'
        chains would shrink it, and so their own number in flight, to its floor."""
        publisher, leases, window = self._publisher, self._leases, self.window
        if not publisher.ready or publisher.blocked or not self._fresh(now):
            return
        sending = leases.sending
        if sending < window.ceiling:
            left = chains.hand_over(
                leases.values(),
                window.ceiling - sending,
                max(1, min(chains.CHUNK, window.ceiling)),  # what a chain takes
                lambda lease, chunk, key: self._publish(lease, chunk, now, chain=key),
            )
            sending = window.ceiling - left
        room = window.size - sending  # each hand-over below takes its rows from it
        if room > 0:
            chunk = max(1, min(CHUNK_MAX, window.size // 4))
            for lease in list(leases.values()):
                if not lease.unsent:
                    continue
                if not suspects.may_send(lease, leases):
                    break  # quarantined, and claimed last: everything before it settles first
                while lease.unsent and room > 0:
                    n = min(chunk, room, len(lease.unsent))
                    self._publish(lease, [lease.unsent.popleft() for _ in range(n)], now)
                    room -= n
                if room <= 0:
                    break
            window.in_flight(window.size - room)
        if room <= 0 and leases.unsent:
            window.held_back()  # rows to send side by side wait for the window

    def written(self, messages: int, now: float) -> None:
        """`messages` outcomes were just written: the window measures its rate by them."""
        window = self.window
        before = window.size
        window.written(messages, now)
        if window.size != before and log.isEnabledFor(logging.DEBUG):
            epoch = window.last
            extra = {"size": window.size, "was": before,
                     "rate": None if epoch is None else round(epoch.rate)}  # fmt: skip
            log.debug("relay.window", extra=extra)

    def _publish(
        self, lease: Lease, rows: list[Claimed], now: float, *, chain: str | None = None
    ) -> bool:
        """Hand `rows` over; False when a chain's row cannot be built (it is dead-lettered as
        malformed, and the chain ends before it: the rest of the chunk is held back)."""
        if lease.sent_at is None:
            lease.sent_at = now
        token, number = lease.token, next(self._chunks)
        lease.chunks[number] = Chunk([row.seq for row in rows], now, chain=chain)
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
        answered = self._answered
        # Settling a keyed message may let its key's next one be claimed; an unkeyed one lets
        # nothing be claimed that a claim would not have taken already.
        frees = any(row.key is not None for row in rows)

        def done(outcomes: list[Outcome]) -> None:
            answered(Answer(token, outcomes + broken, number, frees=frees))

        if chain is not None and broken:
            broken, items = chains.cut(rows, items, broken)  # the rows after it are held back
        if items:
            with observer.loop_span("publish", messages=len(items)):
                self._publisher.publish(
                    items, done, chain=None if chain is None else (lease.token, chain)
                )
        else:
            done([])
        return chain is None or not broken
