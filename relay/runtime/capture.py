"""`run --capture logical`: the log as the relay's second source, checked before the relay
starts so a database that cannot serve it is refused in one line (exit 2)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

from relay.capture import admin
from relay.capture.conninfo import conninfo_of
from relay.capture.source import LogSource
from relay.capture.stream import ReplicationStream, SlotLost
from relay.errors import ConfigError
from relay.loop.observer import SlotReading
from relay.runtime.config import RelayConfig
from relay.store.boundary import translated
from relay.store.databases import shown
from relay.store.logtable import LogTable
from relay.store.sql_store import SqlStore


def log_source(config: RelayConfig, store: SqlStore, wall: Callable[[], dt.datetime]) -> LogSource:
    """The source for `config`'s slot, or ConfigError saying what the database lacks."""
    name = store.dialect.name
    if name != "postgresql":
        raise ConfigError(
            f"--capture logical needs PostgreSQL; {shown(store.engine.url)} is {name} "
            "(use --capture table)"
        )
    slot = config.capture_slot
    lacking = admin.problems(store.engine, slot=slot)
    if lacking:
        raise ConfigError("--capture logical: " + "; ".join(p.detail for p in lacking))
    state = admin.slot_state(store.engine, slot, publication=slot)
    if not state.exists or not state.publication_exists:
        missing = "replication slot" if not state.exists else "publication"
        raise ConfigError(
            f"--capture logical: this database has no {missing} {slot!r}: run "
            "`outbox-relay capture setup` first"
        )
    if state.wal_status == "lost":
        raise SlotLost(
            f"replication slot {slot!r} was invalidated (wal_status lost): the messages it held "
            "are gone; `outbox-relay capture drop` and `capture setup` make a new one"
        )
    stream = ReplicationStream(
        conninfo_of(config.db_url, replication=True), slot=slot, publication=slot
    )
    table = LogTable(store)
    return LogSource(stream, table, relay_id=config.relay_id, clock=time.monotonic, wall=wall)


def slot_reading(
    config: RelayConfig, store: SqlStore, source: LogSource
) -> Callable[[], SlotReading]:
    """Reads the slot for the capture gauges (Observer.watch_capture): one cheap query."""
    slot = config.capture_slot

    def read() -> SlotReading:
        with translated(store.engine):
            state = admin.slot_state(store.engine, slot, publication=slot)
        return SlotReading(slot, state.lag_bytes, state.wal_status, state.active, source.held)

    return read
