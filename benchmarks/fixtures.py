"""What the benchmarks run against: the messages, a throw-away database, a throw-away queue.

The backlog is written once through `outbox.enqueue` (the public path, 5,000 rows per
transaction) and copied aside; every drain phase then starts from an identical, freshly vacuumed
copy of it, so phases compare like with like and loading is never timed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pika
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

import outbox

EXCHANGE_TYPE = "topic"
ROUTING_KEY = "bench.order.created"
BINDING_KEY = "bench.#"
JSON_TYPE = "application/json"
PERSISTENT = 2
LOAD_BATCH = 5000
T = TypeVar("T")


def make_payload(n: int, size: int) -> dict[str, Any]:
    """A JSON object whose compact encoding is exactly `size` bytes (or as short as it can be)."""
    base: dict[str, Any] = {"order_id": n, "customer": f"customer-{n % 977}", "pad": ""}
    overhead = len(encode(base))
    base["pad"] = "x" * max(0, size - overhead)
    return base


def encode(payload: dict[str, Any]) -> bytes:
    """The bytes `outbox.enqueue` stores for a dict payload (same separators, same options)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def names() -> str:
    return f"outbox_bench_{os.getpid()}"


# --------------------------------------------------------------------------- the database


class BenchDatabase:
    """A database of its own, created from an admin URL and dropped by `drop()`: PostgreSQL, or
    MySQL/MariaDB (`mysql://` or `mariadb://`, run by the driver the relay ships)."""

    def __init__(self, admin_url: str, name: str) -> None:
        url = make_url(admin_url)
        self.mysql = url.get_backend_name() in ("mysql", "mariadb")
        if self.mysql and "+" not in url.drivername:
            url = url.set(drivername=f"{url.drivername}+pymysql")
        self.admin_url = url.render_as_string(hide_password=False)
        self.name = name
        self.url = url.set(database=name).render_as_string(hide_password=False)
        self._admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT", pool_size=1)
        self.engine: Engine | None = None
        self.loaded = 0
        self.restored = 0  # rows the last restore() put back: what a drain must publish

    def _drop_sql(self) -> str:
        if self.mysql:
            return f"DROP DATABASE IF EXISTS `{self.name}`"
        return f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'

    def create(self) -> None:
        with self._admin.connect() as conn:
            conn.exec_driver_sql(self._drop_sql())
            if self.mysql:
                conn.exec_driver_sql(f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4")
            else:
                conn.exec_driver_sql(f'CREATE DATABASE "{self.name}"')
        self.engine = create_engine(self.url, pool_size=2)
        outbox.create_schema(self.engine)

    @property
    def product(self) -> str:
        """What the server is, for the report: "PostgreSQL", "MariaDB" or "MySQL"."""
        if not self.mysql:
            return "PostgreSQL"
        return "MariaDB" if "mariadb" in self.server_version_text().lower() else "MySQL"

    def server_version_text(self) -> str:
        query = "SELECT VERSION()" if self.mysql else "SHOW server_version"
        with self._admin.connect() as conn:
            return str(conn.exec_driver_sql(query).scalar())

    def server_version(self) -> str:
        return self.server_version_text().split()[0].split("-")[0]

    def load(self, count: int, payload_bytes: int, exchange: str) -> float:
        """Enqueue `count` messages through outbox.enqueue; keep a copy. Returns seconds taken."""
        assert self.engine is not None
        started = time.perf_counter()
        done = 0
        while done < count:
            with self.engine.begin() as conn:
                for n in range(done, min(count, done + LOAD_BATCH)):
                    outbox.enqueue(
                        conn,
                        exchange=exchange,
                        routing_key=ROUTING_KEY,
                        payload=make_payload(n, payload_bytes),
                    )
            done = min(count, done + LOAD_BATCH)
        unlogged = "" if self.mysql else "UNLOGGED "
        with self.engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS bench_backlog")
            conn.exec_driver_sql(
                f"CREATE {unlogged}TABLE bench_backlog AS SELECT * FROM outbox_message"
            )
        self.loaded = self.restored = count
        return time.perf_counter() - started

    def restore(self, *, limit: int | None = None, keys: int = 0) -> None:
        """Put the loaded backlog back: every row pending, nothing else in the table. With
        `limit`, only its first rows; with `keys`, every row keyed, round robin over that many
        keys (`hot0`, `hot1`...): a backlog of hot keys."""
        assert self.engine is not None
        self.restored = min(self.loaded, limit) if limit is not None else self.loaded
        first = "SELECT * FROM bench_backlog ORDER BY seq"
        with self.engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE outbox_message")
            conn.exec_driver_sql(f"INSERT INTO outbox_message {first} LIMIT {self.restored}")
            if keys:
                if self.mysql:  # `key` is a reserved word there
                    conn.exec_driver_sql(
                        f"UPDATE outbox_message SET `key` = CONCAT('hot', MOD(seq, {keys}))"
                    )
                else:
                    conn.exec_driver_sql(
                        f"UPDATE outbox_message SET key = 'hot' || mod(seq, {keys})"
                    )
        self.analyze()

    def analyze(self) -> None:
        """Fresh statistics, and on PostgreSQL no dead rows and no checkpoint due: what every
        drain starts from (restore() ends with it; call it again after changing the rows)."""
        assert self.engine is not None
        if self.mysql:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("ANALYZE TABLE outbox_message").all()
            return
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("VACUUM ANALYZE outbox_message")
            # A checkpoint now rather than in the middle of the next timed phase.
            with contextlib.suppress(Exception):
                conn.exec_driver_sql("CHECKPOINT")

    def empty(self) -> None:
        """No row in the table, and none left dead: a phase that starts from an empty outbox
        measures the relay, not the dead rows earlier phases left (autovacuum may be off)."""
        assert self.engine is not None
        with self.engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE outbox_message")

    def remaining(self) -> bool:
        """True while any row is pending or in flight (two partial-index probes: cheap)."""
        assert self.engine is not None
        with self.engine.connect() as conn:
            return bool(
                conn.execute(
                    text(
                        "SELECT EXISTS (SELECT 1 FROM outbox_message WHERE state = 'pending') "
                        "OR EXISTS (SELECT 1 FROM outbox_message WHERE state = 'in_flight')"
                    )
                ).scalar()
            )

    def by_state(self) -> dict[str, int]:
        assert self.engine is not None
        with self.engine.connect() as conn:
            rows = conn.execute(text("SELECT state, count(*) FROM outbox_message GROUP BY state"))
            return {str(state): int(n) for state, n in rows}

    def drop(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
            self.engine = None
        with self._admin.connect() as conn:
            conn.exec_driver_sql(self._drop_sql())
        self._admin.dispose()


# --------------------------------------------------------------------------- RabbitMQ


@dataclass
class BenchBroker:
    """A durable topic exchange and a durable queue bound to it, deleted by `delete()`."""

    amqp_url: str
    exchange: str
    queue: str

    def _channel(self) -> tuple[Any, Any]:
        params = pika.URLParameters(self.amqp_url)
        params.connection_attempts = 1
        params.socket_timeout = 5
        conn = pika.BlockingConnection(params)
        return conn, conn.channel()

    def declare(self) -> str:
        """Declare both, bind them; return the broker's version."""
        conn, ch = self._channel()
        try:
            ch.exchange_declare(self.exchange, exchange_type=EXCHANGE_TYPE, durable=True)
            ch.queue_declare(self.queue, durable=True)
            ch.queue_bind(self.queue, self.exchange, routing_key=BINDING_KEY)
            props = getattr(conn, "_impl", None)
            server = getattr(props, "server_properties", None) or {}
            version = server.get("version", b"?")
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            conn.close()

    def bind(self, routing_key: str) -> None:
        """Also route `routing_key` to the queue (the latency producers' key); `delete()` takes
        the binding with the queue."""
        conn, ch = self._channel()
        try:
            ch.queue_bind(self.queue, self.exchange, routing_key=routing_key)
        finally:
            conn.close()

    def purge(self) -> int:
        conn, ch = self._channel()
        try:
            return int(ch.queue_purge(self.queue).method.message_count)
        finally:
            conn.close()

    def purged(self, fn: Callable[[], T], expected: int, what: str) -> T:
        """`fn()`, then the queue purged, which counts what arrived: every confirmed message was
        routed to it, so anything but `expected` is a failure of the phase."""
        try:
            value = fn()
        finally:
            arrived = self.purge()
        if arrived != expected:
            raise RuntimeError(f"{what}: {arrived} messages in the queue, expected {expected}")
        return value

    def delete(self) -> None:
        conn, ch = self._channel()
        try:
            ch.queue_delete(self.queue)
            ch.exchange_delete(self.exchange)
        finally:
            conn.close()


def message_properties(message_id: uuid.UUID, created: float) -> Any:
    """The AMQP properties the relay puts on a row without key, headers or trace context."""
    return pika.BasicProperties(
        content_type=JSON_TYPE,
        delivery_mode=PERSISTENT,
        message_id=str(message_id),
        timestamp=int(created),
    )
