"""The usual wiring of a relay from a store, a publisher and a configuration: its circuits client
and its observer, sharing one clock, wall clock and random source."""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable, Sequence

from opentelemetry.metrics import NoOpMeter

from relay.loop.circuits import ResourceGuard
from relay.loop.observer import Instruments, Observer, SlotReading
from relay.loop.relay import Relay, utc_now
from relay.loop.settings import LoopSettings
from relay.loop.sources import Source
from relay.ports import Publisher, Store, TableHealth


def wire_relay(
    store: Store,
    publisher: Publisher,
    config: LoopSettings,
    *,
    telemetry: Instruments | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], dt.datetime] = utc_now,
    rng: random.Random | None = None,
    tables: Callable[[], Sequence[TableHealth]] | None = None,
    source: Source | None = None,
    capture: Callable[[], SlotReading] | None = None,
    database: str | None = None,
) -> Relay:
    """A relay over `store` and `publisher` (started or not). Without `telemetry` it makes no
    span and records no metric; `tables` feeds the dead-row gauge (Observer.watch); `source` is
    the log, with --capture logical, and `capture` reads its slot for the gauges; `database`
    names the database in its spans when the process serves several."""
    rng = rng or random.Random()
    if telemetry is None:
        observer = Observer(None, NoOpMeter("outbox-relay"), clock=clock)
    else:
        observer = Observer(telemetry.tracer, telemetry.meter, clock=clock, database=database)
    guard = ResourceGuard(
        store, config, clock=clock, wall=wall, rng=rng, on_transition=observer.circuit_changed
    )
    relay = Relay(
        store,
        publisher,
        config,
        guard=guard,
        observer=observer,
        clock=clock,
        wall=wall,
        rng=rng,
        source=source,
    )
    if telemetry is not None and telemetry.meter_provider is not None:
        # Gauges cost queries: only when something reads them.
        observer.watch(store, guard.states, tables)
        observer.watch_window(lambda: relay.claimer.window.size)
        if capture is not None:
            observer.watch_capture(capture)
    return relay
