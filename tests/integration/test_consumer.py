"""The consumer helper against the real broker and databases: effectively-once processing.

Every message is delivered twice and the handler's side effects happen once; a crash between
commit and ack is absorbed by the inbox; failures retry through the broker or are dead-lettered
with their reason; a transaction that loses a race runs again, and one that always loses uses its
attempts; waiting never blocks the connection; the inbox purge keeps to its own consumer's rows,
off the connection's thread; the consumer's span joins the producer's trace.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import Engine, event, func, insert, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

import outbox
from outbox.consumer import (
    ATTEMPT_HEADER,
    ERROR_HEADER,
    ConsumerPolicy,
    Handler,
    dead_queue,
    retry_queue,
)
from outbox.schema import inbox
from tests.support.broker import Broker, amqp_connection
from tests.support.waiting import wait_until


@pytest.fixture
def effects(app_engine: Engine) -> Engine:
    """A table the handlers write their side effects to, in the consumer's transaction."""
    with app_engine.begin() as conn:
        conn.execute(text("CREATE TABLE consumer_effects (message_id VARCHAR(64), note TEXT)"))
    return app_engine


def effect_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT message_id, count(*) FROM consumer_effects GROUP BY message_id")
        )
        return {str(m): int(n) for m, n in rows}


def record_effect(session: Session, message: outbox.Message) -> None:
    session.execute(
        text("INSERT INTO consumer_effects (message_id, note) VALUES (:m, :n)"),
        {"m": message.id, "n": message.text()},
    )


def props(message_id: str | None, **headers: Any) -> pika.BasicProperties:
    return pika.BasicProperties(
        message_id=message_id, content_type="text/plain", delivery_mode=2, headers=headers or None
    )


@pytest.fixture
def queue(broker: Broker) -> str:
    name = broker.declare_queue()
    for delay in (1, 2, 4, 8):
        broker.own(retry_queue(name, delay))
    broker.own(dead_queue(name))
    return name


@pytest.fixture
def run_consumer(
    amqp_url: str,
) -> Iterator[Callable[..., outbox.Consumer]]:
    running: list[tuple[outbox.Consumer, threading.Thread]] = []

    def start(engine: Engine, queue: str, handler: Handler, **kw: Any) -> Any:
        consumer = outbox.Consumer(engine, amqp_url, queue, handler, **kw)
        thread = threading.Thread(target=consumer.run, daemon=True)
        thread.start()
        assert consumer.ready.wait(10), "the consumer did not start"
        running.append((consumer, thread))
        return consumer

    yield start
    for consumer, thread in running:
        consumer.stop()
        thread.join(10)
        assert not thread.is_alive(), "run() did not return after stop()"


def test_every_message_delivered_twice_is_processed_once(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    ids = [str(uuid.uuid4()) for _ in range(25)]
    for message_id in ids:
        for copy in ("first", "second"):  # the broker's at-least-once, made certain
            broker.publish(queue, copy.encode(), props(message_id))
    consumer = run_consumer(effects, queue, record_effect)
    counts = consumer.processor.counts
    wait_until(lambda: counts.get("processed", 0) + counts.get("duplicate", 0) == 50)
    assert counts == {"processed": 25, "duplicate": 25}
    assert effect_counts(effects) == dict.fromkeys(ids, 1)
    with effects.connect() as conn:
        inbox = conn.execute(text("SELECT count(*) FROM outbox_inbox")).scalar_one()
    assert inbox == 25
    assert broker.depth(queue) == 0


def test_a_crash_between_commit_and_ack_does_not_run_the_handler_again(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    message_id = str(uuid.uuid4())
    broker.publish(queue, b"once", props(message_id))

    class AckLost:
        """The consuming channel, except that the ack never reaches the broker."""

        def __init__(self, channel: Any) -> None:
            self._channel = channel

        def basic_ack(self, _tag: int) -> None:
            pass

        def __getattr__(self, name: str) -> Any:
            return getattr(self._channel, name)

    first = amqp_connection()
    channel = first.channel()
    method, properties, body = channel.basic_get(queue, auto_ack=False)
    assert method is not None
    processor = outbox.Processor(effects, record_effect, consumer=queue, queue=queue)
    assert processor(AckLost(channel), method, properties, body) == "processed"
    first.close()  # the crash: the unacked delivery goes back to the queue

    consumer = run_consumer(effects, queue, record_effect)
    wait_until(lambda: consumer.processor.counts.get("duplicate") == 1)
    assert effect_counts(effects) == {message_id: 1}


def test_a_failing_handler_is_retried_through_the_broker_then_succeeds(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    attempts: list[int] = []

    def flaky(session: Session, message: outbox.Message) -> None:
        attempts.append(message.attempt)
        record_effect(session, message)  # rolled back with the failure
        if message.attempt == 1:
            raise RuntimeError("downstream timed out")

    message_id = str(uuid.uuid4())
    broker.publish(queue, b"retry me", props(message_id))
    consumer = run_consumer(effects, queue, flaky, policy=ConsumerPolicy(backoff_base=1.0))
    wait_until(lambda: consumer.processor.counts.get("processed") == 1, timeout=15)
    assert attempts == [1, 2]
    assert consumer.processor.counts == {"retried": 1, "processed": 1}
    assert effect_counts(effects) == {message_id: 1}
    assert broker.depth(retry_queue(queue, 1)) == 0


def test_reject_and_exhausted_attempts_are_dead_lettered_with_their_reason(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    def handler(session: Session, message: outbox.Message) -> None:
        record_effect(session, message)
        if message.text() == "poison":
            raise outbox.Reject("order 17 does not exist")
        raise ValueError("always fails")

    poison, failing = str(uuid.uuid4()), str(uuid.uuid4())
    broker.publish(queue, b"poison", props(poison))
    broker.publish(queue, b"failing", props(failing))
    broker.publish(queue, b"anonymous", props(None))
    policy = ConsumerPolicy(max_attempts=2, backoff_base=1.0)
    consumer = run_consumer(effects, queue, handler, policy=policy)
    wait_until(lambda: consumer.processor.counts.get("dead") == 3, timeout=15)
    assert effect_counts(effects) == {}  # every failed attempt rolled back
    with effects.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox_inbox")).scalar_one() == 0

    dead: dict[str | None, Any] = {}
    reader = amqp_connection()
    try:
        channel = reader.channel()
        while True:
            method, properties, _body = channel.basic_get(dead_queue(queue), auto_ack=True)
            if method is None:
                break
            dead[properties.message_id] = properties.headers
    finally:
        reader.close()
    assert set(dead) == {poison, failing, None}
    assert "Reject: order 17 does not exist" in dead[poison][ERROR_HEADER]
    assert "gave up after 2 attempts: ValueError: always fails" in dead[failing][ERROR_HEADER]
    assert dead[failing][ATTEMPT_HEADER] == 2
    assert "no message_id" in dead[None][ERROR_HEADER]


def test_the_process_span_joins_the_producers_trace(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace_id, parent_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    message_id = str(uuid.uuid4())
    broker.publish(
        queue, b"traced", props(message_id, traceparent=f"00-{trace_id}-{parent_span}-01")
    )
    consumer = run_consumer(effects, queue, record_effect, tracer_provider=provider)
    wait_until(lambda: consumer.processor.counts.get("processed") == 1)
    (span,) = exporter.get_finished_spans()
    assert span.name == f"process {queue}"
    assert span.kind is SpanKind.CONSUMER
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == parent_span
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "rabbitmq"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.message.id"] == message_id
    assert attributes["outbox.consumer.outcome"] == "processed"


def test_process_once_is_idempotent_per_consumer(app_engine: Engine) -> None:
    with Session(app_engine) as session, session.begin():
        assert outbox.process_once(session, consumer="billing", message_id="m1")
        assert not outbox.process_once(session, consumer="billing", message_id="m1")
        assert outbox.process_once(session, consumer="shipping", message_id="m1")
    with Session(app_engine) as session, session.begin():
        assert not outbox.process_once(session, consumer="billing", message_id="m1")
    with pytest.raises(outbox.OutboxError), Session(app_engine) as session, session.begin():
        outbox.process_once(session, consumer="", message_id="m1")
    assert outbox.purge_inbox(app_engine, older_than=dt.timedelta(days=1)) == 0
    assert outbox.purge_inbox(app_engine, older_than=dt.timedelta(seconds=-1)) == 2
    assert outbox.purge_inbox(app_engine, older_than=dt.timedelta(seconds=-1)) == 0


# --------------------------------------------------------------------------- failures


def dead_letters(queue: str) -> dict[str | None, Any]:
    """The headers of every message in `queue`'s dead-letter queue, by message id (consumed)."""
    dead: dict[str | None, Any] = {}
    reader = amqp_connection()
    try:
        channel = reader.channel()
        while True:
            method, properties, _body = channel.basic_get(dead_queue(queue), auto_ack=True)
            if method is None:
                return dead
            dead[properties.message_id] = properties.headers
    finally:
        reader.close()


def raise_sqlstate(session: Session, condition: str) -> None:
    """Make PostgreSQL itself fail the handler's statement with `condition`'s SQLSTATE."""
    session.execute(
        text(f"DO $$ BEGIN RAISE EXCEPTION 'simulated' USING ERRCODE = '{condition}'; END $$")
    )


def test_a_handler_that_always_deadlocks_uses_its_attempts_and_is_dead_lettered(
    pg_engine: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    # Counted as "database down", a deadlock would be requeued forever, attempt 1 each time.
    runs: list[int] = []

    def deadlocks(session: Session, message: outbox.Message) -> None:
        runs.append(message.attempt)
        raise_sqlstate(session, "deadlock_detected")

    message_id = str(uuid.uuid4())
    broker.publish(queue, b"doomed", props(message_id))
    policy = ConsumerPolicy(max_attempts=2, backoff_base=1.0, conflict_retries=2)
    consumer = run_consumer(pg_engine, queue, deadlocks, policy=policy)
    wait_until(lambda: consumer.processor.counts.get("dead") == 1, timeout=15)
    assert runs == [1, 1, 1, 2, 2, 2]  # each attempt: a run and two reruns in process
    assert consumer.processor.counts == {"retried": 1, "dead": 1}
    why = dead_letters(queue)[message_id][ERROR_HEADER]
    assert why.startswith("gave up after 2 attempts: conflicted 3 times in a row: ")
    assert "DeadlockDetected" in why


def test_a_conflict_that_clears_runs_again_without_using_an_attempt(
    pg_engine: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    runs: list[int] = []

    def loses_once(session: Session, message: outbox.Message) -> None:
        runs.append(message.attempt)
        session.execute(text("CREATE TABLE IF NOT EXISTS conflict_effects (id TEXT)"))
        session.execute(text("INSERT INTO conflict_effects VALUES (:m)"), {"m": message.id})
        if len(runs) == 1:
            raise_sqlstate(session, "serialization_failure")

    message_id = str(uuid.uuid4())
    broker.publish(queue, b"contended", props(message_id))
    consumer = run_consumer(pg_engine, queue, loses_once)
    wait_until(lambda: consumer.processor.counts.get("processed") == 1)
    assert runs == [1, 1]  # the same attempt, run again here: no trip through a retry queue
    assert consumer.processor.counts == {"processed": 1}
    with pg_engine.connect() as conn:
        assert conn.execute(text("SELECT id FROM conflict_effects")).scalars().all() == [message_id]


class Shutdown(Exception):
    """A driver error carrying PostgreSQL's admin_shutdown SQLSTATE."""

    sqlstate = "57P01"


def test_waiting_to_requeue_does_not_block_the_connection(
    effects: Engine, amqp_url: str, broker: Broker, queue: str
) -> None:
    # Before: the callback slept for db_unavailable_delay inside pika, so nothing else (stop(),
    # heartbeats) happened until it woke up.
    def database_down(_session: Session, _message: outbox.Message) -> None:
        raise OperationalError("SELECT 1", {}, Shutdown("terminating connection"))

    broker.publish(queue, b"waits", props(str(uuid.uuid4())))
    policy = ConsumerPolicy(db_unavailable_delay=60.0)
    consumer = outbox.Consumer(effects, amqp_url, queue, database_down, policy=policy)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: consumer.processor.counts.get("requeued") == 1)
        stopping = time.monotonic()
        consumer.stop()
        thread.join(10)
        assert not thread.is_alive(), "stop() waited for the requeue delay"
        assert time.monotonic() - stopping < 5
    finally:
        consumer.stop()
        thread.join(70)
    assert wait_until(lambda: broker.depth(queue) == 1)  # unacked, so the broker took it back


def test_deliveries_during_a_database_outage_go_back_untried(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    tried: list[str] = []

    def down_at_first(session: Session, message: outbox.Message) -> None:
        tried.append(message.text())
        if len(tried) == 1:
            raise OperationalError("SELECT 1", {}, Shutdown("terminating connection"))
        record_effect(session, message)

    ids = [str(uuid.uuid4()) for _ in range(3)]
    for n, message_id in enumerate(ids):
        broker.publish(queue, f"m{n}".encode(), props(message_id))
    policy = ConsumerPolicy(db_unavailable_delay=1.0)
    consumer = run_consumer(effects, queue, down_at_first, policy=policy)
    wait_until(lambda: consumer.processor.counts.get("processed") == 3, timeout=15)
    assert tried[0] == "m0"
    assert len(tried) == 4  # m1 and m2 arrived during the pause: back to the queue, not run
    assert effect_counts(effects) == dict.fromkeys(ids, 1)


# --------------------------------------------------------------------------- inbox retention


def test_the_purge_deletes_only_its_own_old_rows_in_batches_off_the_connection_thread(
    effects: Engine, broker: Broker, queue: str, run_consumer: Callable[..., outbox.Consumer]
) -> None:
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    new = dt.datetime.now(dt.UTC)
    rows = [("billing", f"old-{n}", old) for n in range(25)]
    rows += [("billing", f"new-{n}", new) for n in range(3)]
    rows += [("shipping", f"old-{n}", old) for n in range(5)]  # another consumer's: kept
    with effects.begin() as conn:
        conn.execute(
            insert(inbox), [{"consumer": c, "message_id": m, "processed_at": t} for c, m, t in rows]
        )
    deletes: list[threading.Thread] = []

    def watch(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            deletes.append(threading.current_thread())

    handler_threads: list[threading.Thread] = []

    def handler(session: Session, message: outbox.Message) -> None:
        handler_threads.append(threading.current_thread())

    event.listen(effects, "before_cursor_execute", watch)
    try:
        consumer = run_consumer(
            effects,
            queue,
            handler,
            name="billing",
            inbox_retention=dt.timedelta(days=7),
            purge_batch_size=10,
        )
        wait_until(lambda: inbox_counts(effects).get(("billing", "old")) is None)
        broker.publish(queue, b"after", props(str(uuid.uuid4())))
        wait_until(lambda: consumer.processor.counts.get("processed") == 1)
    finally:
        event.remove(effects, "before_cursor_execute", watch)
    assert inbox_counts(effects) == {("billing", "new"): 4, ("shipping", "old"): 5}
    assert len(deletes) == 3  # 10 + 10 + 5: one statement per batch, not one per row
    assert handler_threads[0] not in deletes  # pika's connection thread never ran the purge


def inbox_counts(engine: Engine) -> dict[tuple[str, str], int]:
    """Inbox rows by consumer and message-id prefix ("old"/"new"; a uuid counts as "new")."""
    with engine.connect() as conn:
        found = conn.execute(select(inbox.c.consumer, inbox.c.message_id)).all()
    counts: dict[tuple[str, str], int] = {}
    for consumer, message_id in found:
        key = (consumer, "old" if message_id.startswith("old-") else "new")
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_purge_inbox_takes_a_consumer(app_engine: Engine) -> None:
    with Session(app_engine) as session, session.begin():
        for consumer in ("billing", "shipping"):
            outbox.process_once(session, consumer=consumer, message_id="m1")
    past = dt.timedelta(seconds=-1)
    assert outbox.purge_inbox(app_engine, older_than=past, consumer="billing") == 1
    with app_engine.connect() as conn:
        left = conn.execute(select(inbox.c.consumer, func.count()).group_by(inbox.c.consumer))
        assert {str(c): int(n) for c, n in left} == {"shipping": 1}
    with pytest.raises(outbox.OutboxError):
        outbox.purge_inbox(app_engine, older_than=past, batch_size=0)
