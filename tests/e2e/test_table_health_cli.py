"""A real `outbox-relay run` on a table whose autovacuum is off: one warning at start, and the
tables' dead-row ratio and the claim time on /metrics."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

import outbox
from tests.e2e.test_telemetry_cli import free_port, get, sample, start_relay, stop
from tests.support.broker import Broker
from tests.support.waiting import wait_until

TABLES = ("outbox_message", "outbox_attempt", "outbox_relay", "outbox_resource")


def test_a_relay_warns_of_an_unvacuumed_table_once_and_shows_dead_rows_on_metrics(
    pg_engine: Engine, pg_url: str, broker: Broker, tmp_path: Path
) -> None:
    with pg_engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE outbox_message SET (autovacuum_enabled = false)")
        ids = [
            outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload=str(i))
            for i in range(200)
        ]
    port = free_port()
    process = start_relay(pg_url, tmp_path, "--http-port", str(port))
    try:
        broker.collect_ids(ids, timeout=20)

        def dead_rows_shown() -> str | None:
            status, text = get(f"http://127.0.0.1:{port}/metrics")
            ratio = sample(text, "outbox_table_dead_ratio", table="outbox_message")
            # Publishing updated every row: the statistics count the old versions as dead once
            # the relay's connections report them.
            return text if status == 200 and ratio is not None and ratio > 0 else None

        text = wait_until(dead_rows_shown, timeout=30, what="outbox_message's dead rows")
        assert text is not None
    finally:
        _, err = stop(process)
    for table in TABLES:
        ratio = sample(text, "outbox_table_dead_ratio", table=table)
        assert ratio is not None, table
        assert 0.0 <= ratio <= 1.0, (table, ratio)
    claims = sample(text, "outbox_claim_duration_milliseconds_count")
    assert claims is not None
    assert claims >= 1
    warnings = [line for line in err.splitlines() if "schema.autovacuum_off" in line]
    assert len(warnings) == 1, err
    assert "outbox_message" in warnings[0]
    assert "autovacuum_enabled=false (the table's storage option)" in warnings[0]
