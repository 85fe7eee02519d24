"""The relay's tables as the database sees them: which ones autovacuum will not clean, and their
dead rows (PostgreSQL keeps both; MySQL and SQLite report nothing), and the warning a relay gives
once at start (relay/runtime/runner.py, warn_autovacuum)."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import Engine

from relay.runtime.runner import warn_autovacuum
from relay.store.sql_store import SqlStore, open_store

TABLES = {"outbox_message", "outbox_attempt", "outbox_relay", "outbox_resource"}


def test_only_postgresql_reports_its_tables(store: SqlStore) -> None:
    health = store.table_health()
    if store.dialect.name == "postgresql":
        assert {t.table for t in health} == TABLES
        assert all(t.live >= 0 and t.dead >= 0 for t in health)
    else:
        assert health == []


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "schema.autovacuum_off"]


def test_the_warning_names_a_table_whose_autovacuum_is_turned_off(
    pg_engine: Engine, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="relay")
    store = open_store(pg_url)
    try:
        # A fresh schema: no table of its own turns autovacuum off (the server's setting may).
        warn_autovacuum(store)
        server_off = [t for t in store.table_health() if not t.autovacuum]
        assert all("server's setting" in (t.why_not or "") for t in server_off)
        assert len(_warnings(caplog)) == (1 if server_off else 0)
        caplog.clear()
        with pg_engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE outbox_attempt SET (autovacuum_enabled = off)")
        warn_autovacuum(store)
        (warning,) = _warnings(caplog)
        tables = getattr(warning, "tables", "").split(",")
        assert "outbox_attempt" in tables
        assert "autovacuum_enabled=off (the table's storage option)" in getattr(warning, "why", "")
        health = {t.table: t for t in store.table_health()}
        assert not health["outbox_attempt"].autovacuum
    finally:
        store.close()
