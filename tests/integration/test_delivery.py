"""From `outbox.enqueue` to a consumer: commit and rollback, volume, the wire format, delay and
priority, through a real relay, database and broker."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Engine, String, func, insert, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import outbox
from outbox.amqp_codec import install_float_decoding
from relay.loop.counts import Counts
from tests.support.broker import Broker, Delivery
from tests.support.db import row_count, states
from tests.support.relays import RelayFactory, drive, drive_until_settled
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Base(DeclarativeBase):
    pass


class Order(Base):
    """The caller's own business row, written in the same transaction as the message."""

    __tablename__ = "test_order"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(50))


def order_count(engine: Engine) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).select_from(Order)) or 0)


def wait_all_published(engine: Engine, total: int, *, timeout: float = 10.0) -> None:
    """Wait until `total` rows are published and none is pending or in flight."""
    wait_until(
        lambda: states(engine) == {"published": total},
        timeout=timeout,
        what=f"{total} rows published",
    )


# --------------------------------------------------------------------------- commit / rollback


def test_commit_delivers_and_rollback_never_does_session(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    Base.metadata.create_all(app_engine)
    relay_factory(db_url)

    with Session(app_engine) as session:
        session.begin()
        session.add(Order(customer="rolled back"))
        lost = outbox.enqueue(
            session, exchange=broker.exchange, routing_key="order.created", payload={"n": 1}
        )
        session.rollback()

        session.begin()
        order = Order(customer="committed")
        session.add(order)
        kept = outbox.enqueue(
            session, exchange=broker.exchange, routing_key="order.created", payload={"n": 2}
        )
        # enqueue joined the session's transaction without flushing the caller's objects.
        assert order in session.new
        session.commit()

    broker.collect_ids([kept])
    wait_all_published(app_engine, 1)
    delivered = broker.finish()
    assert [d.message_id for d in delivered] == [str(kept)]
    assert lost != kept
    assert row_count(app_engine, id=lost) == 0
    assert order_count(app_engine) == 1


def test_commit_delivers_and_rollback_never_does_connection(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    Base.metadata.create_all(app_engine)
    relay_factory(db_url)

    with app_engine.connect() as conn:
        with conn.begin() as tx:
            conn.execute(insert(Order).values(customer="rolled back"))
            lost = outbox.enqueue(
                conn, exchange=broker.exchange, routing_key="order.created", payload=[1]
            )
            tx.rollback()
        with conn.begin():
            conn.execute(insert(Order).values(customer="committed"))
            kept = outbox.enqueue(
                conn, exchange=broker.exchange, routing_key="order.created", payload=[2]
            )

    broker.collect_ids([kept])
    wait_all_published(app_engine, 1)
    delivered = broker.finish()
    assert [d.message_id for d in delivered] == [str(kept)]
    assert row_count(app_engine, id=lost) == 0
    assert order_count(app_engine) == 1


def test_an_open_transaction_is_not_delivered_until_it_commits(
    pg_engine: Engine, broker: Broker, relay_factory: RelayFactory, pg_url: str
) -> None:
    relay_factory(pg_url)
    with pg_engine.connect() as conn:
        conn.begin()
        held = outbox.enqueue(conn, exchange=broker.exchange, routing_key="a", payload="held")
        with pg_engine.begin() as other:
            probe = outbox.enqueue(other, exchange=broker.exchange, routing_key="b", payload="b")
        # The relay has claimed past the open transaction's row without seeing it...
        broker.collect_ids([probe])
        assert str(held) not in {d.message_id for d in broker.received}
        conn.commit()
    # ...and publishes it once it is committed.
    broker.collect_ids([held])


# --------------------------------------------------------------------------- volume


@pytest.mark.timeout(180)  # the collect below bounds the wait; this bounds a hang
@pytest.mark.xdist_group("heavy")  # a full-speed drain: not beside another one
def test_ten_thousand_messages_each_arrive_exactly_once_with_their_own_id(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    total, per_transaction = 10_000, 1_000
    relay_factory(db_url)  # running while the application writes
    ids: list[uuid.UUID] = []
    for start in range(0, total, per_transaction):
        with app_engine.begin() as conn:
            ids.extend(
                outbox.enqueue(
                    conn,
                    exchange=broker.exchange,
                    routing_key=f"order.{n % 7}",
                    payload={"n": n},
                    key=f"customer-{n % 13}",
                )
                for n in range(start, start + per_transaction)
            )
    assert len(set(ids)) == total

    # A bound, not a speed: 13 keys allow 13 messages in flight, each key's next one claimed
    # after its settlement, so a loaded machine needs a generous timeout (MariaDB most).
    broker.collect(lambda got: len(got) >= total, timeout=120, what=f"{total} messages")
    wait_all_published(app_engine, total, timeout=15)
    delivered = broker.finish()
    received = [d.message_id for d in delivered]
    assert len(received) == total, f"{len(received) - len(set(received))} duplicates"
    assert set(received) == {str(i) for i in ids}
    # Each body is the one enqueued under that id.
    by_id = {str(i): n for n, i in enumerate(ids)}
    assert all(json.loads(d.body) == {"n": by_id[str(d.message_id)]} for d in delivered)


# --------------------------------------------------------------------------- wire format


@pytest.fixture
def tracer_provider() -> Iterator[TracerProvider]:
    """An SDK tracer provider of the test's own (the global one is left alone)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    yield provider
    provider.shutdown()


def test_wire_format(
    app_engine: Engine,
    broker: Broker,
    relay_factory: RelayFactory,
    db_url: str,
    tracer_provider: TracerProvider,
) -> None:
    headers: dict[str, str | int | float | bool] = {
        "tenant": "acme",
        "unicode": "Grüße ✓",
        "attempt": 3,
        "big": 2**40,
        "negative": -7,
        "urgent": True,
        "quiet": False,
    }
    json_payload = {"order": 7, "name": "Zoë", "lines": [1, 2.5, None, True], "empty": {}}
    text_payload = "plain text, ünïcödé, and a NUL \x00 inside"
    binary_payload = bytes(range(256)) * 3
    tracer = tracer_provider.get_tracer("tests")

    before = time.time()
    with (
        tracer.start_as_current_span("place order") as span,
        app_engine.begin() as conn,
    ):
        traced = outbox.enqueue(
            conn,
            exchange=broker.exchange,
            routing_key="order.created",
            payload=json_payload,
            key="order-7",
            headers=headers,
        )
    with app_engine.begin() as conn:
        as_text = outbox.enqueue(
            conn, exchange=broker.exchange, routing_key="note", payload=text_payload
        )
        as_bytes = outbox.enqueue(
            conn, exchange=broker.exchange, routing_key="blob", payload=binary_payload
        )
        overridden = outbox.enqueue(
            conn,
            exchange=broker.exchange,
            routing_key="blob.proto",
            payload=b"\x08\x96\x01",
            content_type="application/x-protobuf",
        )
        as_list = outbox.enqueue(
            conn, exchange=broker.exchange, routing_key="list", payload=["a", 1]
        )
    after = time.time()

    relay_factory(db_url)
    ids = [traced, as_text, as_bytes, overridden, as_list]
    got: dict[str, Delivery] = {
        str(d.message_id): d for d in broker.collect_ids(ids) if d.message_id is not None
    }

    for message_id in ids:
        props = got[str(message_id)].properties
        assert props.message_id == str(message_id)
        assert props.delivery_mode == 2
        assert int(before) - 1 <= props.timestamp <= after + 1

    first = got[str(traced)]
    assert first.exchange == broker.exchange
    assert first.routing_key == "order.created"
    assert first.properties.content_type == "application/json"
    assert json.loads(first.body.decode("utf-8")) == json_payload
    ctx = span.get_span_context()
    traceparent = first.properties.headers.pop("traceparent")
    version, trace_id, span_id, flags = traceparent.split("-")
    assert (version, trace_id, span_id, flags) == (
        "00",
        f"{ctx.trace_id:032x}",
        f"{ctx.span_id:016x}",
        f"{ctx.trace_flags:02x}",
    )
    assert first.properties.headers == {**headers, "x-outbox-key": "order-7"}

    text = got[str(as_text)]
    assert text.routing_key == "note"
    assert text.properties.content_type == "text/plain; charset=utf-8"
    assert text.body == text_payload.encode("utf-8")
    assert not text.properties.headers  # no key, no headers, no span: nothing added

    blob = got[str(as_bytes)]
    assert blob.properties.content_type == "application/octet-stream"
    assert blob.body == binary_payload

    proto = got[str(overridden)]
    assert proto.properties.content_type == "application/x-protobuf"
    assert proto.body == b"\x08\x96\x01"

    listed = got[str(as_list)]
    assert listed.properties.content_type == "application/json"
    assert json.loads(listed.body) == ["a", 1]


def test_float_header_values_are_published(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    # Sent as AMQP doubles (outbox/amqp_codec.py); this test's consumer decodes them as
    # outbox.Consumer does, since pika by itself would truncate them to integers.
    install_float_decoding()
    floats = {"ratio": 0.25, "negative": -3.5, "large": 1e300, "whole": 2.0}
    with app_engine.begin() as conn:
        sent = outbox.enqueue(
            conn, exchange=broker.exchange, routing_key="r", payload={}, headers=floats
        )
    relay = relay_factory(db_url, run=False)
    drive_until_settled(relay, 1, timeout=5)
    assert states(app_engine) == {"published": 1}
    (delivery,) = broker.collect_ids([sent])
    assert delivery.properties.headers == floats


# --------------------------------------------------------------------------- delay


def test_a_delayed_message_is_published_once_its_delay_has_passed(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    delay = 1.5
    relay_factory(db_url)
    enqueued_at = time.monotonic()
    with app_engine.begin() as conn:
        later = outbox.enqueue(
            conn, exchange=broker.exchange, routing_key="later", payload="later", delay=delay
        )
        now = outbox.enqueue(conn, exchange=broker.exchange, routing_key="now", payload="now")

    received = broker.collect_ids([now, later], timeout=10)
    arrived = {d.message_id: d.received_at - enqueued_at for d in received}
    # The undelayed message shows the relay was polling all along...
    assert arrived[str(now)] < delay
    # ...and the delayed one waited for its time, and not much longer.
    assert delay <= arrived[str(later)] < delay + 3
    assert [d.message_id for d in received] == [str(now), str(later)]


def test_a_message_delayed_by_days_stays_pending(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    relay = relay_factory(db_url, run=False)
    with app_engine.begin() as conn:
        delayed = outbox.enqueue(
            conn,
            exchange=broker.exchange,
            routing_key="later",
            payload="later",
            delay=dt.timedelta(days=3),
        )
        ready = outbox.enqueue(conn, exchange=broker.exchange, routing_key="now", payload="now")

    results = drive_until_settled(relay, 1)
    # Once the ready one is through, a further pass claims nothing.
    assert sum(r.claimed for r in results) == 1
    assert drive(relay, lambda r: True)[0].claimed == 0
    broker.collect_ids([ready])
    counts = relay.store.counts()
    assert counts.by_state == {"pending": 1, "published": 1}
    assert (counts.ready, counts.delayed) == (0, 1)
    assert counts.oldest_ready_age_s is None
    assert row_count(app_engine, id=delayed, state="pending") == 1


# --------------------------------------------------------------------------- priority


def test_higher_priority_rows_are_claimed_first(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    priorities = {"a": 0, "b": 5, "c": -1, "d": 10, "e": 5, "f": 0}
    with app_engine.begin() as conn:
        for name, priority in priorities.items():
            outbox.enqueue(
                conn,
                exchange=broker.exchange,
                routing_key=name,
                payload=name,
                priority=priority,
            )
    # One row per claim, one message in flight at a time: delivery order is claim order.
    relay = relay_factory(db_url, run=False, claim_max=1, max_in_flight=1)
    results = drive_until_settled(relay, len(priorities))
    assert max(r.claimed for r in results) == 1
    broker.collect(lambda got: len(got) == len(priorities))
    # Highest priority first; equal priorities in enqueue order.
    assert [d.body.decode() for d in broker.received] == ["d", "b", "e", "a", "f", "c"]


def test_run_once_reports_what_it_did(
    app_engine: Engine, broker: Broker, relay_factory: RelayFactory, db_url: str
) -> None:
    with app_engine.begin() as conn:
        for n in range(5):
            outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload=[n])
    relay = relay_factory(db_url, run=False, claim_max=2)
    results: list[Counts] = drive_until_settled(relay, 5)
    assert sum(r.claimed for r in results) == 5
    assert sum(r.published for r in results) == 5
    assert sum(r.retried + r.dead for r in results) == 0
    assert [r.full_batch for r in results if r.claimed] == [True, True, False]
    assert relay.in_flight == 0
    assert relay.summary.published == 5
