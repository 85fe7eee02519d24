"""Several databases' loops record into one registry (relay/runtime/labelled.py): one instrument
per name, each database's figures under its `database` label, its gauges read while it is served
and no longer once it has left; what a gauge logs while read names its database."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pytest
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from relay.runtime.labelled import Labelled


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, object], object]]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[tuple[dict[str, object], object]]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = [
                    (dict(p.attributes or {}), getattr(p, "value", getattr(p, "count", None)))
                    for p in metric.data.data_points
                ]
    return found


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


def test_each_database_records_under_its_label_in_one_instrument(
    reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    provider = MeterProvider(metric_readers=[reader])
    shared = Labelled(provider.get_meter("outbox-relay"))
    with caplog.at_level(logging.WARNING):
        for name, n in (("acme", 1), ("globex", 2)):
            meter = shared.meter_for(name)
            meter.create_counter("outbox.messages.published").add(n, {"exchange": "orders"})
            meter.create_histogram("outbox.claim.batch_size").record(n)
    # A second instrument of one name would be the first again, with a warning.
    assert not [r for r in caplog.records if "created already" in r.getMessage()]
    found = points(reader)
    assert sorted(found["outbox.messages.published"], key=str) == [
        ({"exchange": "orders", "database": "acme"}, 1),
        ({"exchange": "orders", "database": "globex"}, 2),
    ]
    assert sorted(str(a["database"]) for a, _ in found["outbox.claim.batch_size"]) == [
        "acme",
        "globex",
    ]
    provider.shutdown()


def test_every_databases_gauge_is_read_until_it_leaves(
    reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    provider = MeterProvider(metric_readers=[reader])
    shared = Labelled(provider.get_meter("outbox-relay"))
    meters = {name: shared.meter_for(name) for name in ("acme", "globex")}

    def gauge(value: int) -> object:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            logging.getLogger("relay").warning("metrics.read")
            return [Observation(value, {"state": "pending"})]

        return observe

    for n, meter in enumerate(meters.values(), 1):
        meter.create_observable_gauge("outbox.messages", callbacks=[gauge(n * 10)])  # type: ignore[list-item]
    with caplog.at_level(logging.WARNING, logger="relay"):
        assert sorted(points(reader)["outbox.messages"], key=str) == [
            ({"state": "pending", "database": "acme"}, 10),
            ({"state": "pending", "database": "globex"}, 20),
        ]
    assert sorted(str(getattr(r, "database", None)) for r in caplog.records) == ["acme", "globex"]
    meters["acme"].close()
    assert points(reader)["outbox.messages"] == [({"state": "pending", "database": "globex"}, 20)]
    provider.shutdown()
