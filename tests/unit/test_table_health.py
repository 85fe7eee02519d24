"""Autovacuum and dead rows: which storage options and server settings leave a table unvacuumed
(relay/store/postgres.py, autovacuum_off), the dead-row ratio, its gauge and the claim-time
histogram (relay/loop/observer.py)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)

from relay.loop.observer import Observer
from relay.ports import TableHealth
from relay.store.postgres import autovacuum_off
from tests.unit.fakes import FakeStore


@pytest.mark.parametrize(
    ("server", "reloptions", "off"),
    [
        ("on", None, None),
        ("on", ["autovacuum_vacuum_scale_factor=0.01"], None),
        ("on", ["autovacuum_enabled=true"], None),
        ("on", ["autovacuum_enabled=false"], "table"),
        ("on", ["fillfactor=90", "autovacuum_enabled=off"], "table"),
        ("on", ["autovacuum_enabled=0"], "table"),
        ("on", ["AUTOVACUUM_ENABLED=F"], "table"),
        ("off", None, "server"),
        ("off", ["autovacuum_enabled=false"], "table"),  # the table's own reason first
    ],
)
def test_autovacuum_is_off_by_the_tables_option_or_the_servers_setting(
    server: str, reloptions: list[str] | None, off: str | None
) -> None:
    why = autovacuum_off(server, reloptions)
    if off is None:
        assert why is None
    else:
        assert why is not None
        assert ("storage option" in why) == (off == "table"), why
        assert ("server's setting" in why) == (off == "server"), why


def test_the_dead_ratio_is_dead_rows_out_of_all() -> None:
    assert TableHealth("t", True, None, live=300, dead=100).dead_ratio == 0.25
    assert TableHealth("t", True, None, live=0, dead=0).dead_ratio == 0.0


def _points(reader: InMemoryMetricReader, name: str) -> list[object]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def test_the_gauge_gives_each_tables_dead_ratio() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    tables = [
        TableHealth("outbox_message", False, "autovacuum_enabled=false", live=900, dead=100),
        TableHealth("outbox_relay", True, None, live=1, dead=3),
    ]
    Observer(None, meter).watch(FakeStore(), dict, lambda: tables)
    got = {}
    for point in _points(reader, "outbox.table.dead_ratio"):
        assert isinstance(point, NumberDataPoint)
        got[dict(point.attributes or {})["table"]] = point.value
    assert got == {"outbox_message": 0.1, "outbox_relay": 0.75}


def test_without_table_figures_there_is_no_dead_ratio_series() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    Observer(None, meter).watch(FakeStore(), dict)
    assert _points(reader, "outbox.table.dead_ratio") == []


def test_each_claim_records_its_time_in_milliseconds() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    observer = Observer(None, meter)
    observer.claim_took(0.0012)
    observer.claim_took(0.0030)
    (point,) = _points(reader, "outbox.claim.duration")
    assert isinstance(point, HistogramDataPoint)
    assert point.count == 2
    assert point.sum == pytest.approx(4.2)
    assert point.explicit_bounds[0] < 1 < point.explicit_bounds[-1]
