"""A claimed row as it goes on the wire (the contract's "On the wire" section, in code)."""

from __future__ import annotations

from typing import Any

from outbox.amqp_codec import Properties
from relay.ports import Claimed, MalformedRow, Outgoing

PERSISTENT = 2
KEY_HEADER = "x-outbox-key"


def to_outgoing(
    row: Claimed, *, traceparent: str | None = None, tracestate: str | None = None
) -> Outgoing:
    """The message for `row`; `traceparent`/`tracestate` replace the stored ones (the relay's
    send span, when tracing is on)."""
    if row.headers is not None and not isinstance(row.headers, dict):
        raise MalformedRow(f"headers must be a JSON object, found {type(row.headers).__name__}")
    headers: dict[str, Any] = dict(row.headers) if row.headers else {}
    if row.key is not None:
        headers[KEY_HEADER] = row.key
    parent = traceparent or row.traceparent
    if parent:
        headers["traceparent"] = parent
        state = tracestate if traceparent else row.tracestate
        if state:
            headers["tracestate"] = state
    for name, value in headers.items():
        if not isinstance(value, str | int | float | bool):
            raise MalformedRow(f"header {name!r} has a {type(value).__name__} value")
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            raise MalformedRow(f"header {name!r}: {value} does not fit in 64 bits")
    for what, value in (("exchange", row.exchange), ("routing_key", row.routing_key)):
        if len(value.encode("utf-8")) > 255:
            raise MalformedRow(f"{what} is longer than 255 bytes")
    props = Properties(  # float headers as AMQP doubles (outbox/amqp_codec.py)
        content_type=row.content_type,
        delivery_mode=PERSISTENT,
        message_id=str(row.id),
        timestamp=int(row.created_at.timestamp()),
        headers=headers or None,
    )
    return Outgoing(row.seq, str(row.id), row.exchange, row.routing_key, row.payload, props)
