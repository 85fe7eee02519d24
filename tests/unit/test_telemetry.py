"""Telemetry configured from OTEL_* variables, and the health endpoint's answers."""

from __future__ import annotations

import json

import pytest

from relay.errors import ConfigError
from relay.runtime.health import HealthServer
from relay.runtime.telemetry import setup


def test_with_nothing_set_nothing_is_exported_and_no_span_is_made() -> None:
    telemetry = setup(prometheus=False, env={})
    assert telemetry.tracer is None
    assert telemetry.meter_provider is None
    assert telemetry.registry is None


def test_the_console_exporter_and_an_otlp_endpoint_turn_tracing_on() -> None:
    console = setup(prometheus=False, env={"OTEL_TRACES_EXPORTER": "console"})
    assert console.tracer is not None
    console.shutdown()
    otlp = setup(prometheus=False, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert otlp.tracer is not None
    assert otlp.meter_provider is not None  # metrics follow the endpoint too
    otlp.shutdown()
    off = setup(
        prometheus=False,
        env={"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"},
    )
    assert off.tracer is None
    off.shutdown()


def test_prometheus_gets_a_registry_of_its_own() -> None:
    first = setup(prometheus=True, env={})
    second = setup(prometheus=True, env={})
    assert first.registry is not None
    assert first.registry is not second.registry
    assert first.tracer is None
    first.shutdown()
    second.shutdown()


def test_an_unknown_exporter_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER='jaeger'"):
        setup(prometheus=False, env={"OTEL_TRACES_EXPORTER": "jaeger"})


def server(**overrides: object) -> HealthServer:
    now = [100.0]
    settings: dict[str, object] = {
        "heartbeat": lambda: 99.0,
        "stale_after": 30.0,
        "database": lambda: None,
        "broker_ready": lambda: True,
        "registry": None,
        "clock": lambda: now[0],
    }
    settings.update(overrides)
    return HealthServer("127.0.0.1", 0, **settings)  # type: ignore[arg-type]


def test_healthz_says_whether_the_loop_turns() -> None:
    live = server()
    status, _, body = live.answer("/healthz")
    assert status == 200
    assert json.loads(body)["status"] == "ok"
    stalled = server(heartbeat=lambda: 10.0)
    status, _, body = stalled.answer("/healthz")
    assert status == 503
    assert json.loads(body) == {"status": "stalled", "loop_age_s": 90.0}
    starting = server(heartbeat=lambda: float("-inf"))
    status, _, body = starting.answer("/healthz")
    assert (status, json.loads(body)) == (503, {"status": "stalled", "loop_age_s": None})
    for s in (live, stalled, starting):
        s.stop()


def test_readyz_names_what_is_not_ready() -> None:
    def down() -> None:
        raise RuntimeError("database 127.0.0.1:5432 is not reachable: connection refused")

    s = server(database=down, broker_ready=lambda: False)
    status, content_type, body = s.answer("/readyz")
    assert (status, content_type) == (503, "application/json")
    assert json.loads(body) == {
        "status": "not ready",
        "database": "database 127.0.0.1:5432 is not reachable: connection refused",
        "broker": "not connected",
    }
    s.stop()


def test_metrics_off_and_unknown_paths_are_404() -> None:
    s = server()
    assert s.answer("/metrics")[0] == 404
    assert s.answer("/nope")[0] == 404
    s.stop()


def test_readyz_with_several_databases_lists_each_and_is_ready_while_one_is() -> None:
    states = {"acme": "ok", "globex": "database globex: connection refused"}
    many = server(database=None, databases=lambda: dict(states), broker_node=lambda: "rmq:5672")
    status, _, body = many.answer("/readyz")
    assert status == 200
    assert json.loads(body) == {
        "status": "ok",
        "broker": "ok",
        "databases_ready": "1/2",
        "databases": states,
        "broker_node": "rmq:5672",
    }
    states["acme"] = "starting"
    status, _, body = many.answer("/readyz")
    assert (status, json.loads(body)["status"]) == (503, "not ready")
    states["acme"] = "ok"
    no_broker = server(database=None, databases=lambda: dict(states), broker_ready=lambda: False)
    status, _, body = no_broker.answer("/readyz")
    assert (status, json.loads(body)["broker"]) == (503, "not connected")
    for s in (many, no_broker):
        s.stop()
