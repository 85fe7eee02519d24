"""`outbox-relay circuits` and `circuits reset`, and open circuits in `status`, as a subprocess."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

from sqlalchemy import Engine

from relay.core import circuit
from relay.core.circuit import CircuitSettings
from relay.ports import ResourceRow
from relay.store.sql_store import open_store
from tests.support.cli import assert_one_line_error, cli

SETTINGS = CircuitSettings(threshold=2, cooldown=300.0, max_cooldown=600.0)


def fail(db_url: str, resource: str, times: int) -> None:
    """Record `times` failures for `resource` through the store, as relays do."""
    store = open_store(db_url)
    try:

        def change(row: ResourceRow, now: dt.datetime) -> tuple[ResourceRow, None]:
            failures = ["404 NOT_FOUND - no exchange 'orders'"] * times
            new, _, _ = circuit.record(row.circuit, failures, now, SETTINGS, random.Random(1))
            return ResourceRow(new, row.bucket), None

        store.change_resource(resource, change)
    finally:
        store.close()


def circuits_json(db_url: str, cwd: Path) -> list[dict[str, object]]:
    result = cli("--db", db_url, "circuits", "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert isinstance(rows, list)
    return rows


def test_no_circuits_says_everything_is_closed(
    app_engine: Engine, db_url: str, tmp_path: Path
) -> None:
    result = cli("--db", db_url, "circuits", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "every circuit is closed" in result.stdout
    assert circuits_json(db_url, tmp_path) == []


def test_an_open_circuit_is_listed_shown_in_status_and_reset_by_hand(
    app_engine: Engine, db_url: str, tmp_path: Path
) -> None:
    orders, audit = "127.0.0.1:5672/%2F/orders", "127.0.0.1:5672/%2F/audit"
    fail(db_url, orders, 3)
    fail(db_url, audit, 1)

    rows = {r["resource"]: r for r in circuits_json(db_url, tmp_path)}
    assert rows[orders]["state"] == "open"
    assert rows[orders]["failures"] == 2
    assert "404 NOT_FOUND" in str(rows[orders]["last_error"])
    opens_in = rows[orders]["opens_in_s"]
    assert isinstance(opens_in, float)
    assert 100 < opens_in <= 300
    assert (rows[audit]["state"], rows[audit]["failures"]) == ("closed", 1)

    table = cli("--db", db_url, "circuits", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    line = next(row for row in table.stdout.splitlines() if orders in row)
    assert "open" in line
    assert "404 NOT_FOUND" in line

    status = cli("--db", db_url, "status", "--json", cwd=tmp_path)
    report = json.loads(status.stdout)
    assert [c["resource"] for c in report["open_circuits"]] == [orders]
    text = cli("--db", db_url, "status", cwd=tmp_path).stdout
    assert "1 circuit(s) not closed" in text
    assert orders in text

    # The last part of the name is enough when it names one resource.
    reset = cli("--db", db_url, "circuits", "reset", "orders", cwd=tmp_path)
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.strip() == f"closed {orders} (was open, 2 failures)"
    rows = {r["resource"]: r for r in circuits_json(db_url, tmp_path)}
    assert (rows[orders]["state"], rows[orders]["failures"]) == ("closed", 0)
    assert (
        json.loads(cli("--db", db_url, "status", "--json", cwd=tmp_path).stdout)["open_circuits"]
        == []
    )
    again = cli("--db", db_url, "circuits", "--json", "reset", orders, cwd=tmp_path)
    assert json.loads(again.stdout) == {"resource": orders, "was": "closed", "failures": 0}


def test_reset_of_an_unknown_or_ambiguous_resource_exits_2_with_one_line(
    app_engine: Engine, db_url: str, tmp_path: Path
) -> None:
    fail(db_url, "a.example:5672/%2F/orders", 2)
    fail(db_url, "b.example:5672/%2F/orders", 2)
    unknown = cli("--db", db_url, "circuits", "reset", "payments", cwd=tmp_path)
    assert "no resource named 'payments'" in assert_one_line_error(unknown, 2)
    ambiguous = cli("--db", db_url, "circuits", "reset", "orders", cwd=tmp_path)
    assert "names 2 resources" in assert_one_line_error(ambiguous, 2)
    assert all(r["state"] == "open" for r in circuits_json(db_url, tmp_path))
