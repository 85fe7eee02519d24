"""The row `enqueue` and `enqueue_async` write, validated and built before the database is touched.

Both calls run `prepare` in the caller's own thread or task, so the trace context it captures is
the caller's (OpenTelemetry keeps it in contextvars), and every refusal happens before any SQL:
the transaction is left exactly as it was.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from outbox import encoding, tracecontext
from outbox.config import settings
from outbox.ids import new_id


@dataclass(frozen=True, slots=True)
class Prepared:
    """A valid message, ready to insert: every column but the clock-dependent ones."""

    id: uuid.UUID
    params: Mapping[str, Any]  # bind values named after the columns of outbox_message
    idempotency_key: str | None
    wait: dt.timedelta | None  # publish no earlier than the insert time plus this


def prepare(
    *,
    exchange: str,
    routing_key: str,
    payload: object,
    key: str | None,
    headers: Mapping[str, str | int | float | bool] | None,
    idempotency_key: str | None,
    delay: float | dt.timedelta | None,
    priority: int,
    max_attempts: int | None,
    content_type: str | None,
) -> Prepared:
    """Validate `enqueue`'s arguments and build the row; raise an `InvalidMessage` if one is bad."""
    limits = settings()
    encoding.check_destination(exchange, routing_key)
    encoded = encoding.encode_payload(
        payload,
        content_type,
        limits.max_payload_bytes,
        limits.max_json_depth,
        limits.json_default,
    )
    # The checks of the options left at their defaults (None, a priority of 0) are skipped: each
    # would pass its value through, and a call's every few microseconds count (see
    # docs/performance.md, what one enqueue costs).
    checked_headers = None if headers is None else encoding.check_headers(headers)
    wait = None if delay is None else encoding.check_delay(delay)
    if key is not None:
        key = encoding.check_text_option("key", key)
    if idempotency_key is not None:
        idempotency_key = encoding.check_text_option("idempotency_key", idempotency_key)
    if priority != 0 or type(priority) is not int:
        priority = encoding.check_int_option("priority", priority, encoding.INT32_MIN)
    if max_attempts is not None:
        max_attempts = encoding.check_int_option("max_attempts", max_attempts, 1)
    traceparent, tracestate = tracecontext.current()
    if checked_headers:  # the relay's own headers alone are under 1 KiB
        # With the relay's own headers: what the broker will be sent is what is measured.
        encoding.check_header_size(
            checked_headers,
            key=key,
            traceparent=traceparent,
            tracestate=tracestate,
            limit=limits.max_header_bytes,
        )
    message_id = new_id()
    params: dict[str, Any] = {
        "id": message_id,
        "exchange": exchange,
        "routing_key": routing_key,
        "payload": encoded.body,
        "content_type": encoded.content_type,
        "headers": checked_headers,
        "key": key,
        "idempotency_key": idempotency_key,
        "priority": priority,
        "max_attempts": max_attempts,
        "traceparent": traceparent,
        "tracestate": tracestate,
    }
    return Prepared(message_id, params, idempotency_key, wait)


def chunks(prepared: Sequence[Prepared], rows: int, size: int) -> Iterator[Sequence[Prepared]]:
    """`prepared` in order, in runs of at most `rows` messages whose payloads and headers
    together come to at most `size` bytes (a message larger than that alone): what one
    statement of `enqueue_many` sends."""
    start, total = 0, 0
    for index, one in enumerate(prepared):
        weight = len(one.params["payload"])
        headers = one.params["headers"]
        if headers:
            weight += encoding.header_table_size(headers)
        if index > start and (index - start == rows or total + weight > size):
            yield prepared[start:index]
            start, total = index, 0
        total += weight
    if start < len(prepared):
        yield prepared[start:]


def runs(
    prepared: Sequence[Prepared], alone: Callable[[Prepared], bool]
) -> Iterator[Sequence[Prepared]]:
    """`prepared` in order, as runs of messages written together and, between them, each message
    `alone` says is written by a statement of its own, in a run of one."""
    start = 0
    for index, one in enumerate(prepared):
        if not alone(one):
            continue
        if start < index:
            yield prepared[start:index]
        yield prepared[index : index + 1]
        start = index + 1
    if start < len(prepared):
        yield prepared[start:]
