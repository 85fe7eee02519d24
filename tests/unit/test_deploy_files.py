"""The deployment files name things that exist: every command, flag, variable, port and probe path
they use is one the code has, and they agree with each other. (No Docker engine runs here, so the
files are parsed, not run.)"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from relay.cli import main as cli
from relay.runtime.health import PATHS

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
    env = compose()["services"]["postgres"]["environment"]
    readme = (ROOT / "README.md").read_text()
    url = (
        f"postgresql+psycopg://{env['POSTGRES_USER']}:{env['POSTGRES_PASSWORD']}"
        f"@localhost:5432/{env['POSTGRES_DB']}"
    )
    assert url in readme


@pytest.mark.parametrize(
    "argv", [["run", "--http-port", "99999"], ["demo-producer", "--rate", "0"]]
)
def test_the_parser_rejects_what_a_typo_in_a_file_would_say(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parses(argv)
