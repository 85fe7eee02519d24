"""Traces and metrics through the real CLI: `OTEL_TRACES_EXPORTER=console`, and /metrics scraped
while a backlog drains."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine

import outbox
from relay.core.urls import node_name
from tests.support.broker import AMQP_URL, Broker
from tests.support.cli import environment
from tests.support.waiting import wait_until


def start_relay(db_url: str, cwd: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "relay", "--db", db_url, "--amqp", AMQP_URL, "run",
         "--poll-interval", "0.05", "--drain-timeout", "5", *args],
        cwd=cwd,
        env=environment(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return out, err


def json_documents(text: str) -> list[dict[str, Any]]:
    """The console exporter prints indented JSON objects one after another."""
    decoder, i = json.JSONDecoder(), 0
    docs: list[dict[str, Any]] = []
    while True:
        start = text.find("{", i)
        if start < 0:
            return docs
        doc, i = decoder.raw_decode(text, start)
        docs.append(doc)


def test_the_console_exporter_shows_the_send_span_in_the_producers_trace(
    app_engine: Engine, broker: Broker, db_url: str, tmp_path: Path
) -> None:
    app = TracerProvider().get_tracer("app")
    with app.start_as_current_span("POST /orders") as request, app_engine.begin() as conn:
        message_id = outbox.enqueue(
            conn, exchange=broker.exchange, routing_key="order.created", payload={"id": 7}
        )
    process = start_relay(db_url, tmp_path, OTEL_TRACES_EXPORTER="console",
                          OTEL_SERVICE_NAME="billing-relay")  # fmt: skip
    try:
        (delivery,) = broker.collect_ids([message_id], timeout=20)
    finally:
        out, _ = stop(process)
    spans = [d for d in json_documents(out) if d.get("name", "").startswith("send ")]
    assert len(spans) == 1, out
    send = spans[0]
    context = request.get_span_context()
    assert send["context"]["trace_id"] == f"0x{context.trace_id:032x}"
    assert send["parent_id"] == f"0x{context.span_id:016x}"
    assert send["kind"] == "SpanKind.PRODUCER"
    assert send["attributes"]["messaging.message.id"] == str(message_id)
    assert send["attributes"]["outbox.outcome"] == "published"
    assert send["resource"]["attributes"]["service.name"] == "billing-relay"
    span_id = send["context"]["span_id"][2:]
    assert delivery.properties.headers["traceparent"].split("-")[2] == span_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_scraped_during_a_run_show_the_backlog_draining_to_zero(
    app_engine: Engine, broker: Broker, db_url: str, tmp_path: Path
) -> None:
    n = 600
    with app_engine.begin() as conn:
        ids = [
            outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload=str(i))
            for i in range(n)
        ]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # A rate limit stretches the drain over seconds, so scrapes see it happen.
    process = start_relay(db_url, tmp_path, "--http-port", str(port),
                          "--rate-limit", f"{broker.exchange}=200")  # fmt: skip
    try:
        wait_until(lambda: get(f"{base}/healthz")[0] == 200, timeout=15, what="/healthz")
        status, body = get(f"{base}/readyz")
        ready = {"status": "ok", "database": "ok", "broker": "ok",
                 "broker_node": node_name(AMQP_URL)}  # fmt: skip
        assert (status, json.loads(body)) == (200, ready)
        pending: list[float] = []

        def drained() -> bool:
            _, text = get(f"{base}/metrics")
            value = sample(text, "outbox_messages", state="pending")
            if value is not None:
                pending.append(value)
            return value == 0 and sample(text, "outbox_messages", state="published") == n

        wait_until(drained, timeout=30, interval=0.2, what="the backlog drained in /metrics")
        _, text = get(f"{base}/metrics")
    finally:
        stop(process)
    broker.collect_ids(ids, timeout=20)
    assert max(pending) > 0, pending  # seen while it drained, not only afterwards
    assert pending == sorted(pending, reverse=True)
    assert sample(text, "outbox_messages_published_total", exchange=broker.exchange) == n
    assert sample(text, "outbox_relays_alive") == 1
    assert sample(text, "outbox_oldest_ready_age_seconds") == 0
    assert re.search(r"^outbox_publish_latency_milliseconds_count\S* 600", text, re.M), text
    assert sample(text, "outbox_circuit_state", resource=f"127.0.0.1:5672/%2F/{broker.exchange}") \
        == 0  # fmt: skip


def test_a_port_in_use_exits_2_with_one_line(
    app_engine: Engine, db_url: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start_relay(
            db_url, tmp_path, "--http-port", str(port), "--http-host", "127.0.0.1"
        )
        _, err = process.communicate(timeout=30)
    assert process.returncode == 2, err
    assert err.strip().splitlines() == [
        line for line in err.strip().splitlines() if "cannot listen on" in line
    ]
    assert "Traceback" not in err
