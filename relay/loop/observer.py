"""What the relay tells OpenTelemetry: a span per publish, sampled loop spans, and its metrics.

Each message's `send {exchange}:{routing_key}` span (kind PRODUCER) is a child of the context
`enqueue` stored with the row, so it belongs to the producing request's trace; its own context is
what goes into the message's `traceparent`, so the consumer's `process` span is its child. The span
lasts from the publish to the broker's answer and says how it ended (`outbox.outcome`: published,
retry, deferred, dead, released); retries, deferrals and dead-lettering are span events with the
reason. With tracing off (no exporter configured) none of this runs.

The loop's own work (a claim, handing a batch to the publisher, a settlement that marks rows) gets
an `outbox.relay claim|publish|settle` span at most once per `LOOP_SPAN_EVERY` seconds per kind:
enough to see what a turn costs without one span per batch flooding a backend.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from outbox.states import ALL_STATES
from relay.core.circuit import CircuitState, Transition
from relay.core.policy import Dead, Retry
from relay.errors import DatabaseUnavailable
from relay.loop.outage import Outage
from relay.ports import Claimed, StateCounts, Store, TableHealth

LOOP_SPAN_EVERY = 1.0  # seconds between two sampled loop spans of one kind
COUNTS_FRESH = 0.5  # seconds one reading of the state counts serves the gauges of a collection
ALIVE_WITHIN = 30.0  # a relay whose heartbeat is older than this is not counted as alive
# Latency bucket edges in milliseconds, 1 ms to 60 s: fine where a healthy relay is (a few ms
# from commit to confirm), coarser out to the confirm timeouts. The SDK's default edges
# (0, 5, 10, 25, ... 10000) would make one bucket of everything under 5 ms.
LATENCY_BUCKETS_MS = (
    1, 2, 3, 4, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500, 750,
    1_000, 2_500, 5_000, 10_000, 20_000, 30_000, 60_000,
)  # fmt: skip
# A claim takes a millisecond or two on a healthy table; dead rows left unvacuumed make it read
# further through the indexes, out to seconds.
CLAIM_BUCKETS_MS = (
    0.25, 0.5, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 250, 500, 1_000, 2_500, 5_000,
)  # fmt: skip
# Rows per claim: 1 (a trickle) up to the largest batches anyone configures.
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000)
_ONE_MS = dt.timedelta(milliseconds=1)  # dividing by it is exact to the microsecond
_W3C = TraceContextTextMapPropagator()
_CIRCUIT_VALUE = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}
# A replication slot's wal_status as a number an alert can compare: 2 and up, the server may
# remove WAL the slot still needs (3: it did, and the messages in it are gone).
WAL_STATUS_VALUE = {"reserved": 0, "extended": 1, "unreserved": 2, "lost": 3}


class SlotReading(NamedTuple):
    """The log's slot as a collection reads it (--capture logical)."""

    slot: str
    lag_bytes: int | None  # WAL the server keeps for it
    wal_status: str | None
    active: bool  # a relay streams from it
    held: int  # messages this relay read from it and has not published or written yet


class Instruments(Protocol):
    """What the relay records with (relay.runtime.telemetry.Telemetry has it)."""

    @property
    def tracer(self) -> Tracer | None: ...  # None: tracing is off, no span is made

    @property
    def meter(self) -> Meter: ...

    @property
    def meter_provider(self) -> object | None: ...  # None: nothing reads the metrics


Observe = Callable[[], Iterable[tuple[float, dict[str, str]]]]


def _gauge(
    meter: Meter,
    name: str,
    unit: str,
    description: str,
    observe: Observe,
    outage: Outage | None = None,
) -> None:
    """An observable gauge whose callback yields (value, attributes) pairs. With `outage`, it
    reads the database: while that is unavailable the gauge reports nothing (the SDK would log a
    traceback per gauge and scrape), and `outage` says so once."""

    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        if outage is None:
            return [Observation(value, attributes) for value, attributes in observe()]
        try:
            found = [Observation(value, attributes) for value, attributes in observe()]
        except DatabaseUnavailable as exc:
            outage.failed(str(exc))
            return []
        outage.answered()
        return found

    meter.create_observable_gauge(name, callbacks=[callback], unit=unit, description=description)


def _state(state: str, estimated: bool) -> dict[str, str]:
    return {"state": state, "estimated": "true" if estimated else "false"}


class Observer:
    def __init__(
        self,
        tracer: Tracer | None,
        meter: Meter,
        *,
        clock: Callable[[], float] = time.monotonic,
        database: str | None = None,
    ) -> None:
        self.tracer = tracer
        # One relay serving several databases: every span says which one (metrics say it with
        # a label of their own, relay/runtime/labelled.py).
        self._span_labels = {"outbox.database": database} if database is not None else {}
        self._meter = meter
        self._clock = clock
        self._next_loop_span: dict[str, float] = {}
        self._published = meter.create_counter(
            "outbox.messages.published", unit="{message}", description="confirmed by the broker"
        )
        self._failed = meter.create_counter(
            "outbox.messages.failed",
            unit="{message}",
            description="failed attempts, by outcome (retry, deferred, dead) and failure class",
        )
        self._latency = meter.create_histogram(
            "outbox.publish.latency",
            unit="ms",
            description="from when a message became due (its commit, or the end of its delay or "
            "backoff) to the broker's confirm",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_MS,
        )
        self._batch = meter.create_histogram(
            "outbox.claim.batch_size",
            unit="{message}",
            description="rows per claim",
            explicit_bucket_boundaries_advisory=BATCH_BUCKETS,
        )
        self._claim_time = meter.create_histogram(
            "outbox.claim.duration",
            unit="ms",
            description="how long each claim statement took: it grows as dead rows that no "
            "vacuum reclaimed pile up in the table and its indexes",
            explicit_bucket_boundaries_advisory=CLAIM_BUCKETS_MS,
        )
        self._transitions = meter.create_counter(
            "outbox.circuit.transitions",
            unit="{transition}",
            description="circuit state changes this relay made, by resource and new state",
        )

    def watch(
        self,
        store: Store,
        circuits: Callable[[], dict[str, CircuitState]],
        tables: Callable[[], Sequence[TableHealth]] | None = None,
    ) -> None:
        """Gauges of the outbox's state, read from `store` at each collection: only worth it
        when something reads the metrics (each collection costs queries). `tables`: the dead
        rows of the relay's tables, where the database counts them (PostgreSQL)."""
        meter = self._meter
        outage = Outage()  # one line when the database goes, one when it is back
        # Both message gauges read one StateCounts: one collection, one pair of queries.
        cached: list[tuple[float, StateCounts]] = []

        def counts() -> StateCounts:
            now = self._clock()
            if not cached or now - cached[0][0] > COUNTS_FRESH:
                cached[:] = [(now, store.counts())]
            return cached[0][1]

        def states() -> list[tuple[float, dict[str, str]]]:
            counts_now = counts()
            # Every state, zeros included: a series that vanishes at zero reads as "no data".
            # `estimated` says which figures are estimates (published and cancelled beside a
            # large table), so nothing mistakes one for a count.
            rows = [
                (float(counts_now.by_state.get(s, 0)), _state(s, s in counts_now.estimated))
                for s in ALL_STATES
            ]
            return [*rows, (float(counts_now.ready), _state("ready", False))]

        def oldest() -> list[tuple[float, dict[str, str]]]:
            age = counts().oldest_ready_age_s
            return [(age or 0.0, {})]

        _gauge(
            meter,
            "outbox.messages",
            "{message}",
            "messages by state; estimated=true where the figure is an estimate",
            states,
            outage,
        )
        _gauge(
            meter,
            "outbox.oldest_ready.age",
            "s",
            "how long the longest-waiting due message has waited: the lag of a stuck outbox",
            oldest,
            outage,
        )
        _gauge(
            meter,
            "outbox.circuit.state",
            "1",
            "circuit per resource: 0 closed, 1 half-open (probing), 2 open",
            lambda: [
                (float(_CIRCUIT_VALUE[state]), {"resource": name})
                for name, state in circuits().items()
            ],
        )
        _gauge(
            meter,
            "outbox.relays.alive",
            "{relay}",
            f"relays whose heartbeat is younger than {ALIVE_WITHIN:g} s",
            lambda: [(float(len(store.relays(ALIVE_WITHIN))), {})],
            outage,
        )
        if tables is not None:
            read = tables
            _gauge(
                meter,
                "outbox.table.dead_ratio",
                "1",
                "dead rows out of all rows, per table of the relay: what only a vacuum reclaims; "
                "one that keeps growing means autovacuum is off or cannot keep up",
                lambda: [(t.dead_ratio, {"table": t.table}) for t in read()],
                outage,
            )

    def watch_capture(self, read: Callable[[], SlotReading]) -> None:
        """Gauges of the log's slot: how much WAL it keeps (what a relay that stopped reading
        costs the disk), its wal_status, whether it is read, and what this relay holds of it."""
        meter = self._meter
        outage = Outage()
        cached: list[tuple[float, SlotReading]] = []

        def reading() -> SlotReading:
            now = self._clock()
            if not cached or now - cached[0][0] > COUNTS_FRESH:
                cached[:] = [(now, read())]
            return cached[0][1]

        def slot(value: Callable[[SlotReading], float]) -> Observe:
            def observe() -> list[tuple[float, dict[str, str]]]:
                found = reading()
                return [(value(found), {"slot": found.slot})]

            return observe

        _gauge(
            meter,
            "outbox.capture.lag",
            "By",
            "WAL the log's replication slot keeps, not yet confirmed by a relay: it grows while "
            "no relay reads the slot, and the server keeps it on disk",
            slot(lambda r: float(r.lag_bytes or 0)),
            outage,
        )
        _gauge(
            meter,
            "outbox.capture.wal_status",
            "1",
            "the slot's wal_status: 0 reserved, 1 extended, 2 unreserved (WAL it needs may be "
            "removed at the next checkpoint), 3 lost (the messages it held are gone)",
            slot(lambda r: float(WAL_STATUS_VALUE.get(r.wal_status or "", 0))),
            outage,
        )
        _gauge(
            meter,
            "outbox.capture.active",
            "1",
            "1 while a relay streams from the slot, 0 when none does (its messages wait)",
            slot(lambda r: 1.0 if r.active else 0.0),
            outage,
        )
        _gauge(
            meter,
            "outbox.capture.held",
            "{message}",
            "messages this relay read from the log and has not yet published or written",
            slot(lambda r: float(r.held)),
            outage,
        )

    def watch_window(self, size: Callable[[], int]) -> None:
        """A gauge of the relay's window (relay/core/window.py): free to read."""
        _gauge(
            self._meter,
            "outbox.relay.window",
            "{message}",
            "messages this relay may have sent and not yet written: its window, sized to the "
            "broker's confirm round, at most --max-in-flight",
            lambda: [(float(size()), {})],
        )

    # ----------------------------------------------------------------- spans

    def start_send(self, row: Claimed) -> tuple[Span | None, str | None, str | None]:
        """Start a message's send span; return it and the traceparent/tracestate to publish."""
        if self.tracer is None:
            return None, row.traceparent, row.tracestate
        carrier = {"traceparent": row.traceparent or "", "tracestate": row.tracestate or ""}
        parent = _W3C.extract(carrier) if row.traceparent else None
        destination = f"{row.exchange}:{row.routing_key}"
        span = self.tracer.start_span(
            f"send {destination}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.operation.type": "send",
                "messaging.operation.name": "publish",
                "messaging.destination.name": destination,
                "messaging.rabbitmq.destination.routing_key": row.routing_key,
                "messaging.message.id": row.id,
                "outbox.attempt": row.attempts,
                **({"outbox.key": row.key} if row.key is not None else {}),
                **self._span_labels,
            },
        )
        out: dict[str, str] = {}
        _W3C.inject(out, context=trace.set_span_in_context(span))
        return span, out.get("traceparent"), out.get("tracestate") or row.tracestate

    @staticmethod
    def end_published(span: Span) -> None:
        span.set_attribute("outbox.outcome", "published")
        span.end()

    @staticmethod
    def end_failed(span: Span, decision: Retry | Dead) -> None:
        failure = decision.failure
        span.set_attribute("outbox.failure_class", failure.cls.value)
        if isinstance(decision, Dead):
            span.set_attribute("outbox.outcome", "dead")
            span.add_event("dead-lettered", {"reason": decision.reason[:1000]})
            span.set_status(Status(StatusCode.ERROR, decision.reason[:200]))
        else:
            span.set_attribute("outbox.outcome", decision.kind)
            span.add_event(
                "retry scheduled" if decision.burn else "deferred",
                {"next_attempt_at": decision.at.isoformat(), "error": failure.detail[:1000]},
            )
            span.set_status(Status(StatusCode.ERROR, failure.detail[:200]))
        span.end()

    @staticmethod
    def end_released(span: Span, why: str) -> None:
        span.set_attribute("outbox.outcome", "released")
        span.add_event("released", {"reason": why})
        span.end()

    @contextlib.contextmanager
    def loop_span(self, name: str, **attributes: Any) -> Iterator[Span | None]:
        """A span around a turn of the loop, sampled to one per LOOP_SPAN_EVERY per kind."""
        now = self._clock()
        if self.tracer is None or now < self._next_loop_span.get(name, 0.0):
            yield None
            return
        self._next_loop_span[name] = now + LOOP_SPAN_EVERY
        attributes.update(self._span_labels)
        with self.tracer.start_as_current_span(f"outbox.relay {name}", attributes=attributes) as s:
            yield s

    def settled(
        self,
        rows: Mapping[int, Claimed],
        spans: dict[int, Span],
        published: Sequence[int],
        failures: Sequence[Retry | Dead],
        now: dt.datetime,
    ) -> None:
        """Metrics and span ends for a settled batch (cheap no-ops with telemetry off); `spans`
        is emptied: a span left in it belongs to a row whose lease was lost meanwhile."""
        by_exchange: dict[str, int] = {}
        record_latency = self._latency.record
        for seq in published:
            row = rows[seq]
            by_exchange[row.exchange] = by_exchange.get(row.exchange, 0) + 1
            record_latency(max(0.0, (now - row.available_at) / _ONE_MS))
        for exchange, n in by_exchange.items():
            self._published.add(n, {"exchange": exchange})
        for decision in failures:
            attributes = {
                "exchange": rows[decision.seq].exchange,
                "outcome": decision.kind,
                "failure_class": decision.failure.cls.value,
            }
            self._failed.add(1, attributes)
        if not spans:
            return
        for seq in published:
            span = spans.pop(seq, None)
            if span is not None:
                self.end_published(span)
        for decision in failures:
            span = spans.pop(decision.seq, None)
            if span is not None:
                self.end_failed(span, decision)
        for span in spans.values():
            self.end_released(span, "the lease was lost before the outcome was written")
        spans.clear()

    # ----------------------------------------------------------------- metrics

    def circuit_changed(self, t: Transition) -> None:
        self._transitions.add(1, {"resource": t.resource, "state": t.after.value})

    def claimed(self, n: int) -> None:
        self._batch.record(n)

    def claim_took(self, seconds: float) -> None:
        self._claim_time.record(seconds * 1000.0)
