"""The deployment files name things that exist: services the docs and messages point at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_has_the_services_the_demo_tells_people_to_start() -> None:
    demo_source = (ROOT / "relay" / "demo.py").read_text()
    services = _compose()["services"]
    assert "docker compose up -d rabbitmq" in demo_source
    assert "rabbitmq" in services
    assert "5672:5672" in services["rabbitmq"]["ports"]


def test_compose_postgres_matches_the_documented_url() -> None:
    env = _compose()["services"]["postgres"]["environment"]
    readme = (ROOT / "README.md").read_text()
    url = f"postgresql+psycopg://{env['POSTGRES_USER']}:{env['POSTGRES_PASSWORD']}@localhost:5432/{env['POSTGRES_DB']}"
    assert url in readme
