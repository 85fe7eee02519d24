"""Fixtures shared by the integration and end-to-end tiers: real PostgreSQL, SQLite and RabbitMQ.

Every test gets things of its own and removes them afterwards; nothing here touches what a test
did not create:

- `pg_url`: a fresh PostgreSQL schema (`t_<random>`), as a URL whose `search_path` points at it,
  so every engine and subprocess given the URL lands in that schema. Dropped CASCADE at teardown.
- `mysql_url`: a fresh MariaDB database (`t_<random>`, utf8mb4), dropped at teardown.
- `sqlite_url`: a SQLite file in the test's `tmp_path`.
- `db_url`: each of the above, one after the other (for behaviour that must hold on all three).
- `app_engine`: an application-side engine on `db_url` with the outbox schema created.
- `broker`: a topic exchange `t.<random>` and a durable queue bound with `#`, with a collector
  for what arrives; helpers declare further exchanges/queues that are deleted with them.
- `relay_factory`: in-process `Relay`s wired to the real store and publisher, either running in
  a thread (stopped and joined at teardown) or driven by hand with `drive()`.

Waiting is always polling against a deadline (`wait_until`, `Broker.collect`), never a bare
sleep whose length is a guess.

The services are expected on this machine (see scripts/ensure-services.sh); OUTBOX_TEST_PG_URL
and OUTBOX_TEST_AMQP_URL point the tests elsewhere. When one is not reachable, the tests that need
it fail with one line saying so: a silently skipped integration suite would look green.
OUTBOX_TEST_MYSQL_URL points the MariaDB (or MySQL) tests elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pika
import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.engine import make_url

import outbox
from outbox.schema import message
from relay.amqp.publisher import Publisher
from relay.loop.counts import Counts
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.runtime.config import RelayConfig
from relay.runtime.telemetry import Telemetry
from relay.store.sql_store import SqlStore, open_store

# A database the tests may create schemas in, and a broker (vhost) they may declare names in.
PG_ADMIN_URL = os.environ.get("OUTBOX_TEST_PG_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
AMQP_URL = os.environ.get("OUTBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
# A server the tests may create databases in (MariaDB here; MySQL 8 runs the same tests).
MYSQL_ADMIN_URL = os.environ.get(
    "OUTBOX_TEST_MYSQL_URL", "mariadb+pymysql://root@127.0.0.1:3306/test"
)

T = TypeVar("T")


# --------------------------------------------------------------------------- waiting


def wait_until(
    condition: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll `condition` until it returns something truthy (returned) or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or condition!r}")
        time.sleep(interval)


def row_count(engine: Engine, **where: object) -> int:
    """Rows of the outbox table, optionally filtered by column values (`state="pending"`)."""
    stmt = select(func.count()).select_from(message)
    for column, value in where.items():
        stmt = stmt.where(message.c[column] == value)
    with engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def states(engine: Engine) -> dict[str, int]:
    """Row counts by state."""
    with engine.connect() as conn:
        rows = conn.execute(select(message.c.state, func.count()).group_by(message.c.state))
        return {str(state): int(n) for state, n in rows}


# --------------------------------------------------------------------------- databases


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _admin_engine(url: str, server: str) -> Iterator[Engine]:
    """An autocommit engine on `url`, failing the test in one line if `server` does not answer."""
    engine = create_engine(
        url, isolation_level="AUTOCOMMIT", pool_size=1, connect_args={"connect_timeout": 5}
    )
    problem = None
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as exc:
        problem = _one_line(exc)
    if problem is not None:  # outside the except block: no chained traceback, one line
        engine.dispose()
        pytest.fail(
            f"{server} is not reachable at {url} ({problem}); "
            "start it with scripts/ensure-services.sh",
            pytrace=False,
        )
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    """An engine on the shared test database, used only to create and drop per-test schemas."""
    yield from _admin_engine(PG_ADMIN_URL, "PostgreSQL")


@pytest.fixture
def pg_url(pg_admin: Engine) -> Iterator[str]:
    """A SQLAlchemy URL on a PostgreSQL schema of this test's own (search_path points at it)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    options = urllib.parse.quote(f"-csearch_path={schema}", safe="")
    yield f"{PG_ADMIN_URL}?options={options}"
    with pg_admin.connect() as conn:
        # Fail rather than hang if something the test started still holds a lock in the schema.
        conn.exec_driver_sql("SET lock_timeout = '10s'")
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def pg_schema(url: str) -> str:
    """The schema a `pg_url` points at."""
    options = make_url(url).query["options"]
    assert isinstance(options, str)
    return options.removeprefix("-csearch_path=")


@pytest.fixture(scope="session")
def mysql_admin() -> Iterator[Engine]:
    """An engine on the MariaDB server, used only to create and drop per-test databases."""
    yield from _admin_engine(MYSQL_ADMIN_URL, "MariaDB")


@pytest.fixture
def mysql_url(mysql_admin: Engine) -> Iterator[str]:
    """A SQLAlchemy URL on a MariaDB database of this test's own."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with mysql_admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    yield make_url(MYSQL_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    with mysql_admin.connect() as conn:
        # Fail rather than hang if something the test started still holds a lock in it.
        conn.exec_driver_sql("SET SESSION lock_wait_timeout = 10")
        conn.exec_driver_sql(f"DROP DATABASE `{name}`")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLAlchemy URL on a SQLite file in this test's tmp_path."""
    return f"sqlite:///{tmp_path / 'test.db'}"


DB_FIXTURES = {"postgresql": "pg_url", "mariadb": "mysql_url", "sqlite": "sqlite_url"}


@pytest.fixture(params=list(DB_FIXTURES))
def db_url(request: pytest.FixtureRequest) -> str:
    """`pg_url`, `mysql_url` or `sqlite_url`: tests using it run once on each database."""
    return str(request.getfixturevalue(DB_FIXTURES[request.param]))


def make_app_engine(url: str) -> Engine:
    """An engine as an application would build it (not the relay's autocommit one)."""
    if url.startswith("sqlite"):
        return create_engine(url, connect_args={"timeout": 30})
    return create_engine(url, pool_size=3, max_overflow=2, connect_args={"connect_timeout": 5})


def _migrated_app_engine(url: str) -> Iterator[Engine]:
    engine = make_app_engine(url)
    outbox.create_schema(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def app_engine(db_url: str) -> Iterator[Engine]:
    """The application's engine on `db_url`, with `outbox.create_schema` applied."""
    yield from _migrated_app_engine(db_url)


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    """Like `app_engine`, on PostgreSQL only (for behaviour only PostgreSQL has)."""
    yield from _migrated_app_engine(pg_url)


@pytest.fixture
def store(db_url: str, app_engine: Engine) -> Iterator[SqlStore]:
    """The relay's store on `db_url` (schema already created), closed at teardown."""
    opened = open_store(db_url)
    yield opened
    opened.close()


# --------------------------------------------------------------------------- RabbitMQ


@dataclasses.dataclass(frozen=True)
class Delivery:
    """One message as a consumer received it."""

    message_id: str | None
    properties: Any  # pika.BasicProperties
    body: bytes
    exchange: str
    routing_key: str
    received_at: float  # time.monotonic() when the collector saw it


def amqp_connection() -> Any:
    params = pika.URLParameters(AMQP_URL)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.heartbeat = 0  # the test thread does not service heartbeats between polls
    return pika.BlockingConnection(params)


class Broker:
    """A per-test destination on the real broker, and a consumer of its queue.

    `exchange` (topic) routes everything (`#`) to `queue`. Deliveries are pushed to an auto-ack
    consumer with a large prefetch and accumulate in `received`, in arrival order, as the test
    calls `collect()`.
    """

    def __init__(self, conn: Any, suffix: str) -> None:
        self._conn = conn
        self._channel = conn.channel()
        self.exchange = f"t.{suffix}"
        self.queue = f"t.{suffix}.q"
        self.received: list[Delivery] = []
        self._exchanges: list[str] = []
        self._queues: list[str] = []
        self.declare_exchange(self.exchange)
        self.declare_queue(self.queue, bind_to=self.exchange)
        self._channel.basic_qos(prefetch_count=1000)
        self._consumer: str | None = self._channel.basic_consume(self.queue, self._on_consumed)

    # ---- topology: everything declared here is deleted at teardown

    def declare_exchange(self, name: str | None = None) -> str:
        """A durable topic exchange (a fresh `t.<random>` name unless given)."""
        name = name or f"t.{uuid.uuid4().hex[:12]}"
        self._channel.exchange_declare(name, exchange_type="topic", durable=True)
        self._exchanges.append(name)
        return name

    def declare_queue(
        self,
        name: str | None = None,
        *,
        bind_to: str | None = None,
        binding_key: str = "#",
        arguments: Mapping[str, Any] | None = None,
    ) -> str:
        """A durable queue, optionally bound to `bind_to` with `binding_key`."""
        name = name or f"t.{uuid.uuid4().hex[:12]}.q"
        self._channel.queue_declare(name, durable=True, arguments=dict(arguments or {}))
        self._queues.append(name)
        if bind_to is not None:
            self._channel.queue_bind(name, bind_to, routing_key=binding_key)
        return name

    def own(self, queue: str) -> str:
        """Delete `queue` at teardown too (one that the code under test declared)."""
        self._queues.append(queue)
        return queue

    def own_exchange(self, exchange: str) -> str:
        """Delete `exchange` at teardown too (one that the code under test declared)."""
        self._exchanges.append(exchange)
        return exchange

    def publish(self, routing_key: str, body: bytes, properties: Any, exchange: str = "") -> None:
        self._channel.basic_publish(exchange, routing_key, body, properties)

    def delete_exchange(self, name: str) -> None:
        """Delete an exchange now (an outage); its bindings go with it."""
        self._channel.exchange_delete(name)

    def bind(self, queue: str, exchange: str, binding_key: str = "#") -> None:
        self._channel.queue_bind(queue, exchange, routing_key=binding_key)

    def depth(self, queue: str | None = None) -> int:
        """Ready messages in a queue (messages already pushed to a consumer are not counted)."""
        ok = self._channel.queue_declare(queue or self.queue, passive=True)
        return int(ok.method.message_count)

    # ---- consuming

    def _on_consumed(self, ch: Any, method: Any, properties: Any, body: bytes) -> None:
        # Manual acks: a delivery that pika drops (one arriving between basic.cancel and
        # cancel-ok is discarded) stays unacked on the broker and is recovered by finish(); with
        # auto-ack it would be lost to the test, which would then report a loss that is not real.
        self._on_message(ch, method, properties, body)
        ch.basic_ack(method.delivery_tag)

    def _on_message(self, _ch: Any, method: Any, properties: Any, body: bytes) -> None:
        self.received.append(
            Delivery(
                properties.message_id,
                properties,
                body,
                method.exchange,
                method.routing_key,
                time.monotonic(),
            )
        )

    def collect(
        self,
        until: Callable[[list[Delivery]], bool],
        *,
        timeout: float = 10.0,
        what: str = "",
    ) -> list[Delivery]:
        """Receive until `until(received)` holds; fail after `timeout` s. Returns `received`."""
        deadline = time.monotonic() + timeout
        while not until(self.received):
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(
                    f"timed out after {timeout} s waiting for {what or 'deliveries'}: "
                    f"{len(self.received)} received"
                )
            self._conn.process_data_events(time_limit=min(0.05, left))
        return self.received

    def collect_ids(self, ids: Sequence[uuid.UUID], *, timeout: float = 10.0) -> list[Delivery]:
        """Receive until every one of `ids` has arrived."""
        wanted = {str(i) for i in ids}

        def arrived(received: list[Delivery]) -> bool:
            return wanted <= {d.message_id for d in received}

        return self.collect(arrived, timeout=timeout, what=f"{len(wanted)} message ids")

    def finish(self) -> list[Delivery]:
        """Stop consuming and return everything that was delivered to the queue, exactly.

        After the broker's cancel-ok nothing more reaches this consumer, and whatever was
        already on its way is in `received`; what the queue still holds is added by reading it.
        Call it once every publisher has stopped, to count deliveries without waiting.
        """
        if self._consumer is not None:
            for method, properties, body in self._channel.basic_cancel(self._consumer):
                self._on_consumed(self._channel, method, properties, body)
            self._consumer = None
            # Whatever reached the client but was not handed to us goes back to the queue.
            self._channel.basic_recover(requeue=True)
        while True:
            method, properties, body = self._channel.basic_get(self.queue, auto_ack=True)
            if method is None:
                return self.received
            self._on_message(self._channel, method, properties, body)

    def delete(self) -> None:
        """Delete every queue and exchange this destination declared."""
        # A channel the test got closed (a passive declare of a missing queue, say) is replaced.
        channel = self._channel if self._channel.is_open else self._conn.channel()
        if self._consumer is not None and channel is self._channel:
            with contextlib.suppress(Exception):
                channel.basic_cancel(self._consumer)
        for queue in self._queues:
            channel.queue_delete(queue)
        for exchange in self._exchanges:
            channel.exchange_delete(exchange)


def broker_refuses_publishes() -> str | None:
    """Publish one confirmed message to a private queue; say why not if the broker will not take it.

    A broker under a resource alarm (low disk, high memory) accepts connections and declarations
    but blocks every publisher: without this check each delivery test would time out on its own,
    one by one, with "0 received" and no word about the alarm.
    """
    params = pika.URLParameters(AMQP_URL)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.heartbeat = 0
    params.blocked_connection_timeout = 10
    conn = pika.BlockingConnection(params)
    blocked: list[str] = []
    conn.add_on_connection_blocked_callback(
        lambda _c, frame: blocked.append(str(getattr(frame.method, "reason", "") or "no reason"))
    )
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
        channel.basic_publish("", queue, b"preflight", mandatory=True)
        return None
    except pika.exceptions.ConnectionBlockedTimeout:
        why = ", ".join(blocked) or "a resource alarm"
        return f"it blocks publishers ({why}; `rabbitmq-diagnostics alarms` names it)"
    finally:
        with contextlib.suppress(Exception):
            conn.close()


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The broker's URL; fails (one line) every test that needs it when it is not reachable."""
    problem = None
    try:
        problem = broker_refuses_publishes()
    except Exception as exc:
        problem = str(exc).strip() or repr(exc)  # pika's connection errors have no str()
    if problem is not None:  # outside the except block: no chained traceback, one line
        pytest.fail(
            f"RabbitMQ at {AMQP_URL} cannot take the tests' messages: {problem}; "
            "scripts/ensure-services.sh starts a stopped one",
            pytrace=False,
        )
    return AMQP_URL


@pytest.fixture
def broker(amqp_url: str) -> Iterator[Broker]:
    """A topic exchange and a bound durable queue of this test's own, deleted at teardown."""
    conn = amqp_connection()
    try:
        destination = Broker(conn, uuid.uuid4().hex[:12])
        try:
            yield destination
        finally:
            destination.delete()
    finally:
        conn.close()


# --------------------------------------------------------------------------- relays


class RelayFactory(Protocol):
    def __call__(
        self, db_url: str, *, run: bool = ..., telemetry: Telemetry | None = ..., **config: Any
    ) -> Relay: ...


@dataclasses.dataclass
class _Running:
    relay: Relay
    thread: threading.Thread | None
    summary: Counts | None = None
    error: BaseException | None = None


# Fast loop, short drain; a relay built by a test may override any of them.
RELAY_TEST_CONFIG: dict[str, Any] = {
    "poll_interval": 0.05,
    "reclaim_interval": 0.1,
    "confirm_timeout": 5.0,
    "lease_seconds": 10.0,
    "drain_timeout": 5.0,
}


@pytest.fixture
def relay_factory(amqp_url: str) -> Iterator[RelayFactory]:
    """Build in-process relays on the real store and publisher.

    `relay_factory(db_url, **config)` returns a relay whose `run()` loop is already going in a
    thread; `run=False` returns one to drive by hand with `drive()` (or `run_once()`). Config
    keys are `RelayConfig` fields over `RELAY_TEST_CONFIG`. At teardown every running relay is
    asked to stop and joined (its `run()` must return), and every store and publisher closed.
    """
    built: list[_Running] = []

    def factory(
        db_url: str, *, run: bool = True, telemetry: Telemetry | None = None, **config: Any
    ) -> Relay:
        settings = {**RELAY_TEST_CONFIG, **config}
        cfg = RelayConfig(
            db_url=db_url,
            amqp_url=amqp_url,
            relay_id=f"test-relay-{uuid.uuid4().hex[:8]}",
            **settings,
        )
        store = open_store(db_url, hold_dead_keys=cfg.hold_dead_keys, scope=cfg.circuit_scope)
        publisher = Publisher(amqp_url, confirm_timeout=cfg.confirm_timeout, name=cfg.relay_id)
        try:
            publisher.start()
        except BaseException:
            store.close()
            raise
        relay = wire_relay(store, publisher, cfg, telemetry=telemetry)
        entry = _Running(relay, None)
        if run:

            def target() -> None:
                try:
                    entry.summary = relay.run()
                except BaseException as exc:  # reported at teardown
                    entry.error = exc

            entry.thread = threading.Thread(target=target, name=cfg.relay_id, daemon=True)
        built.append(entry)
        if entry.thread is not None:
            entry.thread.start()
        return relay

    yield factory

    problems: list[str] = []
    for entry in built:
        relay = entry.relay
        if entry.thread is not None:
            relay.request_stop()
            entry.thread.join(relay.config.drain_timeout + 15)
            if entry.thread.is_alive():
                problems.append(f"{relay.config.relay_id}: run() did not return after stop")
            elif entry.error is not None:
                problems.append(f"{relay.config.relay_id}: run() raised {entry.error!r}")
        else:
            relay.publisher.stop(5.0)
        relay.store.close()
    if problems:
        pytest.fail("; ".join(problems))


def drive(
    relay: Relay, until: Callable[[Counts], bool], *, timeout: float = 10.0, what: str = ""
) -> list[Counts]:
    """Call `relay.run_once()` until `until(pass_result)` holds; return every pass's result.

    Publishing is asynchronous (the broker's confirms come back on the publisher's thread), so a
    claim is settled by a later pass: this polls, with a short pause between idle passes.
    """
    deadline = time.monotonic() + timeout
    results: list[Counts] = []
    while True:
        result = relay.run_once()
        results.append(result)
        if until(result):
            return results
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s driving the relay until {what or until!r}")
        if not result.claimed:
            time.sleep(0.005)


def drive_until_settled(relay: Relay, total: int, *, timeout: float = 10.0) -> list[Counts]:
    """Drive until `total` messages have been settled (published, retried or dead)."""
    settled = 0

    def done(result: Counts) -> bool:
        nonlocal settled
        settled += result.published + result.retried + result.dead
        return settled >= total

    return drive(relay, done, timeout=timeout, what=f"{total} messages settled")
