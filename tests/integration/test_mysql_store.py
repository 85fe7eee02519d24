"""What only MySQL and MariaDB need proved, on the real MariaDB server: every URL form reaches the
same schema, a taken idempotency key waits for its owner and answers with the first id, keys
compare byte for byte, times from any zone land in UTC, migrations race safely and complete the
MySQL-only indexes, and a connection the server dropped is replaced before the relay uses it.

Everything else a store does is the contract suite's (every test on `db_url` runs here too)."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, inspect, select
from sqlalchemy.engine import make_url

import outbox
from outbox.databases import MYSQL_INDEXES
from outbox.migrate import inspect_schema
from outbox.schema import SCHEMA_VERSION, message, schema_version
from relay.core.bucket import Bucket
from relay.errors import DatabaseUnavailable
from relay.ports import ResourceRow
from relay.store import admin
from relay.store.boundary import translated
from relay.store.sql_store import open_store
from tests.support.broker import Broker
from tests.support.db import make_app_engine
from tests.support.relays import RelayFactory
from tests.support.templates import Templates
from tests.support.waiting import wait_until


def with_driver(url: str, drivername: str) -> str:
    return make_url(url).set(drivername=drivername).render_as_string(hide_password=False)


@pytest.fixture
def engine(mysql_url: str, templates: Templates) -> Iterator[Engine]:
    engine = make_app_engine(mysql_url)
    templates.migrate(engine)
    yield engine
    engine.dispose()


def enqueue(engine: Engine, exchange: str = "orders", **options: Any) -> uuid.UUID:
    with engine.begin() as conn:
        return outbox.enqueue(
            conn, exchange=exchange, routing_key="order.created", payload={"n": 1}, **options
        )


# --------------------------------------------------------------------------- URLs


@pytest.mark.parametrize("drivername", ["mysql", "mariadb", "mysql+pymysql", "mariadb+pymysql"])
def test_every_url_form_writes_and_relays_through_one_schema(
    mysql_url: str,
    engine: Engine,
    drivername: str,
    broker: Broker,
    relay_factory: RelayFactory,
) -> None:
    # The schema was made through mariadb+pymysql; the application and the relay use another name.
    url = with_driver(mysql_url, drivername)
    # SQLAlchemy's own default for a bare mysql:// is mysqlclient, which the project does not use.
    app = create_engine(url if "+" in drivername else with_driver(url, f"{drivername}+pymysql"))
    try:
        sent = enqueue(app, exchange=broker.exchange, idempotency_key=f"once-{drivername}")
        assert enqueue(app, exchange=broker.exchange, idempotency_key=f"once-{drivername}") == sent
    finally:
        app.dispose()
    relay_factory(url)
    (delivery,) = broker.collect_ids([sent])
    assert delivery.message_id == str(sent)
    assert delivery.body == b'{"n":1}'


# --------------------------------------------------------------------------- idempotency


def test_a_taken_key_waits_for_its_owner_and_answers_with_the_first_id(engine: Engine) -> None:
    found: list[uuid.UUID] = []
    with engine.begin() as owner:
        first = outbox.enqueue(
            owner, exchange="orders", routing_key="r", payload={"n": 1}, idempotency_key="k-1"
        )

        def second() -> None:
            found.append(enqueue(engine, idempotency_key="k-1"))

        racer = threading.Thread(target=second)
        racer.start()
        # The racer's INSERT waits on the owner's uncommitted row (a lock wait, not an error).
        wait_until(lock_waits(engine), interval=0.25, what="the racer to wait on the owner")
    racer.join(10)
    assert found == [first]
    with engine.connect() as conn:
        assert conn.execute(select(message.c.id)).scalars().all() == [first]


def test_a_taken_key_whose_owner_rolls_back_is_the_racers(engine: Engine) -> None:
    found: list[uuid.UUID] = []
    owner = engine.connect()
    try:
        with owner.begin() as transaction:
            outbox.enqueue(
                owner, exchange="orders", routing_key="r", payload={"n": 1}, idempotency_key="k-2"
            )
            racer = threading.Thread(
                target=lambda: found.append(enqueue(engine, idempotency_key="k-2"))
            )
            racer.start()
            wait_until(lock_waits(engine), interval=0.25, what="the second INSERT to wait")
            transaction.rollback()
        racer.join(10)
    finally:
        owner.close()
    with engine.connect() as conn:
        assert conn.execute(select(message.c.id)).scalars().all() == found


def test_two_racers_for_a_key_whose_owner_rolls_back_leave_one_row_and_one_id(
    engine: Engine,
) -> None:
    # InnoDB's documented case: both waiting INSERTs get a shared lock when the owner rolls
    # back, both then need it exclusive, and the server rolls one of them back (1213).
    outcomes: list[uuid.UUID | BaseException] = []

    def racer() -> None:
        try:
            outcomes.append(enqueue(engine, idempotency_key="k-4"))
        except outbox.IdempotencyConflict as exc:
            outcomes.append(exc)

    owner = engine.connect()
    try:
        with owner.begin() as transaction:
            outbox.enqueue(
                owner, exchange="orders", routing_key="r", payload={"n": 1}, idempotency_key="k-4"
            )
            racers = [threading.Thread(target=racer) for _ in range(2)]
            for thread in racers:
                thread.start()
            wait_until(lock_waits(engine, 2), interval=0.25, what="both racers to wait")
            transaction.rollback()
        for thread in racers:
            thread.join(10)
    finally:
        owner.close()
    won = [o for o in outcomes if isinstance(o, uuid.UUID)]
    told = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(outcomes) == 2, outcomes
    # Usually the deadlock above; when the server lets one racer commit before the other takes
    # its lock, the second finds the key taken and answers with the first id. Never two rows.
    assert len(set(won)) == 1, outcomes
    if told:
        assert len(told) == 1, outcomes
        assert "retry the transaction" in str(told[0])
    with engine.connect() as conn:
        assert conn.execute(select(message.c.id)).scalars().all() == won[:1]


def test_the_callers_transaction_goes_on_after_a_taken_key(engine: Engine) -> None:
    first = enqueue(engine, idempotency_key="k-3")
    with engine.begin() as conn:
        before = outbox.enqueue(conn, exchange="orders", routing_key="r", payload="before")
        again = outbox.enqueue(
            conn, exchange="orders", routing_key="r", payload="x", idempotency_key="k-3"
        )
        after = outbox.enqueue(conn, exchange="orders", routing_key="r", payload="after")
    assert again == first
    with engine.connect() as conn:
        ids = set(conn.execute(select(message.c.id)).scalars())
    assert ids == {first, before, after}


def lock_waits(engine: Engine, at_least: int = 1) -> Callable[[], bool]:
    """Whether `at_least` transactions wait for a row lock. Polled slowly: the server refreshes
    what innodb_trx shows only when it was last read more than 0.1 s ago."""

    def waiting() -> bool:
        with engine.connect() as conn:
            found = conn.exec_driver_sql(
                "SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
            ).scalar_one()
        return int(found) >= at_least

    return waiting


def test_keys_compare_byte_for_byte(engine: Engine) -> None:
    # A case-insensitive collation would make these one idempotency key and one ordering key.
    upper = enqueue(engine, idempotency_key="Order-1", key="Customer")
    lower = enqueue(engine, idempotency_key="order-1", key="customer")
    assert upper != lower
    store = open_store(str(engine.url.render_as_string(hide_password=False)))
    try:
        claimed = store.claim(owner="t", token=uuid.uuid4(), limit=10, lease_seconds=30)
    finally:
        store.close()
    assert {c.id for c in claimed} == {str(upper), str(lower)}  # two keys: both heads


def test_a_rate_limit_bucket_keeps_its_tokens(engine: Engine) -> None:
    # `:tokens` is a number in the resource row's UPDATE and a list of lease tokens elsewhere:
    # bound as a list here, it stored NULL (a full bucket) and the rate limit never held.
    store = open_store(engine.url.render_as_string(hide_password=False))
    try:

        def draw(row: ResourceRow, now: dt.datetime) -> tuple[ResourceRow, None]:
            return ResourceRow(row.circuit, Bucket(3.5, now)), None

        store.change_resource("127.0.0.1:5672/%2F/orders", draw)
        (row,) = store.resources()
    finally:
        store.close()
    assert row.bucket.tokens == 3.5


# --------------------------------------------------------------------------- time


def test_times_from_any_zone_are_stored_in_utc(engine: Engine) -> None:
    sent = enqueue(engine)
    at = dt.datetime(2030, 1, 2, 15, 4, 5, 123456, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    store = open_store(engine.url.render_as_string(hide_password=False))
    try:
        changed = admin.reschedule(
            store.engine, [sent], at=at, now=dt.datetime.now(dt.UTC), by="test"
        )
    finally:
        store.close()
    assert changed == [sent]
    with engine.connect() as conn:
        stored = conn.execute(select(message.c.available_at)).scalar_one()
    assert stored == dt.datetime(2030, 1, 2, 10, 4, 5, 123456)  # naive, UTC, to the microsecond


def test_the_server_clock_stamps_enqueued_rows_in_utc(engine: Engine) -> None:
    before = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(seconds=5)
    enqueue(engine, delay=dt.timedelta(hours=1))
    with engine.connect() as conn:
        conn.exec_driver_sql("SET SESSION time_zone = '+09:00'")  # what a session says is moot
        created, available = conn.execute(
            select(message.c.created_at, message.c.available_at)
        ).one()
    assert before <= created <= before + dt.timedelta(minutes=5)
    assert available - created == dt.timedelta(hours=1)


# --------------------------------------------------------------------------- migrate


def test_migrations_racing_on_a_fresh_database_both_succeed(mysql_url: str) -> None:
    engines = [make_app_engine(mysql_url) for _ in range(3)]
    errors: list[BaseException] = []

    def migrate(engine: Engine) -> None:
        try:
            outbox.create_schema(engine)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(e,)) for e in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert errors == []
        with engines[0].connect() as conn:
            versions = conn.execute(select(schema_version.c.version)).scalars().all()
            assert inspect_schema(conn).complete
        assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1))
    finally:
        for engine in engines:
            engine.dispose()


def test_migrate_completes_the_mysql_indexes_a_schema_lacks(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX outbox_message_claim_idx ON outbox_message")
        shape = inspect_schema(conn)
    assert [str(gap) for gap in shape.blocking] == [
        "missing index outbox_message_claim_idx on outbox_message"
    ]
    outbox.create_schema(engine)
    with engine.connect() as conn:
        names = {ix["name"] for ix in inspect(conn).get_indexes("outbox_message")}
        assert inspect_schema(conn).complete
    assert set(MYSQL_INDEXES) <= names


# --------------------------------------------------------------------------- connections


def test_a_connection_the_server_killed_is_replaced_before_use(engine: Engine) -> None:
    store = open_store(engine.url.render_as_string(hide_password=False))
    try:
        with store.engine.connect() as conn:
            victim = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
            # The relay's session: READ COMMITTED, UTC, a statement timeout.
            isolation, zone, timeout = conn.exec_driver_sql(
                "SELECT @@tx_isolation, @@time_zone, @@max_statement_time"
            ).one()
        assert (isolation, zone, float(timeout)) == ("READ-COMMITTED", "+00:00", 30.0)
        with engine.connect() as other:
            other.exec_driver_sql(f"KILL CONNECTION {int(victim)}")
        enqueue(engine)
        assert store.counts().ready == 1  # through the pool, on a new connection
    finally:
        store.close()


def test_a_connection_lost_inside_a_transaction_is_the_database_being_unavailable(
    engine: Engine,
) -> None:
    # Not SQLAlchemy's PendingRollbackError from a ROLLBACK on the dead connection, which is no
    # driver error: the relay would crash instead of waiting for the database (found by the
    # chaos suite's database cut).
    store = open_store(engine.url.render_as_string(hide_password=False))

    def killed_mid_transaction() -> None:
        with (
            translated(store.engine),
            store.engine.connect() as conn,
            store.dialect.transaction(conn),
        ):
            victim = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
            with engine.connect() as other:
                other.exec_driver_sql(f"KILL CONNECTION {int(victim)}")
            conn.exec_driver_sql("SELECT 1")

    try:
        with pytest.raises(DatabaseUnavailable, match="Lost connection"):
            killed_mid_transaction()
        assert store.counts().ready == 0  # and the store goes on, on a new connection
    finally:
        store.close()
