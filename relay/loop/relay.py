"""The relay loop: claim ready rows, hand them to the publisher, settle what the broker confirmed.

`run_once()` does one non-blocking pass and says what it did; `run()` only loops and waits, and
every wait ends early on a stop request. Claims are pipelined: while one batch waits for its
confirms, the next is already claimed and published, up to `max_in_flight` messages.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import queue
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from opentelemetry.trace import Span

from relay.amqp.publisher import Done, Outgoing
from relay.amqp.wire import MalformedRow, to_outgoing
from relay.core.circuit import is_resource_failure
from relay.core.failures import Classified, classify
from relay.core.outcome import Fate, Outcome
from relay.core.policy import Attempted, Dead, Publish, Retry, decide
from relay.errors import DatabaseUnavailable
from relay.loop.circuits import ResourceGuard
from relay.loop.maintenance import RetentionPolicy
from relay.loop.observer import Observer
from relay.ports import Claimed, Store
from relay.runtime.config import RelayConfig
from relay.runtime.telemetry import Telemetry

log = logging.getLogger("relay")


def _kind(decision: Retry | Dead) -> str:
    """How a failed attempt ended: dead, retry (an attempt burned) or deferred (none burned)."""
    if isinstance(decision, Dead):
        return "dead"
    return "retry" if decision.burn else "deferred"


class PublisherPort(Protocol):
    ready: bool
    blocked: bool

    def start(self, timeout: float = ...) -> None: ...
    def publish(self, items: Sequence[Outgoing], done: Done) -> None: ...
    def stop(self, timeout: float = ...) -> None: ...


@dataclass(slots=True)
class _Lease:
    token: uuid.UUID
    rows: dict[int, Claimed]
    extended_at: float
    spans: dict[int, Span] = field(default_factory=dict)  # send spans, when tracing is on


@dataclass(slots=True)
class _Finished:
    token: uuid.UUID
    outcomes: list[Outcome]
    marked: bool = False  # confirmed rows already marked (the failures may still be pending)
    # Decided once (the circuits have counted these outcomes), kept if the database fails.
    confirmed: list[int] | None = None
    failures: list[Retry | Dead] | None = None


_STOP = object()
_WAKE = object()


@dataclass(slots=True)
class PassResult:
    """What one pass of the loop did."""

    claimed: int = 0
    published: int = 0
    retried: int = 0
    dead: int = 0
    reclaimed: int = 0
    full_batch: bool = False


@dataclass(slots=True)
class RunSummary:
    claimed: int = 0
    published: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    reclaimed: int = 0
    errors: int = 0
    drained: bool = True
    failures: dict[str, int] = field(default_factory=dict)  # by failure class


class Relay:
    def __init__(
        self,
        store: Store,
        publisher: PublisherPort,
        config: RelayConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        rng: random.Random | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.config = config
        self._clock = clock
        self._wall = wall
        self._rng = rng or random.Random()
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._leases: dict[uuid.UUID, _Lease] = {}
        self._unsettled: list[_Finished] = []
        self._stopping = False
        self._next_claim = 0.0
        self._empty = 0  # consecutive claims that found nothing
        self._next_reclaim = 0.0
        self._next_sweep = 0.0
        self._next_retention = 0.0
        self._db_backoff = 0.0
        self.summary = RunSummary()
        self.guard = ResourceGuard(store, config, clock=clock, wall=wall, rng=self._rng)
        self.observer = Observer(
            telemetry or Telemetry(), store=store, circuits=self.guard.states, clock=clock
        )
        self.guard.on_transition = self.observer.circuit_changed
        self.heartbeat = clock()  # when the loop last turned (for /healthz)

    # ----------------------------------------------------------------- control

    def request_stop(self) -> None:
        """Ask the loop to drain and stop. Safe from a signal handler (SimpleQueue.put is)."""
        self._inbox.put(_STOP)

    def wake(self) -> None:
        """A message was committed: claim now instead of at the next poll."""
        self._inbox.put(_WAKE)

    @property
    def in_flight(self) -> int:
        """Rows this relay holds under lease: claimed and not yet settled (a handful of
        batches, so summing is cheaper than keeping a counter in step)."""
        return sum(len(lease.rows) for lease in self._leases.values())

    # ----------------------------------------------------------------- one pass

    def run_once(self) -> PassResult:
        result = PassResult()
        now = self._clock()
        self._settle_finished(result)
        if now >= self._next_reclaim:
            self._next_reclaim = now + self.config.reclaim_interval
            self._maintain_leases(result, now)
        retention = self.config.retention
        if retention is not None and not self._stopping and now >= self._next_retention:
            self._purge_expired(retention, now)
        if self._stopping or not self.publisher.ready or now < self._next_claim:
            return result
        if self.publisher.blocked:
            return result  # the broker is pushing back (resource alarm): claim nothing new
        room = self.config.max_in_flight - self.in_flight
        limit = min(self.config.batch_size, room)
        if limit <= 0:
            return result
        try:
            self.guard.refresh()
            claimed = self._claim(limit, now, exclude=self.guard.exclude())
            result.full_batch = claimed == limit
            claimed += self._claim_guarded(room - claimed, now)
        except DatabaseUnavailable as exc:
            self._db_failed("claim", exc)
            return result
        self._db_backoff = 0.0
        result.claimed = claimed
        if not claimed:
            # Adaptive polling: right after work, look again within milliseconds (more is
            # probably coming); each empty look doubles the wait, up to poll_interval.
            wait = min(self.config.poll_interval, self.config.min_poll_interval * 2**self._empty)
            self._empty = min(self._empty + 1, 30)
            self._next_claim = now + wait
            return result
        self._empty = 0
        return result

    def _claim(
        self, limit: int, now: float, *, exclude: Sequence[str] = (), only: str | None = None
    ) -> int:
        token = uuid.uuid4()
        with self.observer.loop_span("claim", limit=limit) as span:
            rows = self.store.claim(
                owner=self.config.relay_id,
                token=token,
                limit=limit,
                lease_seconds=self.config.lease_seconds,
                exclude=exclude,
                only=only,
            )
            if span is not None:
                span.set_attribute("outbox.claimed", len(rows))
        if rows:
            self.observer.claimed(len(rows))
            self._send(token, rows, now)
        return len(rows)

    def _claim_guarded(self, room: int, now: float) -> int:
        """Claims the main claim passes by: one probe per circuit whose cooldown is over (the
        relay that wins it), and each rate-limited resource's share of tokens."""
        claimed = 0
        for part in self.guard.probes_due():
            if claimed >= room:
                return claimed
            # Only probe with a message in hand: an idle resource keeps its circuit open (its
            # cooldown over), and its next message is the probe.
            if self.store.has_ready(part) and self.guard.try_probe(part):
                got = self._claim(1, now, only=part)
                if not got:
                    self.guard.probe_found_nothing(part)
                claimed += got
        for part in self.guard.rate_parts_due():
            want = min(self.config.batch_size, room - claimed)
            if want <= 0:
                break
            granted = self.guard.take_tokens(part, want)
            if granted:
                got = self._claim(granted, now, only=part)
                self.guard.give_back(part, granted - got)
                claimed += got
        return claimed

    def _send(self, token: uuid.UUID, rows: list[Claimed], now: float) -> None:
        lease = self._leases[token] = _Lease(token, {r.seq: r for r in rows}, now)
        self.summary.claimed += len(rows)
        items: list[Outgoing] = []
        broken: list[Outcome] = []
        traced = self.observer.tracer is not None
        for row in rows:
            try:
                if traced:
                    span, parent, state = self.observer.start_send(row)
                    if span is not None:
                        lease.spans[row.seq] = span
                    items.append(to_outgoing(row, traceparent=parent, tracestate=state))
                else:
                    items.append(to_outgoing(row))
            except MalformedRow as exc:
                broken.append(
                    Outcome(row.seq, Fate.NOT_SENT, f"malformed row: {exc}", malformed=True)
                )
        inbox = self._inbox

        def done(outcomes: list[Outcome]) -> None:
            inbox.put(_Finished(token, outcomes + broken))

        if items:
            with self.observer.loop_span("publish", messages=len(items)):
                self.publisher.publish(items, done)
        else:
            done([])

    # ----------------------------------------------------------------- settlement

    def _settle_finished(self, result: PassResult) -> None:
        while True:
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._handle(event)
        if self._unsettled:
            pending, self._unsettled = self._unsettled, []
            for finished in pending:
                self._settle(finished, result)

    def _handle(self, event: object) -> None:
        if event is _STOP:
            if not self._stopping:
                log.info("relay.stopping", extra={"in_flight": self.in_flight})
            self._stopping = True
        elif event is _WAKE:
            self._next_claim = 0.0
            self._empty = 0
        elif isinstance(event, _Finished):
            self._unsettled.append(event)

    def _decide(self, finished: _Finished) -> tuple[list[int], list[Retry | Dead]]:
        """Confirmed rows, and a decision for each failed one; the circuits count the results
        first, since whether a failure burns an attempt depends on its resource's circuit."""
        lease = self._leases.get(finished.token)
        rows = lease.rows if lease is not None else {}
        naming, permanent = self.guard.naming, self.config.policy.permanent
        confirmed: list[int] = []
        # (row, failure, its part when the circuit counts it, the connection was lost)
        failed: list[tuple[Claimed, Classified, str | None, bool]] = []
        results: dict[str, list[str | None]] = {}  # per part, in order, for the circuits
        for outcome in finished.outcomes:
            row = rows.get(outcome.ref)
            if row is None:
                continue
            failure = classify(outcome)
            part = naming.part(row.exchange, row.routing_key)
            if failure is None:  # confirmed: the common case needs no policy
                confirmed.append(row.seq)
                results.setdefault(part, []).append(None)
            elif is_resource_failure(outcome, failure, permanent):
                failed.append((row, failure, part, False))
                results.setdefault(part, []).append(failure.detail or failure.cls.value)
            else:
                failed.append((row, failure, None, outcome.connection_lost))
        burns = self.guard.record(results) if results else {}
        now = self._wall()
        failures: list[Retry | Dead] = []
        for row, failure, resource, connection_lost in failed:
            # Not the message's fault: its destination's circuit is open, or the whole
            # connection went (the reconnect has its own backoff; the message none of its own).
            blameless = connection_lost or (resource is not None and not burns[resource].pop(0))
            attempted = Attempted(
                row.seq, row.exchange, row.attempts, row.max_attempts, row.created_at
            )
            decision = decide(
                attempted,
                failure,
                policy=self.config.policy,
                now=now,
                rng=self._rng,
                blameless=blameless,
            )
            if not isinstance(decision, Publish):  # a failure always is Retry or Dead
                failures.append(decision)
        return confirmed, failures

    def _settle(self, finished: _Finished, result: PassResult) -> None:
        with self.observer.loop_span("settle", messages=len(finished.outcomes)):
            self._settle_batch(finished, result)

    def _settle_batch(self, finished: _Finished, result: PassResult) -> None:
        try:
            if finished.confirmed is None or finished.failures is None:
                finished.confirmed, finished.failures = self._decide(finished)
            confirmed, failures = finished.confirmed, finished.failures
            if not finished.marked:
                published = self.store.mark_published(finished.token, confirmed)
                finished.marked = True
                if published != len(confirmed):
                    log.warning(
                        "relay.lease_lost",
                        extra={"confirmed": len(confirmed), "marked": published},
                    )
                result.published += published
                self.summary.published += published
            self.store.settle_failures(finished.token, failures, relay_id=self.config.relay_id)
        except DatabaseUnavailable as exc:
            # Keep the outcomes and try again; if the lease runs out first another relay
            # republishes (same message id), so nothing is lost either way.
            self._unsettled.append(finished)
            self._db_failed("settle", exc)
            return
        self._count_failures(failures, result)
        self._observe(finished, confirmed, failures)
        # Settling can make new rows claimable (the next message of each key whose head was
        # just published), so claim again now rather than at the next poll.
        self._next_claim = 0.0
        self._empty = 0
        self._leases.pop(finished.token, None)

    def _observe(
        self, finished: _Finished, confirmed: list[int], failures: list[Retry | Dead]
    ) -> None:
        """Metrics and span ends for a settled batch (cheap no-ops with telemetry off)."""
        lease = self._leases.get(finished.token)
        if lease is None:
            return
        now = self._wall()
        observer, rows, spans = self.observer, lease.rows, lease.spans
        by_exchange: dict[str, int] = {}
        for seq in confirmed:
            row = rows[seq]
            by_exchange[row.exchange] = by_exchange.get(row.exchange, 0) + 1
            observer.latency(row, now)
            span = spans.pop(seq, None)
            if span is not None:
                observer.end_published(span)
        for exchange, n in by_exchange.items():
            observer.published(exchange, n)
        for decision in failures:
            row = rows[decision.seq]
            observer.failed(row.exchange, _kind(decision), decision.failure.cls.value, 1)
            span = spans.pop(decision.seq, None)
            if span is not None:
                observer.end_failed(span, decision)
        for span in spans.values():  # rows whose lease was lost meanwhile
            observer.end_released(span, "the lease was lost before the outcome was written")
        spans.clear()

    def _count_failures(self, failures: list[Retry | Dead], result: PassResult) -> None:
        groups: dict[tuple[str, str], list[Retry | Dead]] = {}
        for d in failures:
            groups.setdefault((_kind(d), d.failure.cls.value), []).append(d)
        for (kind, cls), group in groups.items():
            self.summary.failures[cls] = self.summary.failures.get(cls, 0) + len(group)
            first = group[0]
            detail = first.reason if isinstance(first, Dead) else first.failure.detail
            event = "relay.dead_lettered" if kind == "dead" else f"relay.{kind}"
            level = logging.ERROR if kind == "dead" else logging.WARNING
            log.log(level, event, extra={"count": len(group), "class": cls, "error": detail})
            if kind == "dead":
                result.dead += len(group)
                self.summary.dead += len(group)
            else:
                result.retried += len(group)
                self.summary.retried += len(group)

    def _maintain_leases(self, result: PassResult, now: float) -> None:
        try:
            self.store.heartbeat(self.config.relay_id)
            result.reclaimed = self.store.reclaim_expired(
                relay_id=self.config.relay_id, max_attempts=self.config.policy.max_attempts
            )
            if now >= self._next_sweep:
                self._next_sweep = now + self.config.sweep_interval
                self.store.unpark_sweep()
            # Batches normally settle in milliseconds; one still open after a third of its
            # lease (a slow broker) gets more time before another relay could take it over.
            stale = [
                lease.token
                for lease in self._leases.values()
                if now - lease.extended_at > self.config.lease_seconds / 3
            ]
            if stale:
                self.store.extend_leases(stale, self.config.lease_seconds)
                for token in stale:
                    self._leases[token].extended_at = now
        except DatabaseUnavailable as exc:
            self._db_failed("lease maintenance", exc)
            return
        if result.reclaimed:
            self.summary.reclaimed += result.reclaimed
            log.warning("relay.leases_reclaimed", extra={"count": result.reclaimed})

    def _purge_expired(self, policy: RetentionPolicy, now: float) -> None:
        try:
            deleted = self.store.purge_expired(policy, self._wall())
        except DatabaseUnavailable as exc:
            self._next_retention = now + policy.interval
            self._db_failed("retention", exc)
            return
        self._next_retention = now + policy.next_run_in(deleted)

    def _db_failed(self, what: str, exc: Exception) -> None:
        self.summary.errors += 1
        self._db_backoff = min(5.0, max(0.1, self._db_backoff * 2))
        self._next_claim = self._clock() + self._db_backoff
        log.error("relay.db_error", extra={"during": what, "error": str(exc)})

    # ----------------------------------------------------------------- loop

    def run(self) -> RunSummary:
        """Relay until `request_stop()`; then drain in-flight confirms and return."""
        log.info("relay.started", extra={"relay_id": self.config.relay_id})
        while not self._stopping:
            self.heartbeat = self._clock()
            result = self.run_once()
            if result.full_batch:
                continue  # backlog: claim the next batch at once
            self._wait(self._wait_time())
        self._drain()
        with contextlib.suppress(DatabaseUnavailable):  # if so, its heartbeat just ages out
            self.store.forget_relay(self.config.relay_id)
        log.info(
            "relay.stopped",
            extra={
                "published": self.summary.published,
                "retried": self.summary.retried,
                "dead": self.summary.dead,
                "released": self.summary.released,
                "drained": self.summary.drained,
            },
        )
        return self.summary

    def _wait_time(self) -> float:
        now = self._clock()
        if not self.publisher.ready:
            until = now + 0.1
        elif self.publisher.blocked or self.in_flight >= self.config.max_in_flight:
            # Nothing to claim until a batch settles (its outcome wakes the wait) or the broker
            # unblocks. Returning 0 here would spin and starve the publisher thread of the GIL.
            until = now + self.config.poll_interval
        else:
            until = max(self._next_claim, now)
            tokens_due = self.guard.next_token_due()
            if tokens_due is not None:  # a rate-limited resource may draw tokens again then
                until = min(until, max(tokens_due, now + self.config.min_poll_interval))
        return max(0.0, min(until - now, self._next_reclaim - now, self.config.poll_interval))

    def _wait(self, timeout: float) -> None:
        try:
            event = self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        self._handle(event)

    def _drain(self) -> None:
        """Wait for in-flight confirms (bounded), settle them, release anything left unsent."""
        deadline = self._clock() + self.config.drain_timeout
        result = PassResult()
        while self._leases and self._clock() < deadline:
            self._settle_finished(result)
            if self._leases:
                self._wait(min(0.05, max(0.0, deadline - self._clock())))
        self.publisher.stop(5.0)
        self._settle_finished(result)  # outcomes the publisher reported while stopping
        if self._leases:
            self.summary.drained = False
            self.release_all("relay stopped before the broker confirmed")

    def release_all(self, why: str) -> int:
        """Give back every row this relay still holds (shutdown): others may take them at once."""
        released = 0
        self._settle_finished(PassResult())  # settle whatever did finish first
        for token, lease in list(self._leases.items()):
            try:
                released += self.store.release(
                    token, list(lease.rows), delay_seconds=0.0, error=why
                )
            except DatabaseUnavailable as exc:
                log.error("relay.release_failed", extra={"error": str(exc)})
                continue
            for span in lease.spans.values():
                self.observer.end_released(span, why)
            self._leases.pop(token, None)
        self.summary.released += released
        return released
