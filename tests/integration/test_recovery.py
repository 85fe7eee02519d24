"""Every failure ends in a known state and can be recovered (the failure-handling issue).

Real broker, real databases, real processes: the relay is killed with SIGKILL between the
broker's confirm and the database write; the broker is really blocked by a memory alarm.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

import outbox
from outbox.schema import attempt, message
from tests.support.broker import Broker
from tests.support.cli import cli
from tests.support.db import states
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def _enqueue(engine: Engine, exchange: str, n: int, routing_key: str = "r.k") -> list[uuid.UUID]:
    with Session(engine) as session, session.begin():
        return [
            outbox.enqueue(session, exchange=exchange, routing_key=routing_key, payload={"n": i})
            for i in range(n)
        ]


def _row(engine: Engine, message_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(message).where(message.c.id == message_id)).one()


def _history(engine: Engine, message_id: uuid.UUID) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                select(attempt).where(attempt.c.message_id == message_id).order_by(attempt.c.id)
            )
        )


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("--db", db_url, *args, timeout=60)


def test_unroutable_messages_die_with_history_and_replay_delivers_them_with_the_same_id(
    db_url: str, app_engine: Engine, broker: Broker, relay_factory: RelayFactory
) -> None:
    # A second exchange with no queue bound yet: everything sent there is unroutable.
    orphan = broker.declare_exchange()
    ids = _enqueue(app_engine, orphan, 3, routing_key="invoice.paid")
    relay_factory(db_url)
    wait_until(lambda: states(app_engine).get("dead") == 3, what="3 dead messages")

    for message_id in ids:
        row = _row(app_engine, message_id)
        assert row.state == "dead"
        assert "NO_ROUTE" in row.last_error
        [record] = _history(app_engine, message_id)
        assert (record.failure_class, record.outcome, record.attempt) == ("unroutable", "dead", 1)
        assert record.relay_id.startswith("test-relay-")

    listed = _cli(db_url, "messages", "--state", "dead", "--error-contains", "NO_ROUTE", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {m["id"] for m in json.loads(listed.stdout)} == {str(i) for i in ids}

    # The operator fixes the topology, then replays.
    queue = broker.declare_queue(bind_to=orphan, binding_key="invoice.*")
    replayed = _cli(db_url, "replay", "--state", "dead", "--exchange", orphan)
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 3 message(s)" in replayed.stdout
    wait_until(lambda: states(app_engine).get("published") == 3, what="3 published")

    assert broker.depth(queue) == 3
    shown = json.loads(_cli(db_url, "show", str(ids[0]), "--json").stdout)
    assert shown["replay_count"] == 1
    assert [h["outcome"] for h in shown["attempt_history"]] == ["dead", "replayed"]
    assert shown["state"] == "published"


def test_a_relay_killed_between_confirm_and_mark_leads_to_a_republish_with_the_same_id(
    pg_url: str, pg_engine: Engine, broker: Broker, relay_factory: RelayFactory, amqp_url: str
) -> None:
    ids = _enqueue(pg_engine, broker.exchange, 20)
    doomed = subprocess.run(
        [sys.executable, "-m", "tests.faults.crash_before_mark", pg_url, amqp_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert doomed.returncode == -9, doomed.stderr  # SIGKILL, after the confirms
    assert "dying before marking" in doomed.stdout
    # The broker has every message once; the database still says in flight.
    broker.collect_ids(ids)
    assert states(pg_engine) == {"in_flight": 20}

    relay_factory(pg_url)  # takes over when the dead relay's 3 s lease expires
    wait_until(lambda: states(pg_engine) == {"published": 20}, timeout=20, what="all published")
    received = broker.collect(lambda got: len(got) >= 40, what="the republished copies")
    assert {d.message_id for d in received} == {str(i) for i in ids}
    assert sorted(str(d.message_id) for d in received) == sorted(str(i) for i in ids * 2)
    history = _history(pg_engine, ids[0])
    assert [(h.failure_class, h.relay_id) for h in history] == [("ambiguous", history[0].relay_id)]
    assert "doomed" in history[0].error


def test_retries_back_off_then_dead_letter_after_max_attempts(
    db_url: str, app_engine: Engine, broker: Broker, relay_factory: RelayFactory
) -> None:
    # A full queue that rejects publishes: every attempt is nacked.
    full = broker.declare_exchange()
    broker.declare_queue(
        bind_to=full, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    with Session(app_engine) as session, session.begin():
        message_id = outbox.enqueue(
            session, exchange=full, routing_key="k", payload="x", max_attempts=3
        )
    relay_factory(db_url, policy=_fast_policy())
    wait_until(lambda: _row(app_engine, message_id).state == "dead", timeout=20, what="dead")

    history = _history(app_engine, message_id)
    assert [(h.attempt, h.failure_class, h.outcome) for h in history] == [
        (1, "rejected", "retry"),
        (2, "rejected", "retry"),
        (3, "rejected", "dead"),
    ]
    # Backoff times were persisted and grew from one attempt to the next.
    assert history[0].next_attempt_at is not None
    assert history[1].next_attempt_at is not None
    assert _row(app_engine, message_id).last_error.startswith("gave up after 3 attempts")


def _fast_policy() -> Any:
    from relay.core.policy import RetryPolicy

    return RetryPolicy(base=0.05, cap=0.2, floor=0.01)


def test_cancel_stops_a_pending_message_and_says_when_it_is_too_late(
    db_url: str, app_engine: Engine
) -> None:
    later, sent = _enqueue(app_engine, "ex", 2)
    with app_engine.begin() as conn:
        conn.execute(message.update().where(message.c.id == sent).values(state="in_flight"))
    result = _cli(db_url, "cancel", str(later), str(sent))
    assert result.returncode == 1
    assert f"{later}  cancelled" in result.stdout
    assert f"{sent}  too late: the message is in_flight" in result.stdout
    assert _row(app_engine, later).state == "cancelled"
    again = _cli(db_url, "cancel", str(later), "--json")
    assert json.loads(again.stdout) == {str(later): "cancelled"}


@pytest.fixture
def memory_alarm() -> Iterator[Any]:
    """Raise a real memory alarm on the broker (every publisher is blocked); restore it after."""
    before = subprocess.run(
        ["rabbitmqctl", "eval", "vm_memory_monitor:get_vm_memory_high_watermark()."],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip

    def set_watermark(value: str) -> None:
        subprocess.run(
            ["rabbitmqctl", "set_vm_memory_high_watermark", value],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip

    class Alarm:
        def on(self) -> None:
            set_watermark("0.000001")

        def off(self) -> None:
            set_watermark(before if before.replace(".", "", 1).isdigit() else "0.4")

    alarm = Alarm()
    try:
        yield alarm
    finally:
        alarm.off()


@pytest.mark.serial
def test_a_blocked_broker_defers_messages_without_burning_attempts(
    pg_url: str,
    pg_engine: Engine,
    broker: Broker,
    relay_factory: RelayFactory,
    memory_alarm: Any,
) -> None:
    relay = relay_factory(pg_url, confirm_timeout=1.0, lease_seconds=5.0, policy=_fast_policy())
    wait_until(lambda: relay.publisher.ready, what="publisher ready")
    memory_alarm.on()
    ids = _enqueue(pg_engine, broker.exchange, 5)
    wait_until(lambda: relay.publisher.blocked, timeout=20, what="connection.blocked")
    wait_until(
        lambda: relay.summary.failures.get("backpressure", 0) >= 1, timeout=20, what="deferral"
    )
    assert states(pg_engine).get("dead", 0) == 0
    memory_alarm.off()
    broker.collect_ids(ids, timeout=30)
    wait_until(lambda: states(pg_engine) == {"published": 5}, timeout=20, what="published")
    for message_id in ids:
        row = _row(pg_engine, message_id)
        assert row.attempts == 1  # deferrals did not count
        outcomes = {(h.failure_class, h.outcome) for h in _history(pg_engine, message_id)}
        assert outcomes <= {("backpressure", "deferred")}
