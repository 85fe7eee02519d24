"""The least a relay can do: the bound under the relay's 80-byte figures (PostgreSQL).

One thread, psycopg 3 and pika's SelectConnection, nothing of this project's relay: lease up to
`claim` ready rows with one UPDATE ... RETURNING (the columns the relay reads), publish each with
the properties the relay sends (message id, content type, persistent, timestamp, the stored
headers), and once the broker confirmed them, mark their rows with one UPDATE per burst of
confirms. A message counts in the window from its publish until its row is marked, as in the
relay. The caller gives the relay's claim size and window ceiling; the window is fixed at that
ceiling from the start (the relay's sizes itself below it).

What it leaves out (keys and their order, retries and dead letters, circuits, rate limits,
leases' upkeep, suspects, signing, tracing, metrics, checking each field before it goes) makes its
CPU per message a floor for any relay of this design on these libraries, and its drain a bound
on the relay's at the same window.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pika
import psycopg
from pika import spec
from pika.adapters.select_connection import SelectConnection
from sqlalchemy.engine import make_url

from benchmarks.drain import DrainError, DrainResult
from benchmarks.machine import CpuMeter

_CLAIM = """
UPDATE outbox_message SET state = 'in_flight', lease_owner = 'floor', lease_token = %(token)s,
       lease_expires_at = now() + interval '30 seconds', attempts = attempts + 1
WHERE seq = ANY(ARRAY(
    SELECT seq FROM outbox_message
    WHERE state = 'pending' AND key IS NULL AND available_at <= now()
    ORDER BY priority DESC, available_at, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))
RETURNING seq, id, exchange, routing_key, payload, content_type, headers, created_at
"""
_MARK = """
UPDATE outbox_message SET state = 'published', published_at = now(), lease_owner = NULL,
       lease_token = NULL, lease_expires_at = NULL
WHERE seq = ANY(%(seqs)s) AND lease_token = %(token)s
"""


class _Floor:
    def __init__(
        self, db_url: str, amqp_url: str, expected: int, claim: int, window: int, timeout: float
    ):
        # libpq reads the URL as SQLAlchemy writes it, query (search_path options) and all. As
        # the relay opens its connection: no server-side prepared statements (PgBouncer).
        dsn = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.db = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
        self.params = pika.URLParameters(amqp_url)
        self.params.connection_attempts = 1
        self.expected = expected
        self.claim = claim
        self.window = window
        self.timeout = timeout
        self.token = uuid.uuid4()
        self.tags: dict[int, int] = {}  # delivery tag -> seq, sent and unconfirmed
        self.next_tag = 1
        self.confirmed: list[int] = []  # seqs confirmed and not yet marked
        self.in_window = 0  # published and not yet marked
        self.marked = 0
        self.turn_due = False
        self.started = self.finished = 0.0
        self.error: str | None = None
        self.meter = CpuMeter()
        self.conn: Any = None
        self.channel: Any = None

    def run(self) -> DrainResult:
        self.conn = SelectConnection(
            parameters=self.params,
            on_open_callback=lambda c: c.channel(on_open_callback=self._on_channel),
            on_open_error_callback=lambda _c, e: self._fail(f"cannot connect: {e!r}"),
            on_close_callback=lambda _c, _r: self.conn.ioloop.stop(),
        )
        self.conn.ioloop.call_later(self.timeout, lambda: self._fail("timed out"))
        try:
            self.conn.ioloop.start()
        finally:
            self.conn.ioloop.close()  # its wake-up socket pair
            self.db.close()
        if self.error is not None:
            raise DrainError(f"floor relay: {self.error} ({self.marked} of {self.expected})")
        seconds = self.finished - self.started
        return DrainResult("floor", self.marked, seconds, cpu=self.meter.stop(seconds))

    def _fail(self, why: str) -> None:
        if self.error is None and self.marked < self.expected:
            self.error = why
        if self.conn.is_open:
            self.conn.close()
        else:
            self.conn.ioloop.stop()

    def _on_channel(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_return_callback(lambda *_: self._fail("a message came back unroutable"))
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_ready)

    def _on_ready(self, _frame: Any) -> None:
        self.meter.start()
        self.started = time.perf_counter()
        self._turn()

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if not isinstance(method, spec.Basic.Ack):
            self._fail("the broker nacked a message")
            return
        tags, tag = self.tags, method.delivery_tag
        done = list(itertools.takewhile(lambda t: t <= tag, tags)) if method.multiple else [tag]
        self.confirmed.extend(tags.pop(t) for t in done)
        if not self.turn_due:  # one turn after every confirm the poll read: one mark for them
            self.turn_due = True
            self.conn.ioloop.call_later(0, self._turn)

    def _turn(self) -> None:
        self.turn_due = False
        if self.confirmed:
            seqs, self.confirmed = self.confirmed, []
            with self.db.cursor() as cur:
                cur.execute(_MARK, {"seqs": seqs, "token": self.token})
            self.in_window -= len(seqs)
            self.marked += len(seqs)
            if self.marked >= self.expected:
                self.finished = time.perf_counter()
                self.conn.close()
                return
        while self.window - self.in_window >= min(self.claim, self.window):
            rows = self._claim(min(self.claim, self.window - self.in_window))
            if not rows:
                break
            self._publish(rows)

    def _claim(self, limit: int) -> Sequence[tuple[Any, ...]]:
        with self.db.cursor() as cur:
            cur.execute(_CLAIM, {"token": self.token, "limit": limit})
            return cur.fetchall()

    def _publish(self, rows: Sequence[tuple[Any, ...]]) -> None:
        publish, tags, tag = self.channel.basic_publish, self.tags, self.next_tag
        for seq, id_, exchange, routing_key, payload, content_type, headers, created in sorted(
            rows
        ):
            props = pika.BasicProperties(
                content_type=content_type,
                delivery_mode=2,
                message_id=str(id_),
                timestamp=int(created.timestamp()),
                headers=headers,
            )
            publish(exchange, routing_key, payload, props, True)
            tags[tag] = seq
            tag += 1
        self.next_tag = tag
        self.in_window += len(rows)


def drain_floor(
    db_url: str, amqp_url: str, expected: int, *, claim: int, window: int, timeout: float
) -> DrainResult:
    """Drain `expected` ready unkeyed rows with the floor relay above, `claim` rows a claim at
    most and `window` in it; rate from its first claim to its last mark."""
    return _Floor(db_url, amqp_url, expected, claim, window, timeout).run()
