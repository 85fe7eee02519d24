"""The deployment files name things that exist: every command, flag, variable, port and probe path
they use is one the code has, and they agree with each other. (No Docker engine runs here, so the
files are parsed, not run.)"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from relay.cli import main as cli
from relay.core.circuit import CircuitState, Transition
from relay.core.failures import Classified, FailureClass
from relay.core.policy import Dead, Retry
from relay.loop.observer import Observer, SlotReading
from relay.runtime.health import PATHS
from relay.runtime.telemetry import setup
from tests.unit.fakes import EPOCH, FakeStore, make_claimed

ROOT = Path(__file__).resolve().parents[2]
# Standard OpenTelemetry SDK variables (read by the SDK, or by relay/runtime/telemetry.py).
OTEL_VARIABLES = {
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_RESOURCE_ATTRIBUTES",
}
OUR_IMAGE = "outbox-relay:latest"


def load(path: str) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d is not None]
    assert docs, path
    return docs


def compose() -> dict[str, Any]:
    (data,) = load("docker-compose.yml")
    return data


def code_text() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "relay").rglob("*.py"))


def parses(argv: list[str]) -> None:
    """The CLI accepts `argv` (global options from the environment, as in a container)."""
    cli.build_parser().parse_args(argv)


def test_compose_has_every_service_of_the_full_path() -> None:
    services = compose()["services"]
    assert set(services) >= {
        "postgres", "rabbitmq", "jaeger", "otel-collector", "migrate", "relay",
        "demo-producer", "demo-consumer",
    }  # fmt: skip
    assert "management" in services["rabbitmq"]["image"]
    assert "5672:5672" in services["rabbitmq"]["ports"]
    # The hint printed when the broker cannot be reached names a service this file defines.
    hint_source = (ROOT / "relay" / "amqp" / "topology.py").read_text()
    assert "docker compose up -d rabbitmq" in hint_source


def our_services() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, service in compose()["services"].items():
        if service.get("build") == ".":
            yield name, service


def test_every_compose_command_of_our_image_is_one_the_cli_accepts() -> None:
    commands = {name: s["command"] for name, s in our_services()}
    assert set(commands) == {"migrate", "relay", "demo-producer", "demo-consumer"}
    for argv in commands.values():
        parses(argv)


def test_every_variable_the_deployment_files_set_is_read_by_the_code_or_the_sdk() -> None:
    code = code_text()
    names: set[str] = set()
    for _, service in our_services():
        names |= set(service["environment"])
    for doc in load("deploy/kubernetes/relay-sidecar.yaml"):
        for container in containers(doc):
            if container["image"] == OUR_IMAGE:
                names |= {e["name"] for e in container.get("env", [])}
    assert {n for n in names if n.startswith("OUTBOX_")} >= {"OUTBOX_DB_URL", "OUTBOX_AMQP_URL"}
    for name in names:
        if name.startswith("OUTBOX_"):
            assert f'"{name}"' in code, f"{name} is set but never read"
        else:
            assert name in OTEL_VARIABLES, f"{name} is not a variable anything reads"


def test_the_relay_health_check_and_port_match_its_http_flag() -> None:
    relay = compose()["services"]["relay"]
    port = relay["command"][relay["command"].index("--http-port") + 1]
    assert f"{port}:{port}" in relay["ports"]
    probe = " ".join(relay["healthcheck"]["test"])
    path = re.search(rf"127\.0\.0\.1:{port}(/\w+)", probe)
    assert path is not None
    assert path.group(1) in PATHS
    drain = float(relay["command"][relay["command"].index("--drain-timeout") + 1])
    assert float(relay["stop_grace_period"].rstrip("s")) > drain


def test_the_collector_receives_where_the_services_export_and_sends_traces_to_jaeger() -> None:
    (config,) = load("deploy/otel-collector.yaml")
    endpoint = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    for _, service in our_services():
        target = service["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
        assert target == f"http://otel-collector:{endpoint.rsplit(':', 1)[1]}"
    pipelines = config["service"]["pipelines"]
    exporters = config["exporters"]
    for pipeline in pipelines.values():
        assert set(pipeline["receivers"]) <= set(config["receivers"])
        assert set(pipeline["exporters"]) <= set(exporters)
        assert set(pipeline.get("processors", [])) <= set(config["processors"])
    jaeger = [e for e in pipelines["traces"]["exporters"] if e.startswith("otlp")]
    assert exporters[jaeger[0]]["endpoint"].split(":")[0] == "jaeger"
    assert "jaeger" in compose()["services"]
    mount = compose()["services"]["otel-collector"]["volumes"][0]
    assert mount.startswith("./deploy/otel-collector.yaml:")
    assert (ROOT / mount.split(":")[0]).exists()


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", []))


def test_the_kubernetes_sidecar_runs_a_real_command_with_probes_on_real_paths() -> None:
    docs = {d["kind"]: d for d in load("deploy/kubernetes/relay-sidecar.yaml")}
    assert set(docs) == {"Job", "Deployment"}
    (migrate,) = containers(docs["Job"])
    parses(migrate["args"])
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (relay,) = [c for c in pod["containers"] if c["image"] == OUR_IMAGE]
    parses(relay["args"])
    port = int(relay["args"][relay["args"].index("--http-port") + 1])
    assert [p["containerPort"] for p in relay["ports"]] == [port]
    for probe in ("livenessProbe", "readinessProbe"):
        get = relay[probe]["httpGet"]
        assert get["path"] in PATHS
        assert get["port"] == port
    assert relay["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert relay["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in relay["env"]}
    drain = float(env["OUTBOX_DRAIN_TIMEOUT"]["value"])
    assert pod["terminationGracePeriodSeconds"] > drain + 10
    assert relay["resources"]["limits"]["memory"]


def test_the_kubernetes_collector_mounts_the_shared_configuration() -> None:
    docs = {d["kind"]: d for d in load("deploy/kubernetes/otel-collector.yaml")}
    (collector,) = containers(docs["Deployment"])
    assert collector["args"] == ["--config=/etc/otelcol/config.yaml"]
    ports = {p["port"] for p in docs["Service"]["spec"]["ports"]}
    (config,) = load("deploy/otel-collector.yaml")
    http = int(config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rsplit(":", 1)[1])
    assert http in ports
    header = (ROOT / "deploy/kubernetes/otel-collector.yaml").read_text()
    assert "--from-file=config.yaml=deploy/otel-collector.yaml" in header


def test_the_image_runs_the_cli_and_exposes_the_http_port() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["outbox-relay"]' in dockerfile
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None
    argv = yaml.safe_load(cmd.group(1))
    parses(argv)
    assert f"EXPOSE {argv[argv.index('--http-port') + 1]}" in dockerfile


def test_compose_postgres_matches_the_documented_url() -> None:
    """The deployment page gives the URL of compose's PostgreSQL as seen from the host."""
    env = compose()["services"]["postgres"]["environment"]
    page = (ROOT / "docs" / "operations" / "deploying.md").read_text()
    url = (
        f"postgresql+psycopg://{env['POSTGRES_USER']}:{env['POSTGRES_PASSWORD']}"
        f"@localhost:5432/{env['POSTGRES_DB']}"
    )
    assert url in page


@pytest.mark.parametrize(
    "argv", [["run", "--http-port", "99999"], ["demo-producer", "--rate", "0"]]
)
def test_the_parser_rejects_what_a_typo_in_a_file_would_say(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parses(argv)


# --------------------------------------------------------------------------- alerts and dashboard

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_REFERENCE = re.compile(r"\b(outbox_[a-z0-9_]+)\b(\{[^}]*\})?")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def exported_metrics() -> dict[str, dict[str, set[str]]]:
    """What the relay's /metrics serves: each sample name with its labels and their values.

    Built as `run --http-port` builds it (relay.runtime.telemetry with a Prometheus reader, the
    loop's Observer), each instrument recorded once through the Observer's own methods, and read
    back in the Prometheus text format, so a renamed metric or unit shows up here."""
    telemetry = setup(prometheus=True, env={})
    try:
        observer = Observer(None, telemetry.meter)
        store = FakeStore()
        store.add(make_claimed(1), make_claimed(2), make_claimed(3))
        store.alive["r1"] = EPOCH
        observer.watch(store, lambda: {"ex": CircuitState.OPEN})
        observer.watch_capture(lambda: SlotReading("outbox_relay", 1024, "reserved", True, 2))
        observer.claimed(3)
        rows = {seq: make_claimed(seq) for seq in (1, 2, 3)}
        failure = Classified(FailureClass.UNROUTABLE, "NO_ROUTE")
        decisions: list[Retry | Dead] = [Retry(2, EPOCH, True, failure), Dead(3, failure, "x")]
        observer.settled(rows, {}, [1], decisions, EPOCH + dt.timedelta(seconds=1))
        observer.circuit_changed(Transition("ex", CircuitState.CLOSED, CircuitState.OPEN, "5"))
        assert telemetry.registry is not None
        text = generate_latest(telemetry.registry).decode()
    finally:
        telemetry.shutdown()
    metrics: dict[str, dict[str, set[str]]] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found is None or line.startswith("#"):
            continue
        labels = metrics.setdefault(found.group(1), {})
        for name, value in _LABEL.findall(found.group(2) or ""):
            labels.setdefault(name, set()).add(value)
    return metrics


def check_expression(expr: str, metrics: dict[str, dict[str, set[str]]]) -> set[str]:
    """The outbox metrics `expr` names, each checked against what the relay exports: the
    metric, every label it selects on (and the value, where the relay's values are fixed), and
    every label it groups by."""
    assert expr.count("(") == expr.count(")"), expr
    assert expr.count("{") == expr.count("}"), expr
    named = set()
    for name, selector in _REFERENCE.findall(expr):
        assert name in metrics, f"{name} is not a metric the relay exports ({expr})"
        named.add(name)
        for label, value in _LABEL.findall(selector):
            assert label in metrics[name], f"{name} has no label {label} ({expr})"
            assert value in metrics[name][label], f"{name}{{{label}}} is never {value!r}"
    assert named, f"names no outbox metric: {expr}"
    labels = set().union(*(metrics[n] for n in named)) | {"le"}
    for group in _GROUPING.findall(expr):
        for label in (g.strip() for g in group.split(",") if g.strip()):
            assert label in labels, f"groups by {label}, which {sorted(named)} do not carry"
    return named


def test_every_metric_the_relay_defines_is_served() -> None:
    names = set(exported_metrics())
    assert {
        "outbox_messages", "outbox_oldest_ready_age_seconds", "outbox_messages_published_total",
        "outbox_messages_failed_total", "outbox_claim_batch_size_count", "outbox_circuit_state",
        "outbox_circuit_transitions_total", "outbox_relays_alive",
    } <= names  # fmt: skip
    assert "outbox_publish_latency_milliseconds_bucket" in names


def test_the_alerts_name_only_metrics_and_labels_the_relay_exports() -> None:
    metrics = exported_metrics()
    ((document,),) = [load("deploy/prometheus/alerts.yaml")]
    (group,) = document["groups"]
    rules = group["rules"]
    assert len({r["alert"] for r in rules}) == len(rules)
    named: set[str] = set()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule["alert"]
        named |= check_expression(rule["expr"], metrics)
    # What the issue asks alerts for: a stuck backlog, dead messages growing, a circuit open
    # for long, no relay alive.
    assert {"outbox_oldest_ready_age_seconds", "outbox_messages_failed_total",
            "outbox_circuit_state", "outbox_relays_alive"} <= named  # fmt: skip


def test_the_dashboard_names_only_exported_metrics_and_lays_out_its_panels() -> None:
    metrics = exported_metrics()
    dashboard = json.loads((ROOT / "deploy/grafana/outbox-relay.json").read_text())
    (variable,) = dashboard["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "datasource", "datasource", "prometheus")  # fmt: skip
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    named: set[str] = set()
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] >= 0, panel["title"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        xs, ys = range(g["x"], g["x"] + g["w"]), range(g["y"], g["y"] + g["h"])
        mine = {(x, y) for x in xs for y in ys}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            named |= check_expression(t["expr"], metrics)
    # Every metric the relay exports has a place on the dashboard.
    families = {re.sub(r"_(bucket|count|sum)$", "", n) for n in metrics if n.startswith("outbox_")}
    shown = {re.sub(r"_(bucket|count|sum)$", "", n) for n in named}
    assert families <= shown, f"not on the dashboard: {sorted(families - shown)}"
