"""The short-lived commands: migrate and status."""

from __future__ import annotations

import logging

import outbox
from relay.cli.messages import operator_engine
from relay.runtime.config import RelayConfig, redact
from relay.store.sql_store import open_store

log = logging.getLogger("relay")


def migrate(config: RelayConfig) -> int:
    from outbox.migrate import upgrade

    with operator_engine(config) as engine:
        version = upgrade(engine)
    log.info("schema.migrated", extra={"version": version, "db": redact(config.db_url)})
    return 0


def status(config: RelayConfig) -> dict[str, float | int | None]:
    store = open_store(config.db_url)
    try:
        counts = store.counts()
    finally:
        store.close()
    report: dict[str, float | int | None] = {
        state.value: counts.by_state.get(state.value, 0) for state in outbox.State
    }
    report["ready"] = counts.ready
    report["delayed"] = counts.delayed
    age = counts.oldest_ready_age_s
    report["oldest_pending_age_s"] = None if age is None else round(age, 3)
    return report
