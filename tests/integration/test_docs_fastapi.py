"""The FastAPI example of docs/guides/fastapi.md, exactly as written there, run with FastAPI's
TestClient against a real database: a good request commits the order and its message, a bad one
enqueues nothing."""

from __future__ import annotations

import importlib.util
import sys
import uuid
import warnings
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import Engine, func, select, text
from starlette.exceptions import StarletteDeprecationWarning

import outbox
from outbox.testing import enqueued
from tests.docs_blocks import block
from tests.support.db import make_app_engine

with warnings.catch_warnings():
    # Starlette 1.x asks for `httpx2` (not installed here) and warns on import; httpx works.
    warnings.filterwarnings(
        "ignore", "Using `httpx` with `starlette.testclient`", StarletteDeprecationWarning
    )
    from fastapi.testclient import TestClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def load_example(path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import the snippet as the module an application would have (removed at teardown)."""
    name = f"docs_fastapi_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["postgresql", "sqlite"])
def database(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database of the test's own, as the sync URL; DATABASE_URL is its async form."""
    if request.param == "postgresql":
        url = str(request.getfixturevalue("pg_url"))  # psycopg: the same URL is async-capable
        monkeypatch.setenv("DATABASE_URL", url)
    else:
        url = str(request.getfixturevalue("sqlite_url"))
        monkeypatch.setenv("DATABASE_URL", url.replace("sqlite://", "sqlite+aiosqlite://", 1))
    return url


def order_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(text("orders"))).scalar_one())


def test_the_documented_endpoint_enqueues_with_its_order_and_nothing_for_a_bad_request(
    database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shop.py"
    path.write_text(block("guides/fastapi.md", "fastapi-example"), encoding="utf-8")
    shop = load_example(path, monkeypatch)

    engine = make_app_engine(database)
    try:
        outbox.create_schema(engine)
        shop.Base.metadata.create_all(engine)

        with TestClient(shop.app) as client:
            placed = client.post("/orders", json={"reference": "A-1", "total_cents": 1250})
            assert placed.status_code == 201, placed.text
            invalid = client.post("/orders", json={"reference": "A-2", "total_cents": 0})
            assert invalid.status_code == 422, invalid.text
            again = client.post("/orders", json={"reference": "A-1", "total_cents": 990})
            assert again.status_code == 409, again.text
            assert "A-1 exists" in again.text

        with engine.connect() as conn:
            [message] = enqueued(conn)
        assert str(message.id) == placed.json()["message_id"]
        assert (message.exchange, message.routing_key) == ("orders", "order.created")
        assert message.payload == {"reference": "A-1", "total_cents": 1250}
        assert message.key == "A-1"
        assert order_count(engine) == 1
    finally:
        engine.dispose()
