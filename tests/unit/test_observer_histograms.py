"""The relay's histograms have bucket edges that tell its latencies apart: milliseconds from 1 ms
to 60 s (the SDK's defaults would make one bucket of everything under 5 s) and batch sizes."""

from __future__ import annotations

import datetime as dt
import itertools

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from prometheus_client import generate_latest

from relay.loop.observer import Observer
from relay.runtime.telemetry import setup
from tests.unit.fakes import EPOCH, make_claimed


def observe(observer: Observer, latency: dt.timedelta, batch: int) -> None:
    """One message published `latency` after it became due, and one claim of `batch` rows."""
    observer.settled({1: make_claimed(1)}, {}, [1], [], EPOCH + latency)
    observer.claimed(batch)


def histograms(reader: InMemoryMetricReader) -> dict[str, tuple[str, HistogramDataPoint]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, tuple[str, HistogramDataPoint]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if isinstance(point, HistogramDataPoint):
                        found[metric.name] = (metric.unit or "", point)
    return found


def bucket_of(point: HistogramDataPoint) -> tuple[float, float]:
    """The (lower, upper] edges of the one bucket that holds an observation."""
    (i,) = [i for i, n in enumerate(point.bucket_counts) if n]
    edges = [float("-inf"), *point.explicit_bounds, float("inf")]
    return edges[i], edges[i + 1]


def test_a_3_ms_latency_lands_in_a_bucket_under_5_ms() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    observe(Observer(None, meter), dt.timedelta(milliseconds=3), 3)
    found = histograms(reader)
    unit, latency = found["outbox.publish.latency"]
    assert unit == "ms"
    assert latency.sum == 3
    low, high = bucket_of(latency)
    assert low < 3 <= high < 5
    assert latency.explicit_bounds[0] == 1
    assert latency.explicit_bounds[-1] == 60_000
    _, batch = found["outbox.claim.batch_size"]
    low, high = bucket_of(batch)
    assert low < 3 <= high <= 5


def test_the_latency_edges_reach_from_1_ms_to_60_s_without_gaps_of_more_than_3x() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    observe(Observer(None, meter), dt.timedelta(seconds=45), 700)
    found = histograms(reader)
    _, latency = found["outbox.publish.latency"]
    edges = list(latency.explicit_bounds)
    assert edges == sorted(edges)
    assert all(b / a <= 3 for a, b in itertools.pairwise(edges))
    assert bucket_of(latency) == (30_000, 60_000)
    _, batch = found["outbox.claim.batch_size"]
    assert bucket_of(batch) == (500, 1_000)


def test_metrics_serves_the_latency_in_milliseconds_buckets() -> None:
    telemetry = setup(prometheus=True, env={})
    try:
        observe(Observer(None, telemetry.meter), dt.timedelta(milliseconds=3), 3)
        assert telemetry.registry is not None
        text = generate_latest(telemetry.registry).decode()
    finally:
        telemetry.shutdown()
    counts = {
        line.split('le="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("outbox_publish_latency_milliseconds_bucket{")
    }
    assert counts["2"] == 0
    assert counts["3"] == 1
    assert counts["+Inf"] == 1
