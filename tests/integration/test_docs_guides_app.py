"""The application-side guides of the docs site, run as written against the real services.

Each test reads a named block of a page (tests/docs_blocks.py), points its URLs and names at what
this test owns (a PostgreSQL schema of its own, exchanges and queues of its own), executes it, and
checks what the page says it does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
from outbox.config import settings
from outbox.testing import assert_enqueued, enqueued
from tests.docs_blocks import DOCS, block

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# The URLs the pages show; each test puts its own in their place.
PAGE_PG_URL = "postgresql+psycopg://outbox:outbox@localhost:5432/outbox"
PAGE_AMQP_URL = "amqp://guest:guest@localhost:5672/%2F"


def page_code(path: str, name: str, **replace: str) -> str:
    """The block `name` of `path`, with each text the page shows replaced by this test's own."""
    code = block(path, name)
    for shown, own in replace.items():
        assert shown in code, f"{path} {name}: the block no longer shows {shown!r}"
        code = code.replace(shown, own)
    return code


def run(code: str, namespace: dict[str, Any], where: str) -> dict[str, Any]:
    exec(compile(code, where, "exec"), namespace)
    return namespace


# --------------------------------------------------------------------------- guides/writing.md


def test_writing_example_enqueues_every_option_once(pg_url: str) -> None:
    code = page_code("guides/writing.md", "writing-example", **{PAGE_PG_URL: pg_url})
    first = run(code, {}, "writing.md (writing-example)")
    engine: Engine = first["engine"]
    try:
        # The idempotency key: running the page again returns the first id and writes nothing.
        again = run(code, {}, "writing.md (writing-example)")
        again["engine"].dispose()
        assert again["message_id"] == first["message_id"]
        with Session(engine) as session:
            (found,) = assert_enqueued(
                session,
                exchange="orders",
                routing_key="order.created",
                payload={"order_id": 42},
                key="order-42",
                headers={"tenant": "acme", "version": 2},
                idempotency_key="order-42-created",
                count=1,
            )
        assert found.id == first["message_id"]
        assert found.id.version == 7
        assert found.priority == 5
        assert found.content_type == "application/json"
        assert found.available_at - found.created_at == dt.timedelta(seconds=30)
    finally:
        engine.dispose()


def test_writing_configure_raises_the_payload_limit() -> None:
    before = settings()
    try:
        run(block("guides/writing.md", "writing-configure"), {}, "writing.md (configure)")
        assert settings().max_payload_bytes == 4 * 1024 * 1024
    finally:
        outbox.configure(max_payload_bytes=before.max_payload_bytes)
    assert settings() == before


def test_the_payload_limit_is_what_the_page_says(pg_engine: Engine) -> None:
    assert settings().max_payload_bytes == 1024 * 1024
    assert settings().max_json_depth == 64
    assert settings().max_header_bytes == 16 * 1024
    with Session(pg_engine) as session, session.begin():
        with pytest.raises(outbox.PayloadTooLarge):
            outbox.enqueue(session, exchange="x", routing_key="r", payload=b"x" * (2**20 + 1))
        outbox.enqueue(session, exchange="x", routing_key="r", payload=b"x" * 2**20)


def test_writing_errors_leave_the_transaction_usable(
    pg_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    run(block("guides/writing.md", "writing-errors"), {"engine": pg_engine}, "writing.md (errors)")
    assert "payload cannot be encoded as JSON: Object of type datetime" in capsys.readouterr().out
    with Session(pg_engine) as session:
        (found,) = enqueued(session)
    assert found.payload["order_id"] == 43
    assert dt.datetime.fromisoformat(found.payload["at"]).tzinfo is not None


def test_writing_refusals_named_on_the_page(pg_engine: Engine) -> None:
    """The scoped_session and Engine refusals, the reserved headers, and the errors' homes."""
    from sqlalchemy.orm import scoped_session, sessionmaker

    from outbox.errors import HeadersTooLarge, PayloadTooDeep, UnsupportedDatabase

    scoped = scoped_session(sessionmaker(pg_engine))
    try:
        with pytest.raises(outbox.InvalidSession, match="scoped_session"):
            outbox.enqueue(scoped, exchange="x", routing_key="r", payload={})  # type: ignore[arg-type]
    finally:
        scoped.remove()
    with pytest.raises(outbox.InvalidSession, match="an engine is not a transaction"):
        outbox.enqueue(pg_engine, exchange="x", routing_key="r", payload={})  # type: ignore[arg-type]
    with Session(pg_engine) as session, session.begin():
        for name in ("traceparent", "TraceState", "x-outbox-anything"):
            with pytest.raises(outbox.InvalidHeader, match="reserved"):
                outbox.enqueue(
                    session, exchange="x", routing_key="r", payload={}, headers={name: 1}
                )
        with pytest.raises(HeadersTooLarge):
            outbox.enqueue(session, exchange="x", routing_key="r", payload={},
                           headers={"big": "x" * 17000})  # fmt: skip
        deep: list[Any] = []
        for _ in range(70):
            deep = [deep]
        with pytest.raises(PayloadTooDeep):
            outbox.enqueue(session, exchange="x", routing_key="r", payload=deep)
        with pytest.raises(outbox.InvalidOption):
            outbox.enqueue(session, exchange="x", routing_key="r", payload={}, delay=-1)
        with pytest.raises(outbox.InvalidDestination):
            outbox.enqueue(session, exchange="", routing_key="", payload={})
        assert enqueued(session) == []
    assert not hasattr(outbox, "UnsupportedDatabase")
    assert issubclass(UnsupportedDatabase, outbox.OutboxError)


def test_writing_async_enqueues_in_the_callers_transaction(pg_url: str, pg_engine: Engine) -> None:
    namespace = run(block("guides/writing.md", "writing-async"), {}, "writing.md (async)")

    async def scenario() -> None:
        engine = create_async_engine(pg_url)
        try:
            async with AsyncSession(engine) as session:
                await namespace["place_order"](session, 7)
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    with Session(pg_engine) as session:
        assert_enqueued(session, payload={"order_id": 7}, key="order-7", count=1)


# --------------------------------------------------------------------------- guides/testing.md


def test_testing_example_passes_under_pytest(pg_url: str, tmp_path: Path) -> None:
    """The page's three files, as a project of their own, run by pytest in a subprocess."""
    files = {
        "shop.py": block("guides/testing.md", "testing-app"),
        "conftest.py": page_code(
            "guides/testing.md",
            "testing-conftest",
            **{"postgresql+psycopg://outbox:outbox@localhost:5432/outbox_test": pg_url},
        ),
        "test_shop.py": block("guides/testing.md", "testing-example"),
        "pytest.ini": "[pytest]\nfilterwarnings = error\n",  # not this repository's settings
    }
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_testing_failure_message_is_the_one_shown(pg_engine: Engine) -> None:
    page = (DOCS / "guides" / "testing.md").read_text()
    shown = re.search(r"```text\n(AssertionError: .*?)\n```", page, re.S)
    assert shown is not None
    with Session(pg_engine) as session:
        message_id = outbox.enqueue(
            session, exchange="orders", routing_key="order.created",
            payload={"order_id": 17}, key="17",
        )  # fmt: skip
        with pytest.raises(AssertionError) as failed:
            assert_enqueued(
                session, exchange="orders", routing_key="order.created",
                payload={"id": 17}, key="17",
            )  # fmt: skip
    got = f"AssertionError: {failed.value}".replace(str(message_id), "01a2...")
    assert got == shown.group(1)
