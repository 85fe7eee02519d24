"""Capture the current OpenTelemetry context as W3C `traceparent`/`tracestate` strings."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# Always W3C, whatever global propagator the application configured: the wire contract names
# `traceparent`, and consumers of any stack can read it.
_W3C = TraceContextTextMapPropagator()


def current() -> tuple[str | None, str | None]:
    """Return (traceparent, tracestate) of the current span, or (None, None) when there is none."""
    span = trace.get_current_span()
    if not span.get_span_context().is_valid:
        return None, None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent"), carrier.get("tracestate") or None
