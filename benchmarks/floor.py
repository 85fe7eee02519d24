"""The least a relay can do: the bound under the relay's 80-byte and hot-key figures (PostgreSQL).

One thread, psycopg 3 and pika's SelectConnection, nothing of this project's relay: lease up to
`claim` ready rows with one UPDATE ... RETURNING (the columns the relay reads), publish each with
the properties the relay sends (message id, content type, persistent, timestamp, the stored
headers), and once the broker confirmed them, mark their rows with one UPDATE per burst of
confirms. A message counts in the window from its publish until its row is marked, as in the
relay. The caller gives the relay's claim size and window ceiling; the window is fixed at that
ceiling from the start (the relay's sizes itself below it).

What it leaves out (keys and their order, retries and dead letters, circuits, rate limits,
leases' upkeep, suspects, signing, tracing, metrics, checking each field before it goes) makes its
drain a bound on the relay's at the same window, and its CPU per message a floor for a relay of
this design on pika's own encoder: it publishes with `basic_publish`, where the relay writes its
frames itself (relay/amqp/frames.py) and may go below it.

`drain_floor_keys` is the same for a backlog of hot keys: each key's messages are published one
at a time, the next from the confirm of the one before (the relay's chains, relay/loop/chains.py),
each key's next run claimed on a second thread while its chain still has CHUNK messages to send,
and the confirmed ones marked a CHUNK at a time there too. The database never holds a chain up, so
its drain is the bound on the relay's hot keys: the broker's confirm pace beside the database's
work for the same rows on the same two cores.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pika
import psycopg
from pika import spec
from pika.adapters.select_connection import SelectConnection
from sqlalchemy.engine import make_url

from benchmarks.drain import DrainError, DrainResult
from benchmarks.machine import CpuMeter
from relay.loop.chains import CHUNK, NEXT_RUN

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
_CLAIM_RUN = """
UPDATE outbox_message SET state = 'in_flight', lease_owner = 'floor', lease_token = %(token)s,
       lease_expires_at = now() + interval '30 seconds', attempts = attempts + 1
WHERE seq = ANY(ARRAY(
    SELECT seq FROM outbox_message
    WHERE key = %(key)s AND seq > %(after)s AND state IN ('pending', 'in_flight', 'dead')
    ORDER BY key, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)) AND state = 'pending'
RETURNING seq, id, exchange, routing_key, payload, content_type, headers, created_at
"""
T = TypeVar("T")

_KEYS = "SELECT DISTINCT key FROM outbox_message WHERE state = 'pending' AND key IS NOT NULL"
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
        self.db.execute("SET timezone = 'UTC'")  # as the relay's session: times in datetime.UTC
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
            self._close()
        if self.error is not None:
            raise DrainError(f"floor relay: {self.error} ({self.marked} of {self.expected})")
        seconds = self.finished - self.started
        return DrainResult("floor", self.marked, seconds, cpu=self.meter.stop(seconds))

    def _close(self) -> None:
        self.db.close()

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

    def _acked(self, frame: Any) -> list[int] | None:
        """The delivery tags a confirm acks; None, and the run failed, if it is a nack."""
        method = frame.method
        if not isinstance(method, spec.Basic.Ack):
            self._fail("the broker nacked a message")
            return None
        tag = method.delivery_tag
        if not method.multiple:
            return [tag]
        return list(itertools.takewhile(lambda t: t <= tag, self.tags))

    def _on_confirm(self, frame: Any) -> None:
        acked = self._acked(frame)
        if acked is None:
            return
        self.confirmed.extend(self.tags.pop(t) for t in acked)
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
        for row in sorted(rows):
            publish(row[2], row[3], row[4], _properties(row), True)
            tags[tag] = row[0]
            tag += 1
        self.next_tag = tag
        self.in_window += len(rows)


def _properties(row: Sequence[Any]) -> pika.BasicProperties:
    """What the relay sends beside a claimed row's body (a row of _CLAIM's columns)."""
    return pika.BasicProperties(
        content_type=row[5],
        delivery_mode=2,
        message_id=str(row[1]),
        timestamp=int(row[7].timestamp()),
        headers=row[6],
    )


class _KeyedFloor(_Floor):
    """One chain per key on the IO loop's thread; every statement on a second thread, its
    result handed back to the IO loop (add_callback_threadsafe)."""

    def __init__(
        self, db_url: str, amqp_url: str, expected: int, run: int, chunk: int, timeout: float
    ):
        super().__init__(db_url, amqp_url, expected, run, 0, timeout)
        self.chunk = chunk
        with self.db.cursor() as cur:  # before the clock runs: not what is measured
            cur.execute(_KEYS)
            keys = sorted(str(key) for (key,) in cur.fetchall())
        self.chains: dict[str, deque[Sequence[Any]]] = {key: deque() for key in keys}
        self.after = dict.fromkeys(keys, 0)  # the last seq claimed of each key
        self.claiming: set[str] = set()  # keys whose next run is being claimed
        self.ended: set[str] = set()  # keys whose last claim came short: nothing more
        self.lanes: dict[int, str] = {}  # delivery tag -> its key, sent and unconfirmed
        self.sending: set[str] = set()  # keys with a message unconfirmed
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="floor-db")

    def _close(self) -> None:
        self.pool.shutdown(wait=True)
        super()._close()

    def _on_ready(self, _frame: Any) -> None:
        self.meter.start()
        self.started = time.perf_counter()
        for key in self.chains:
            self._claim_run(key)

    def _on_confirm(self, frame: Any) -> None:
        acked = self._acked(frame)
        if acked is None:
            return
        for t in acked:
            self.confirmed.append(self.tags.pop(t))
            key = self.lanes.pop(t)
            self.sending.discard(key)
            self._send(key)
        self._mark(len(self.confirmed) >= self.chunk)

    def _send(self, key: str) -> None:
        chain = self.chains[key]
        if not chain:
            return  # its next run is being claimed, or it has no more
        row = chain.popleft()
        self.channel.basic_publish(row[2], row[3], row[4], _properties(row), True)
        self.tags[self.next_tag] = row[0]
        self.lanes[self.next_tag] = key
        self.next_tag += 1
        self.sending.add(key)
        if len(chain) <= self.chunk and key not in self.claiming and key not in self.ended:
            self._claim_run(key)

    def _claim_run(self, key: str) -> None:
        self.claiming.add(key)
        params = {"token": self.token, "key": key, "after": self.after[key], "limit": self.claim}

        def claim() -> list[tuple[Any, ...]]:
            with self.db.cursor() as cur:
                cur.execute(_CLAIM_RUN, params)
                return sorted(cur.fetchall())

        self._in_background(claim, lambda rows: self._claimed(key, rows))

    def _claimed(self, key: str, rows: list[tuple[Any, ...]]) -> None:
        self.claiming.discard(key)
        if len(rows) < self.claim:
            self.ended.add(key)
        if rows:
            self.after[key] = rows[-1][0]
            self.chains[key].extend(rows)
            if key not in self.sending:
                self._send(key)
        self._mark(False)

    def _mark(self, full: bool) -> None:
        """Mark what was confirmed: a chunk at a time, and the rest once nothing is moving."""
        if not self.confirmed or not (full or not (self.sending or self.claiming)):
            return
        seqs, self.confirmed = self.confirmed, []
        params = {"seqs": seqs, "token": self.token}

        def mark() -> int:
            with self.db.cursor() as cur:
                cur.execute(_MARK, params)
            return len(seqs)

        self._in_background(mark, self._marked)

    def _marked(self, count: int) -> None:
        self.marked += count
        if self.marked >= self.expected:
            self.finished = time.perf_counter()
            self.conn.close()

    def _in_background(self, work: Callable[[], T], then: Callable[[T], None]) -> None:
        """Run `work` on the database's thread, then `then(result)` on the IO loop's."""
        ioloop = self.conn.ioloop

        def job() -> None:
            try:
                result = work()
            except Exception as exc:  # the IO loop's thread reports it
                why = f"database: {exc!r}"
                ioloop.add_callback_threadsafe(lambda: self._fail(why))
                return
            ioloop.add_callback_threadsafe(lambda: then(result))

        self.pool.submit(job)


def drain_floor(
    db_url: str, amqp_url: str, expected: int, *, claim: int, window: int, timeout: float
) -> DrainResult:
    """Drain `expected` ready unkeyed rows with the floor relay above, `claim` rows a claim at
    most and `window` in it; rate from its first claim to its last mark."""
    return _Floor(db_url, amqp_url, expected, claim, window, timeout).run()


def drain_floor_keys(
    db_url: str,
    amqp_url: str,
    expected: int,
    *,
    run: int = NEXT_RUN,
    chunk: int = CHUNK,
    timeout: float,
) -> DrainResult:
    """Drain `expected` ready keyed rows with the keyed floor relay above, each key one message
    unconfirmed at a time, `run` of a key a claim and `chunk` confirmed a mark (the relay's
    sizes by default); rate from its first claim to its last mark."""
    return _KeyedFloor(db_url, amqp_url, expected, run, chunk, timeout).run()
