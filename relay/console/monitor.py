"""The overview's figures, read in the background while someone is looking, never per request.

One refresh reads what `outbox-relay status` reads (counts by state, the per-exchange table,
circuits, live relays) and the activity of the last minutes (admin.activity), which it keeps as a
per-minute rollup: a finished minute is read once, so a refresh re-reads only the last few.
The backlog chart is the console's own samples of the counts, one per refresh, kept for WINDOW.

Cost is bounded two ways: refreshes stop when no page or API call has asked for the figures for
IDLE_AFTER seconds, and the next refresh waits at least COST_RATIO times as long as the last one
took, so a slow count on a huge table spaces the refreshes out instead of piling them up.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from relay.errors import PermissionDenied, RelayError
from relay.loop.observer import ALIVE_WITHIN
from relay.ports import ResourceRow, StateCounts
from relay.store import admin
from relay.store.boundary import translated
from relay.store.sql_store import SqlStore

log = logging.getLogger("relay")

WINDOW = dt.timedelta(hours=3)  # what the charts cover
# How long before a minute the messages it counts as published may have been enqueued (the id
# range that bounds the scan; see admin.activity): a backlog older than this, drained, shows in the
# backlog chart and in the relay's own counter (outbox_messages_published_total), not here.
LOOKBACK = dt.timedelta(hours=1)
# Minutes this recent are read again at each refresh: rows settle with the database's clock,
# which may run a little ahead of or behind this process's.
UNSETTLED = dt.timedelta(minutes=3)
MIN_INTERVAL = 5.0  # seconds between refreshes, at least
COST_RATIO = 10.0  # ... and at least this many times the last refresh's duration
IDLE_AFTER = 60.0  # seconds without a reader after which refreshes stop
_MINUTE = dt.timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Minute:
    start: dt.datetime
    published: int
    failed: int  # failed attempts to be retried (retry, deferred)
    dead: int


@dataclass(frozen=True, slots=True)
class Sample:
    at: dt.datetime
    ready: int
    pending: int
    in_flight: int
    oldest_ready_age_s: float | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: dt.datetime
    took_s: float
    counts: StateCounts
    exchanges: list[dict[str, object]]
    resources: list[ResourceRow]
    # id, started, last seen; None when the console's role may not read outbox_relay
    relays: list[tuple[str, dt.datetime, dt.datetime]] | None
    minutes: list[Minute]  # the WINDOW, oldest first; the last one is the current, partial one
    backlog: list[Sample]  # oldest first
    since: dt.datetime  # when this console began sampling the backlog


def _floor(t: dt.datetime) -> dt.datetime:
    return t.replace(second=0, microsecond=0)


class Monitor:
    def __init__(
        self,
        store: SqlStore,
        engine: Engine,
        *,
        now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._engine = engine
        self._now = now
        self._clock = clock
        self._minutes: dict[dt.datetime, dict[str, int]] = {}
        self._settled_until: dt.datetime | None = None  # minutes before this are final
        self._samples: deque[Sample] = deque()
        self._since = now()
        self._latest: Snapshot | None = None
        self.error: str | None = None  # why the last refresh failed, until one succeeds
        self._demand = float("-inf")
        self._next = float("-inf")
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="console-monitor", daemon=True)
        self._refreshing = threading.Lock()

    # ----------------------------------------------------------------- readers

    def snapshot(self, wait: float = 0.0) -> Snapshot | None:
        """The latest figures (None before the first refresh), waiting up to `wait` seconds for
        a first one; asking keeps the refreshes going."""
        with self._wake:
            self._demand = self._clock()
            self._wake.notify_all()
            if self._latest is None and wait > 0:
                self._wake.wait_for(
                    lambda: self._latest is not None or self.error is not None, timeout=wait
                )
            return self._latest

    # ----------------------------------------------------------------- the refresher

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping:
                    idle = self._clock() - self._demand > IDLE_AFTER
                    wait = None if idle else self._next - self._clock()
                    if wait is not None and wait <= 0:
                        break
                    self._wake.wait(wait)
                if self._stopping:
                    return
            started = self._clock()
            try:
                self.refresh()
            except (RelayError, SQLAlchemyError) as exc:
                message = str(getattr(exc, "orig", None) or exc).strip().splitlines()
                with self._wake:
                    self.error = message[0] if message else type(exc).__name__
                    self._wake.notify_all()
                log.warning("console.refresh_failed", extra={"error": self.error})
            took = self._clock() - started
            self._next = self._clock() + max(MIN_INTERVAL, COST_RATIO * took)

    def refresh(self) -> Snapshot:
        """Read every figure now (the refresher's work; tests call it directly)."""
        with self._refreshing:
            started = self._clock()
            now = self._now()
            with translated(self._engine):
                counts = self._store.counts()
                exchanges = admin.per_exchange(self._engine, now)
                resources = self._store.resources()
                relays = self._relays()
                minutes = self._rollup(now)
            sample = Sample(
                now,
                counts.ready,
                counts.by_state.get("pending", 0),
                counts.by_state.get("in_flight", 0),
                counts.oldest_ready_age_s,
            )
            self._samples.append(sample)
            while self._samples and self._samples[0].at < now - WINDOW:
                self._samples.popleft()
            snapshot = Snapshot(
                taken_at=now,
                took_s=self._clock() - started,
                counts=counts,
                exchanges=exchanges,
                resources=resources,
                relays=relays,
                minutes=minutes,
                backlog=list(self._samples),
                since=self._since,
            )
        with self._wake:
            self._latest = snapshot
            self.error = None
            self._wake.notify_all()
        return snapshot

    def _relays(self) -> list[tuple[str, dt.datetime, dt.datetime]] | None:
        try:
            return self._store.relays(ALIVE_WITHIN)
        except PermissionDenied:
            return None  # a read-only role may see messages without seeing relays

    def _rollup(self, now: dt.datetime) -> list[Minute]:
        """The per-minute activity of the WINDOW, reading only the minutes not final yet."""
        first = _floor(now - WINDOW)
        since = max(first, self._settled_until or first)
        fresh = admin.activity(self._engine, since=since, enqueued_since=since - LOOKBACK)
        for minute in [m for m in self._minutes if m >= since or m < first]:
            del self._minutes[minute]
        self._minutes.update(fresh)
        self._settled_until = _floor(now - UNSETTLED)
        out = []
        minute = first
        while minute <= now:
            c = self._minutes.get(minute, {})
            out.append(
                Minute(
                    minute,
                    c.get("published", 0),
                    c.get("retry", 0) + c.get("deferred", 0),
                    c.get("dead", 0),
                )
            )
            minute += _MINUTE
        return out
