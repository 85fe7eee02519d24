"""OpenTelemetry for the relay: traces and metrics, configured only from the standard variables.

Traces: `OTEL_TRACES_EXPORTER` = `otlp` | `console` | `none`. When it is unset, spans go over OTLP
if `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, and nowhere otherwise; with
tracing off the relay's hot path does not create spans at all (`Telemetry.tracer` is None).
Metrics: `OTEL_METRICS_EXPORTER` the same way, plus a Prometheus reader when the relay serves
`/metrics` (`run --http-port`). `OTEL_SERVICE_NAME` defaults to `outbox-relay`; every other
`OTEL_*` setting (endpoint, headers, sampler, resource attributes) is read by the SDK itself.

The relay's own tracer provider is never installed globally: zero-code instrumentation
(`opentelemetry-instrument`) in the same process keeps its own global one. Its pika
instrumentation cannot replace the `traceparent` the relay puts on each message either: the
publisher goes around it (relay/amqp/untraced.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry

from relay.errors import ConfigError

SERVICE_NAME = "outbox-relay"
_EXPORTERS = ("otlp", "console", "none")


def _exporter(kind: str, env: dict[str, str]) -> str:
    name = f"OTEL_{kind.upper()}_EXPORTER"
    raw = env.get(name)
    if raw is None:
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
            f"OTEL_EXPORTER_OTLP_{kind.upper()}_ENDPOINT"
        )
        return "otlp" if endpoint else "none"
    # The specification allows a list; the first recognised one is used.
    chosen = [p.strip().lower() for p in raw.split(",") if p.strip()]
    for value in chosen:
        if value in _EXPORTERS:
            return value
    raise ConfigError(f"{name}={raw!r}: expected one of {', '.join(_EXPORTERS)}")


@dataclass
class Telemetry:
    """What the relay records with: `tracer` None means tracing is off."""

    tracer: Tracer | None = None
    meter_provider: MeterProvider | None = None
    tracer_provider: TracerProvider | None = None
    registry: CollectorRegistry | None = None  # what /metrics serves
    _meter: Meter | None = field(default=None, repr=False)

    @property
    def meter(self) -> Meter:
        if self._meter is None:
            provider = self.meter_provider or metrics.NoOpMeterProvider()
            self._meter = provider.get_meter("outbox-relay")
        return self._meter

    def shutdown(self) -> None:
        """Flush what is buffered (the last spans of a drain) and stop the exporters."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def setup(*, prometheus: bool, env: dict[str, str] | None = None) -> Telemetry:
    """Telemetry from the OTEL_* environment (`prometheus`: also serve metrics at /metrics)."""
    env = dict(os.environ if env is None else env)
    traces, metric_kind = _exporter("traces", env), _exporter("metrics", env)
    if traces == "none" and metric_kind == "none" and not prometheus:
        return Telemetry()
    attributes: dict[str, Any] = {}
    if not env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = SERVICE_NAME
    resource = Resource.create(attributes)
    telemetry = Telemetry()
    if traces != "none":
        provider = TracerProvider(resource=resource)
        if traces == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        telemetry.tracer_provider = provider
        telemetry.tracer = provider.get_tracer("outbox-relay")
    readers: list[MetricReader] = []
    if metric_kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    elif metric_kind == "console":
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    if prometheus:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        # A registry of our own: several relays in one process (tests) never collide.
        telemetry.registry = CollectorRegistry()
        readers.append(PrometheusMetricReader(registry=telemetry.registry))
    if readers:
        telemetry.meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return telemetry
