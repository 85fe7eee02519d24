"""The alert rules under a real Prometheus: promtool checks deploy/prometheus/alerts.yaml, runs the
unit tests recorded off a real relay under real faults (tests/prometheus/alerts_test.yaml, written
by `make alert-series`), and a Prometheus server scrapes a running relay with the rules loaded.

promtool and prometheus come from Debian's `prometheus` package, which scripts/ensure-services.sh
installs: nothing here is skipped when they are missing."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine

import outbox
from tests.prometheus.processes import (
    ALERTS,
    ROOT,
    get,
    start_prometheus,
    start_relay,
    stop,
)
from tests.prometheus.record import OUT as RECORDED
from tests.prometheus.record import alert_rules
from tests.support.broker import Broker
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )


def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_each_alert_fires_on_the_recorded_fault_it_names_and_none_while_healthy() -> None:
    result = promtool("test", "rules", str(RECORDED))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # The recording covers every rule, and a healthy relay whose checks expect no alert at all.
    tests = yaml.safe_load(RECORDED.read_text())["tests"]
    expected = {
        re.search(r'alertname="(\w+)"', s["labels"]).group(1)  # type: ignore[union-attr]
        for t in tests for check in t["promql_expr_test"] for s in check["exp_samples"]
    }  # fmt: skip
    assert expected == set(alert_rules())
    (healthy,) = [t for t in tests if t["name"].startswith("healthy")]
    assert all(check["exp_samples"] == [] for check in healthy["promql_expr_test"])


def api(base: str, path: str, **params: str) -> Any:
    """The `data` of a Prometheus HTTP API answer, or None while it does not answer."""
    body = get(f"{base}{path}?{urllib.parse.urlencode(params)}")
    return None if body is None else json.loads(body)["data"]


def query(base: str, expr: str) -> list[dict[str, Any]]:
    data = api(base, "/api/v1/query", query=expr)
    return [] if data is None else list(data["result"])


def test_a_real_prometheus_scrapes_a_running_relay_with_the_rules_loaded(
    pg_engine: Engine, pg_url: str, broker: Broker, tmp_path: Path
) -> None:
    with pg_engine.begin() as conn:
        for i in range(3):
            outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload={"i": i})
    relay_port, prometheus_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "outbox-relay",
                            "static_configs": [{"targets": [f"127.0.0.1:{relay_port}"]}]}],
    }))  # fmt: skip
    data = tmp_path / "data"
    data.mkdir()
    base = f"http://127.0.0.1:{prometheus_port}"
    relay = start_relay(pg_url, relay_port)
    try:
        server = start_prometheus(config, data, prometheus_port)
        try:
            counter = f'outbox_messages_published_total{{exchange="{broker.exchange}"}}'

            def all_published() -> list[dict[str, Any]]:
                found = query(base, counter)
                return found if found and found[0]["value"][1] == "3" else []

            what = "Prometheus to scrape the 3 messages published"
            (sample,) = wait_until(all_published, timeout=25, interval=0.2, what=what)
            assert sample["metric"]["job"] == "outbox-relay"
            (up,) = query(base, 'up{job="outbox-relay"}')
            assert up["value"][1] == "1"

            def rules() -> list[dict[str, Any]]:
                found = api(base, "/api/v1/rules")
                loaded = [r for g in found["groups"] for r in g["rules"]] if found else []
                return loaded if loaded and all(r["health"] == "ok" for r in loaded) else []

            loaded = wait_until(rules, timeout=10, interval=0.2, what="every rule evaluated, ok")
            assert {r["name"] for r in loaded} == set(alert_rules())
            # A healthy relay behind a fresh server: nothing is firing.
            assert [r["name"] for r in loaded if r["state"] == "firing"] == []
        finally:
            stop(server)
        assert server.returncode == 0, (data / "prometheus.log").read_text()
    finally:
        stop(relay)
