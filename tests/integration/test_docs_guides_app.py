"""The application-side guides of the docs site, run as written against the real services.

Each test reads a named block of a page (tests/docs_blocks.py), points its URLs and names at what
this test owns (a PostgreSQL schema of its own, exchanges and queues of its own), executes it, and
checks what the page says it does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pika
import pytest
from sqlalchemy import Engine, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
from outbox.amqp_codec import Properties
from outbox.config import settings
from outbox.consumer import dead_queue, retry_queue
from outbox.schema import inbox
from outbox.testing import assert_enqueued, enqueued
from tests.docs_blocks import DOCS, block
from tests.support.broker import Broker, amqp_connection
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

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
    """Execute a page's code as a module of its own would run (not under this module's
    `from __future__ import annotations`: SQLAlchemy reads the models' annotations)."""
    namespace.setdefault("__name__", "docs_example")
    exec(compile(code, where, "exec", dont_inherit=True), namespace)
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
    out = capsys.readouterr().out
    assert "payload cannot be encoded as JSON: payload['tags']: set is not JSON-encodable" in out
    with Session(pg_engine) as session:
        (found,) = enqueued(session)
    assert found.payload == {"order_id": 43, "tags": ["gift", "new"]}


def test_writing_refusals_named_on_the_page(pg_engine: Engine) -> None:
    """The Engine refusal, the reserved headers, and the errors' homes."""
    from outbox.errors import HeadersTooLarge, PayloadTooDeep, UnsupportedDatabase

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
    # Every error the page names is importable from outbox, as the page says.
    assert outbox.UnsupportedDatabase is UnsupportedDatabase
    assert outbox.PayloadTooDeep is PayloadTooDeep
    assert outbox.HeadersTooLarge is HeadersTooLarge
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


def test_an_autocommit_connection_commits_the_row_at_once(pg_engine: Engine) -> None:
    """What writing.md warns of: nothing refuses autocommit, and the row outlives a rollback."""
    engine = pg_engine.execution_options(isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        outbox.enqueue(conn, exchange="orders", routing_key="order.created", payload={})
        conn.rollback()
    with Session(pg_engine) as session:
        assert len(enqueued(session)) == 1


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


# --------------------------------------------------------------------------- guides/consuming.md

CONSUMING = "guides/consuming.md"


@pytest.fixture
def billing_queue(broker: Broker) -> str:
    """A queue of this test's own in place of the page's billing.orders, bound to the test's
    exchange for order.*; its retry and dead-letter queues are deleted with it."""
    name = broker.declare_queue(bind_to=broker.exchange, binding_key="order.*")
    for delay in (1, 2, 4, 8):
        broker.own(retry_queue(name, delay))
    broker.own(dead_queue(name))
    return name


def consuming_names(pg_url: str, amqp_url: str, queue: str) -> dict[str, str]:
    return {PAGE_PG_URL: pg_url, PAGE_AMQP_URL: amqp_url, '"billing.orders"': json.dumps(queue)}


def definitions(pg_url: str, amqp_url: str, queue: str) -> dict[str, Any]:
    """What the page's consumer example defines (model, engine, handler), without running it."""
    code = page_code(
        CONSUMING,
        "consuming-consumer",
        **consuming_names(pg_url, amqp_url, queue),
        **{"consumer.run()": "pass"},
    )
    return run(code, {}, "consuming.md (consuming-consumer, definitions)")


def invoice_order_ids(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT order_id FROM invoices ORDER BY order_id")).scalars())


def dead_letters(queue: str) -> list[tuple[Any, bytes]]:
    """Everything in `queue`'s dead-letter queue (taken off it): properties and body."""
    found: list[tuple[Any, bytes]] = []
    conn = amqp_connection()
    try:
        channel = conn.channel()
        while True:
            method, properties, body = channel.basic_get(dead_queue(queue), auto_ack=True)
            if method is None:
                return found
            found.append((properties, body))
    finally:
        conn.close()


def test_consuming_consumer_invoices_once_and_dead_letters_the_rejected(
    pg_url: str,
    pg_engine: Engine,
    amqp_url: str,
    broker: Broker,
    billing_queue: str,
    relay_factory: RelayFactory,
) -> None:
    with Session(pg_engine) as session, session.begin():
        good, bad = (
            outbox.enqueue(session, exchange=broker.exchange, routing_key="order.created",
                           payload={"id": order_id, "total": total})
            for order_id, total in ((1, 10), (2, -5))
        )  # fmt: skip
    relay_factory(pg_url)
    code = page_code(
        CONSUMING, "consuming-consumer", **consuming_names(pg_url, amqp_url, billing_queue)
    )
    namespace: dict[str, Any] = {}
    failed: list[BaseException] = []

    def target() -> None:
        try:
            run(code, namespace, "consuming.md (consuming-consumer)")
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        wait_until(lambda: "consumer" in namespace or failed, what="the page's consumer")
        assert not failed, failed
        consumer: outbox.Consumer = namespace["consumer"]
        wait_until(lambda: consumer.processor.counts == {"processed": 1, "dead": 1} or failed,
                   timeout=20, what="one invoice and one dead letter")  # fmt: skip
    finally:
        if "consumer" in namespace:
            namespace["consumer"].stop()
        thread.join(15)
    assert not thread.is_alive(), "run() did not return after stop()"
    assert not failed, failed
    try:
        assert invoice_order_ids(namespace["engine"]) == [1]
    finally:
        namespace["engine"].dispose()
    ((properties, body),) = dead_letters(billing_queue)
    assert properties.message_id == str(bad)
    assert json.loads(body) == {"id": 2, "total": -5}
    assert properties.headers["x-outbox-consumer-error"] == "Reject: negative total"
    assert properties.headers["x-outbox-origin"] == f"{broker.exchange}/order.created"
    assert dt.datetime.fromisoformat(properties.headers["x-outbox-dead-at"]).tzinfo is not None
    assert good != bad


def test_consuming_processor_retries_then_dead_letters_through_the_default_exchange(
    pg_url: str, amqp_url: str, broker: Broker, billing_queue: str
) -> None:
    """The page's own pika loop; the handler asks for one retry, then gives up: the retried
    delivery comes back through the default exchange, as the page says."""
    namespace = definitions(pg_url, amqp_url, billing_queue)
    engine: Engine = namespace["engine"]
    seen: list[tuple[int, str, str]] = []
    page_handler = namespace["on_order"]

    def on_order(session: Session, message: outbox.Message) -> None:
        seen.append((message.attempt, message.exchange, message.routing_key))
        if message.attempt == 1:
            raise outbox.Retry("not yet", delay=1)
        page_handler(session, message)

    namespace["on_order"] = on_order
    message_id = str(uuid.uuid4())
    properties = Properties(  # pika's own cannot send a float header
        message_id=message_id, content_type="application/json", headers={"ratio": 0.5}
    )
    broker.publish("order.created", b'{"id": 3, "total": -1}', properties, exchange=broker.exchange)
    code = page_code(
        CONSUMING,
        "consuming-processor",
        **{PAGE_AMQP_URL: amqp_url, '"billing.orders"': json.dumps(billing_queue)},
    )
    thread = threading.Thread(
        target=run, args=(code, namespace, "consuming.md (processor)"), daemon=True
    )
    thread.start()
    try:
        wait_until(lambda: namespace.get("process") and namespace["process"].counts.get("dead"),
                   timeout=20, what="the message dead-lettered")  # fmt: skip
        assert namespace["process"].counts == {"retried": 1, "dead": 1}
    finally:
        wait_until(lambda: "channel" in namespace)
        namespace["connection"].add_callback_threadsafe(namespace["channel"].stop_consuming)
        thread.join(15)
        namespace["connection"].close()
        engine.dispose()
    assert not thread.is_alive()
    assert seen == [(1, broker.exchange, "order.created"), (2, "", billing_queue)]
    ((dead, _body),) = dead_letters(billing_queue)
    assert dead.headers["x-outbox-origin"] == f"/{billing_queue}"
    assert dead.headers["x-outbox-consumer-error"] == "Reject: negative total"
    assert dead.headers["ratio"] == 0.5  # the float header survives the copies


def test_consuming_process_once_applies_a_duplicate_once(
    pg_url: str, amqp_url: str, broker: Broker, billing_queue: str
) -> None:
    namespace = definitions(pg_url, amqp_url, billing_queue)
    engine: Engine = namespace["engine"]
    run(block(CONSUMING, "consuming-process-once"), namespace, "consuming.md (process_once)")
    properties = pika.BasicProperties(message_id=str(uuid.uuid4()))
    for _ in range(2):  # the broker's at-least-once, made certain
        broker.publish(billing_queue, b'{"id": 4, "total": 1}', properties)
    wait_until(lambda: broker.depth(billing_queue) == 2, what="both copies queued")
    conn = amqp_connection()
    try:
        channel = conn.channel()
        for _ in range(2):
            method, got, body = channel.basic_get(billing_queue, auto_ack=False)
            assert method is not None
            namespace["on_delivery"](channel, method, got, body)
        assert broker.depth(billing_queue) == 0
        assert invoice_order_ids(engine) == [4]
    finally:
        conn.close()
        engine.dispose()


def test_consuming_purge_clears_old_and_retired_rows(pg_url: str, amqp_url: str) -> None:
    namespace = definitions(pg_url, amqp_url, "unused")
    engine: Engine = namespace["engine"]
    try:
        with Session(engine) as session, session.begin():
            for consumer in ("billing", "old-billing"):
                outbox.process_once(session, consumer=consumer, message_id="m1")
            session.execute(
                update(inbox)
                .where(inbox.c.consumer == "billing")
                .values(processed_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=8))
            )
            outbox.process_once(session, consumer="billing", message_id="m2")
        run(block(CONSUMING, "consuming-purge"), {"engine": engine}, "consuming.md (purge)")
        with engine.connect() as conn:
            left = conn.execute(select(inbox.c.consumer, inbox.c.message_id)).all()
        assert [tuple(row) for row in left] == [("billing", "m2")]
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- guides/consumers.md


def test_aio_pika_example_reads_what_the_relay_published(
    pg_url: str,
    pg_engine: Engine,
    amqp_url: str,
    broker: Broker,
    billing_queue: str,
    relay_factory: RelayFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import aio_pika

    with Session(pg_engine) as session, session.begin():
        to = broker.exchange
        order = outbox.enqueue(
            session,
            exchange=to,
            routing_key="order.created",
            payload={"id": 5, "total": 3},
            key="order-5",
        )
        headers: dict[str, str | int | float | bool] = {"ratio": 0.25, "n": 3, "ok": True}
        note = outbox.enqueue(
            session, exchange=to, routing_key="order.noted", payload="Grüße", headers=headers
        )
        blob = outbox.enqueue(
            session, exchange=to, routing_key="order.blob", payload=b"\x00\xff raw"
        )
    code = page_code(
        "guides/consumers.md",
        "aio-pika-example",
        **{PAGE_AMQP_URL: amqp_url, '"billing.orders"': json.dumps(billing_queue)},
    )
    namespace = run(code, {}, "consumers.md (aio-pika-example)")
    got: dict[str, Any] = {}

    async def scenario() -> str:
        # The page's handler sees the JSON message; the others are read here, each as sent.
        original = namespace["on_message"]

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            if message.content_type == "application/json":
                await original(message)
            else:
                async with message.process():
                    got[str(message.message_id)] = message
            got.setdefault("all", []).append(message.message_id)

        namespace["on_message"] = on_message
        stop = asyncio.Event()
        consuming = asyncio.create_task(namespace["consume"](stop))
        relay_factory(pg_url)
        deadline = asyncio.get_running_loop().time() + 20
        out = ""
        while len(got.get("all", [])) < 3 or str(order) not in out:
            assert asyncio.get_running_loop().time() < deadline, f"received {got}"
            await asyncio.sleep(0.05)
            out += capsys.readouterr().out
        stop.set()
        await consuming
        return out

    out = asyncio.run(scenario())
    assert f"{order} order-5 {{'id': 5, 'total': 3}}" in out
    text_message, bytes_message = got[str(note)], got[str(blob)]
    assert text_message.body.decode(text_message.content_encoding) == "Grüße"
    assert text_message.content_type == "text/plain; charset=utf-8"
    assert text_message.headers == {"ratio": 0.25, "n": 3, "ok": True}
    assert type(text_message.headers["ratio"]) is float
    assert bytes_message.body == b"\x00\xff raw"
    assert bytes_message.content_encoding == "binary"
    assert bytes_message.timestamp is not None


# --------------------------------------------------------------------------- guides/flask.md


def test_flask_example_commits_the_message_with_the_order(
    pg_url: str, broker: Broker, relay_factory: RelayFactory
) -> None:
    from flask import Flask

    code = page_code(
        "guides/flask.md",
        "flask-example",
        **{'exchange="orders"': f"exchange={json.dumps(broker.exchange)}"},
    )
    namespace = run(code, {"__name__": "shop"}, "flask.md (flask-example)")
    app: Flask = namespace["create_app"](pg_url)
    db = namespace["db"]
    with app.app_context():
        db.create_all()
        outbox.create_schema(db.engine)
    client = app.test_client()
    placed = client.post("/orders", json={"total": 5})
    assert placed.status_code == 201
    assert client.post("/orders", json={"total": -1}).status_code == 400
    order_id = placed.get_json()["id"]
    with app.app_context():
        assert enqueued(db.session, exchange="x") == []  # the scoped_session itself
        (message,) = assert_enqueued(db.session(), exchange=broker.exchange)
        assert message.payload == {"id": order_id}
        assert message.key == str(order_id)
        assert db.session.execute(text("SELECT id FROM orders")).scalars().all() == [order_id]
    relay_factory(pg_url)
    (delivery,) = broker.collect_ids([message.id])
    assert json.loads(delivery.body) == {"id": order_id}
    with app.app_context():
        db.engine.dispose()
