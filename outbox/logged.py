"""A message written to PostgreSQL's write-ahead log instead of the outbox table: the bytes of a
transactional logical decoding message (`pg_logical_emit_message(true, PREFIX, ...)`), which the
relay reads from its replication slot when it runs with `--capture logical`.

The message exists only if the transaction commits, and reaches the relay in commit order. It
carries everything the table's row would, packed for a cheap read: a fixed head of field
lengths, then the fields. The database appends the creation time itself (`EMIT_SQL`), from the
clock and at the moment a row's `created_at` would take (`statement_timestamp()`).

Layout (network byte order), version 1:

    B version   B flags (ROW: the message also has a held row in outbox_message)
    i priority  i max_attempts (-1: none)   q delay in microseconds (0: none)
    H exchange  H routing_key  H content_type  H key  H traceparent  H tracestate
    I headers (JSON)  I payload                     -- byte lengths, ABSENT: None
    36s id, then each field's bytes in the order above
    q created_at: microseconds since the Unix epoch (appended by EMIT_SQL)

The text fields are UTF-8, the id its 36-character text form, the headers a JSON object.
`unpack` runs in the relay for every message, so it is written for speed: one struct read for
the head, the fields sliced without a loop, the tuple built without keyword handling.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

# A held row's available_at (a message with an idempotency key or a delay has a row from its
# enqueue, out of every relay's claims until the relay reads the log's copy): the last day a
# Python datetime can hold, so every driver reads it (psycopg 3 refuses 'infinity').
HELD_UNTIL = "9999-12-31 00:00:00+00"
# The prefix the relay reads; any other prefix in the slot is someone else's and is skipped.
PREFIX = "outbox"
VERSION = 1
ROW = 1  # flag: the message also has a row in outbox_message, held until the relay reads it
_HEAD = struct.Struct("!BBiiqHHHHHHII36s")  # the head and the id, read in one call
_TIME = struct.Struct("!q")
_ABSENT16 = 0xFFFF
_ABSENT32 = 0xFFFFFFFF
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)

# The creation time the database appends: the statement's time in microseconds since the epoch
# (exact from PostgreSQL 14, where extract returns numeric), the moment a row's created_at takes.
STAMP_SQL = "int8send((extract(epoch from statement_timestamp()) * 1000000)::int8)"
# What enqueue runs for one message (psycopg's and psycopg2's paramstyle; outbox/pg_emit.py
# renders it for every driver): the packed message with the database's time appended. FROM, so
# the row that comes back has no column: nothing for the driver and SQLAlchemy to convert.
EMIT_SQL = (
    f"SELECT FROM pg_logical_emit_message(true, '{PREFIX}', %(message)s::bytea || {STAMP_SQL})"
)

# The headers as compact JSON, by an encoder made once (json.dumps with arguments builds one per
# call); raw_decode skips json.loads's whitespace scans, and pack writes no whitespace.
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_raw_decode = json.JSONDecoder().raw_decode
_new = tuple.__new__


class LoggedError(ValueError):
    """The bytes are not a message this version of the relay can read."""


class Logged(NamedTuple):
    """A message read back from the log."""

    id: str
    has_row: bool
    exchange: str
    routing_key: str
    payload: bytes
    content_type: str
    headers: Mapping[str, Any] | None
    key: str | None
    priority: int
    max_attempts: int | None
    delay: dt.timedelta | None
    traceparent: str | None
    tracestate: str | None
    created_at: dt.datetime

    @property
    def available_at(self) -> dt.datetime:
        """When it may be published: its creation time, plus its delay if it has one."""
        return self.created_at if self.delay is None else self.created_at + self.delay


def pack(params: Mapping[str, Any], *, delay: dt.timedelta | None, has_row: bool) -> bytes:
    """The message for a prepared row's bind values (outbox/prepared.py), without the time
    the database appends. LoggedError if a field is too long for its length in the head."""
    exchange = params["exchange"].encode()
    routing_key = params["routing_key"].encode()
    content_type = params["content_type"].encode()
    key, traceparent, tracestate = params["key"], params["traceparent"], params["tracestate"]
    key_bytes = b"" if key is None else key.encode()
    traceparent_bytes = b"" if traceparent is None else traceparent.encode()
    tracestate_bytes = b"" if tracestate is None else tracestate.encode()
    headers = params["headers"]
    header_bytes = b"" if headers is None else _dumps(headers).encode()
    payload = params["payload"]
    longest = max(
        len(exchange),
        len(routing_key),
        len(content_type),
        len(key_bytes),
        len(traceparent_bytes),
        len(tracestate_bytes),
    )
    # A text of 0xFFFF bytes would read as absent; the validated fields are far shorter.
    if longest >= _ABSENT16 or max(len(header_bytes), len(payload)) >= _ABSENT32:
        raise LoggedError("a field is too long for an outbox message")
    max_attempts = params["max_attempts"]
    try:
        head = _HEAD.pack(
            VERSION,
            ROW if has_row else 0,
            params["priority"],
            -1 if max_attempts is None else max_attempts,
            0 if delay is None else delay // _MICROSECOND,
            len(exchange),
            len(routing_key),
            len(content_type),
            _ABSENT16 if key is None else len(key_bytes),
            _ABSENT16 if traceparent is None else len(traceparent_bytes),
            _ABSENT16 if tracestate is None else len(tracestate_bytes),
            _ABSENT32 if headers is None else len(header_bytes),
            len(payload),
            str(params["id"]).encode(),
        )
    except struct.error as exc:  # a priority, max_attempts or delay out of its field's range
        raise LoggedError(f"outbox message: {exc}") from None
    return b"".join(
        (
            head,
            exchange,
            routing_key,
            content_type,
            key_bytes,
            traceparent_bytes,
            tracestate_bytes,
            header_bytes,
            payload,
        )
    )


def unpack(data: bytes) -> Logged:
    """The message in `data` (what the log holds: `pack`'s bytes and the appended time).
    LoggedError if it is not one this version reads."""
    if data and data[0] != VERSION:
        raise LoggedError(f"outbox message version {data[0]}; this relay reads {VERSION}")
    try:
        (
            _,
            flags,
            priority,
            max_attempts,
            delay_us,
            n_exchange,
            n_routing_key,
            n_content_type,
            n_key,
            n_traceparent,
            n_tracestate,
            n_headers,
            n_payload,
            message_id,
        ) = _HEAD.unpack_from(data)
    except struct.error:
        raise LoggedError(f"{len(data)} bytes: too short for an outbox message") from None
    try:
        at = _HEAD.size
        end = at + n_exchange
        exchange = data[at:end].decode()
        at = end + n_routing_key
        routing_key = data[end:at].decode()
        end = at + n_content_type
        content_type = data[at:end].decode()
        key = traceparent = tracestate = headers = None
        if n_key != _ABSENT16:
            at = end + n_key
            key = data[end:at].decode()
            end = at
        if n_traceparent != _ABSENT16:
            at = end + n_traceparent
            traceparent = data[end:at].decode()
            end = at
        if n_tracestate != _ABSENT16:
            at = end + n_tracestate
            tracestate = data[end:at].decode()
            end = at
        at = end if n_headers == _ABSENT32 else end + n_headers
        if len(data) != at + n_payload + 8:
            raise LoggedError(f"outbox message of {len(data)} bytes: its lengths say otherwise")
        if n_headers != _ABSENT32:
            text = data[end:at].decode()
            headers, parsed = _raw_decode(text)
            if parsed != len(text) or type(headers) is not dict:
                raise LoggedError("outbox message whose headers are not a JSON object")
        end = at + n_payload
        payload = data[at:end]
        (created_us,) = _TIME.unpack_from(data, end)
        return _new(
            Logged,
            (
                message_id.decode(),
                flags & ROW == ROW,
                exchange,
                routing_key,
                payload,
                content_type,
                headers,
                key,
                priority,
                None if max_attempts < 0 else max_attempts,
                None if delay_us == 0 else dt.timedelta(0, 0, delay_us),
                traceparent,
                tracestate,
                _EPOCH + dt.timedelta(0, 0, created_us),
            ),
        )
    except (UnicodeDecodeError, json.JSONDecodeError, OverflowError) as exc:
        raise LoggedError(f"outbox message that does not decode: {exc}") from None


def stamped(message: bytes, created_at: dt.datetime) -> bytes:
    """`message` with a creation time appended as EMIT_SQL's server would (for tests, and for
    reading a message back without a database)."""
    return message + _TIME.pack((created_at - _EPOCH) // _MICROSECOND)
