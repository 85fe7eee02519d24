"""`outbox-relay run --capture logical`: messages emitted into PostgreSQL's log by `outbox.enqueue`
reach the broker through a real relay process reading a real replication slot; what cannot go
takes the table's path; a killed relay loses nothing; a standby takes the slot over."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.orm import Session

import outbox
from outbox import config as outbox_config
from relay.capture import admin
from tests.support.broker import Broker, Delivery
from tests.support.cli import RelayProcess, assert_one_line_error, cli, kill_running
from tests.support.db import PG_ADMIN_URL, states
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@dataclass
class Captured:
    url: str
    slot: str
    engine: Engine


def _admin() -> Engine:
    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture
def captured() -> Iterator[Captured]:
    """A database of this test's own (a slot reads a whole database), migrated, with a slot and
    publication of its own; `outbox.enqueue` writes to the log for it."""
    name = f"cap_{uuid.uuid4().hex[:12]}"
    server = _admin()
    with server.connect() as conn:
        if conn.exec_driver_sql("SHOW wal_level").scalar() != "logical":
            pytest.skip("wal_level is not logical here (scripts/ensure-services.sh sets it)")
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    outbox.create_schema(engine)
    admin.setup(engine, slot=name, publication=name)
    outbox.configure(capture="logical", capture_slot=name)
    try:
        yield Captured(url, name, engine)
    finally:
        outbox_config.reset()
        wait_until(
            lambda: not admin.slot_state(engine, name, publication=name).active,
            timeout=20,
            what="the slot let go",
        )
        admin.drop(engine, slot=name, publication=name)
        engine.dispose()
        with server.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        server.dispose()


class Relay(RelayProcess):
    """`outbox-relay run --capture logical` as a process, its log lines read as they come."""

    def __init__(self, cap: Captured, *extra: str) -> None:
        args = ["--capture", "logical", "--capture-slot", cap.slot, "--poll-interval", "0.1",
                "--unroutable-grace", "0", *extra]  # fmt: skip
        super().__init__("run", "--db", cap.url, *args)


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    started: list[Relay] = []
    yield started
    kill_running(started)


def enqueue(cap: Captured, exchange: str, messages: Sequence[Mapping[str, object]]) -> list[str]:
    with Session(cap.engine) as session, session.begin():
        ids = [outbox.enqueue(session, exchange=exchange, **m) for m in messages]  # type: ignore[arg-type]
    return [str(i) for i in ids]


def in_key_order(received: list[Delivery], sent: dict[str, list[str]]) -> bool:
    got = [d.message_id for d in received]
    return all([i for i in got if i in set(ids)] == ids for ids in sent.values())


def test_messages_go_from_the_log_in_each_keys_order_and_a_rollback_sends_nothing(
    captured: Captured, broker: Broker, relays: list[Relay]
) -> None:
    relays.append(Relay(captured))
    sent: dict[str, list[str]] = {f"k{n}": [] for n in range(4)}
    unkeyed: list[str] = []
    for batch in range(20):
        ids = enqueue(
            captured,
            broker.exchange,
            [{"routing_key": "rk", "payload": {"n": i}, "key": f"k{i % 4}"} for i in range(10)]
            + [{"routing_key": "rk", "payload": {"batch": batch}}],
        )
        for i, message_id in enumerate(ids[:10]):
            sent[f"k{i % 4}"].append(message_id)
        unkeyed.append(ids[10])
    with Session(captured.engine) as session:
        outbox.enqueue(session, exchange=broker.exchange, routing_key="rk", payload="never")
        session.rollback()
    total = 20 * 11
    received = broker.collect(lambda r: len(r) >= total, timeout=30, what=f"{total} messages")
    assert {d.message_id for d in received} == {i for ids in sent.values() for i in ids} | set(
        unkeyed
    )
    assert in_key_order(received, sent)
    assert states(captured.engine) == {}  # no row was written for any of them
    code, out = relays[0].stop()
    assert code == 0, out
    time.sleep(0.5)
    assert broker.finish() == received  # the rolled-back one never came


def test_what_cannot_go_takes_the_tables_path(
    captured: Captured, broker: Broker, relays: list[Relay]
) -> None:
    relays.append(Relay(captured))
    missing = f"t.{uuid.uuid4().hex[:8]}.missing"  # no queue is bound: unroutable
    [dead] = enqueue(captured, "", [{"routing_key": missing, "payload": "lost"}])
    wait_until(lambda: states(captured.engine).get("dead") == 1, timeout=20, what="dead")
    with captured.engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, last_error FROM outbox_message WHERE id = :id"), {"id": dead}
        ).one()
        attempts = (
            conn.execute(
                text("SELECT outcome FROM outbox_attempt WHERE message_id = :id"), {"id": dead}
            )
            .scalars()
            .all()
        )
    assert row.state == "dead"
    assert "unroutable" in row.last_error
    assert attempts == ["dead"]
    # A delayed message waits in the table, held until the relay reads it from the log.
    [later] = enqueue(
        captured, broker.exchange, [{"routing_key": "rk", "payload": "later", "delay": 1.5}]
    )
    started = time.monotonic()
    broker.collect_ids([uuid.UUID(later)], timeout=20)
    assert time.monotonic() - started >= 1.0
    wait_until(lambda: states(captured.engine).get("published") == 1, what="marked")


def test_an_idempotency_key_is_kept_and_the_message_goes_once(
    captured: Captured, broker: Broker, relays: list[Relay]
) -> None:
    first = enqueue(
        captured,
        broker.exchange,
        [{"routing_key": "rk", "payload": "one", "idempotency_key": "o-1"}],
    )
    again = enqueue(
        captured,
        broker.exchange,
        [{"routing_key": "rk", "payload": "two", "idempotency_key": "o-1"}],
    )
    assert first == again
    relays.append(Relay(captured))
    broker.collect_ids([uuid.UUID(first[0])], timeout=20)
    wait_until(lambda: states(captured.engine) == {"published": 1}, what="its row published")
    relays[0].stop()
    assert [d.message_id for d in broker.finish()] == first


def test_a_relay_killed_mid_drain_loses_nothing(
    captured: Captured, broker: Broker, relays: list[Relay]
) -> None:
    ids: list[str] = []
    for _ in range(10):
        ids += enqueue(
            captured,
            broker.exchange,
            [{"routing_key": "rk", "payload": {"i": i}, "key": f"k{i % 8}"} for i in range(500)],
        )
    relays.append(Relay(captured, "--max-in-flight", "512"))
    broker.collect(lambda r: len(r) >= 1000, timeout=30, what="a first part")
    relays[0].kill()
    relays.append(Relay(captured, "--max-in-flight", "512"))
    received = broker.collect(
        lambda r: set(ids) <= {d.message_id for d in r}, timeout=60, what="every message"
    )
    relays[1].stop()
    delivered = [d.message_id for d in broker.finish()]
    assert set(delivered) == set(ids)
    # At most what the killed one held, and the rest of a transaction it had begun.
    assert len(delivered) - len(set(delivered)) <= 512 + 500
    del received


def test_a_standby_takes_the_slot_when_the_holder_dies(
    captured: Captured, broker: Broker, relays: list[Relay]
) -> None:
    relays.append(Relay(captured))
    wait_until(
        lambda: admin.slot_state(captured.engine, captured.slot, publication=captured.slot).active,
        timeout=20,
        what="the first relay streaming",
    )
    relays.append(Relay(captured))
    relays[1].said("relay.capture_standby")  # the second finds the slot taken, and waits
    relays[0].kill()
    started = time.monotonic()
    [message_id] = enqueue(captured, broker.exchange, [{"routing_key": "rk", "payload": "x"}])
    broker.collect_ids([uuid.UUID(message_id)], timeout=20)
    assert time.monotonic() - started < 10
    code, out = relays[1].stop()
    assert code == 0, out
    assert "relay.capture_taken_over" in out


def test_status_counts_what_waits_in_the_log(captured: Captured, broker: Broker) -> None:
    enqueue(
        captured, broker.exchange, [{"routing_key": "rk", "payload": {"i": i}} for i in range(7)]
    )
    result = cli("status", "--json", "--db", captured.url, "--capture-slot", captured.slot)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["pending"] == 7
    assert report["log"]["pending"] == 7


def test_starting_without_the_slot_or_off_postgresql_is_bad_usage(
    captured: Captured, tmp_path: os.PathLike[str]
) -> None:
    no_slot = cli("run", "--db", captured.url, "--capture", "logical", "--capture-slot", "nope")
    assert "capture setup" in assert_one_line_error(no_slot, 2)
    sqlite = cli("run", "--db", f"sqlite:///{tmp_path}/x.db", "--capture", "logical")
    assert "needs PostgreSQL" in assert_one_line_error(sqlite, 2)
