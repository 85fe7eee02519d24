"""A claimed row as it goes on the wire (the contract's "On the wire" section, in code).

A stored row may hold anything (a hand-edited row, a bug, another writer): every field is
checked here, per row and completely, before anything is sent. What fails raises MalformedRow
naming the field, and the loop dead-letters that row alone. Anything that got past this check
and failed later would fail worse: an encoding error inside pika's IO, or a frame RabbitMQ
answers by closing the connection, which republishes every message then in flight.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from outbox.encoding import RESERVED_HEADERS, RESERVED_PREFIX, UnreadableJson
from outbox.signing import Signer
from relay.amqp import frames
from relay.ports import Claimed, MalformedRow, Outgoing

PERSISTENT = 2
KEY_HEADER = "x-outbox-key"
SHORTSTR_MAX = 255  # bytes of an AMQP short string
# RabbitMQ's default frame_max (128 KiB); the publisher passes the value its connection
# negotiated.
DEFAULT_FRAME_MAX = 131072
_INT64 = range(-(2**63), 2**63)
_TIMESTAMP = range(0, 2**64)  # an unsigned 64-bit number on the wire
# W3C trace context (https://www.w3.org/TR/trace-context/): version 00's exact shape, and a
# tracestate of printable ASCII within the standard's 32 members of at most 256 characters each.
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE = re.compile(r"[\x20-\x7e]{1,8224}")
# content_encoding as kombu (Celery) and Spring AMQP read it: the character set of a text body,
# or "binary" for bytes to be handed over undecoded. Without it kombu decodes every body it has no
# serializer for as UTF-8, and raw bytes fail.
TEXT_ENCODING = "utf-8"
BINARY_ENCODING = "binary"


def to_outgoing(
    row: Claimed,
    *,
    traceparent: str | None = None,
    tracestate: str | None = None,
    frame_max: int = DEFAULT_FRAME_MAX,
    signer: Signer | None = None,
) -> Outgoing:
    """The message for `row`, or MalformedRow naming the field that cannot go on the wire.

    `traceparent`/`tracestate` replace the stored ones (the relay's send span, when tracing is
    on); `frame_max` is the connection's, which the header frame must fit in; `signer` adds the
    Standard Webhooks headers (outbox/signing.py), signed now over the body as sent."""
    exchange, routing_key, content_type = row.exchange, row.routing_key, row.content_type
    if type(exchange) is not str or type(routing_key) is not str:
        _shortstr("exchange", exchange)  # one of them is not text: this names it
        _shortstr("routing_key", routing_key)
    method = _publish_method(exchange, routing_key)
    if type(content_type) is not str:
        _text("content_type", content_type)  # raises, naming it
    content = _content(content_type)
    body = row.payload
    if type(body) is not bytes:
        if not isinstance(body, bytearray | memoryview):
            raise MalformedRow(f"payload is stored as {type(body).__name__}, not bytes")
        body = bytes(body)
    headers = _stored_headers(row.headers)
    if row.key is not None:
        headers[KEY_HEADER] = _text("key", row.key)
    if traceparent:
        # The relay's send span; the tracestate it carries on may still be the stored one.
        parent: str | None = traceparent
        state = _tracestate(tracestate)
    else:
        parent, state = _stored_trace(row)
    if parent:
        headers["traceparent"] = parent
        if state:
            headers["tracestate"] = state
    message_id = row.id
    if signer is not None:
        # Over the exact body bytes below; a stored header of the same name is replaced.
        headers.update(signer.headers(message_id, body))
    created = int(row.created_at.timestamp())
    if created not in _TIMESTAMP:
        raise MalformedRow(f"created_at {row.created_at} is before 1970")
    head = frames.header(  # float headers as AMQP doubles (outbox/amqp_codec.py)
        len(body), content=content, headers=headers, message_id=message_id, timestamp=created
    )
    if frames.header_frame_size(head) > frame_max:
        raise MalformedRow(
            f"headers: the properties encode to a {frames.header_frame_size(head)}-byte frame, "
            f"over the broker's frame_max of {frame_max} bytes"
        )
    return Outgoing(row.seq, message_id, exchange, routing_key, body, method, head)


# A relay sends to a handful of destinations with a handful of content types: each is checked
# and encoded once, not once a message (a value that fails raises, and is not cached).
@functools.lru_cache(maxsize=4096)
def _publish_method(exchange: str, routing_key: str) -> bytes:
    """The basic.publish arguments for a destination, its names checked."""
    return frames.publish_method(
        _shortstr("exchange", exchange), _shortstr("routing_key", routing_key)
    )


@functools.lru_cache(maxsize=256)
def _content(content_type: str) -> bytes:
    """A content type and the content encoding derived from it, checked and encoded."""
    checked = _shortstr("content_type", content_type)
    return frames.content_fields(checked, content_encoding(checked))


def with_properties(ref: int, exchange: str, routing_key: str, body: bytes, props: Any) -> Outgoing:
    """A message whose properties pika encodes (`pika.BasicProperties`, with a message_id): for
    tests and benchmarks that publish what the relay did not build."""
    header = frames.header_of(len(body), b"".join(props.encode()))
    method = frames.publish_method(exchange, routing_key)
    return Outgoing(ref, props.message_id, exchange, routing_key, body, method, header)


@functools.lru_cache(maxsize=256)  # a deployment sends a handful of content types
def content_encoding(content_type: str) -> str:
    """The content_encoding that says how to read a body of `content_type`.

    Derived on the wire, not stored, so rows written before it existed get it too. A charset
    the content type names wins (lowercased); JSON (RFC 8259: UTF-8 between systems) and text
    without one are UTF-8, as enqueue writes them; anything else is bytes: "binary".
    """
    media, *params = content_type.split(";")
    for param in params:
        name, _, value = param.partition("=")
        charset = value.strip().strip('"').strip().lower()
        if name.strip().lower() == "charset" and charset:
            return charset
    media = media.strip().lower()
    if media == "application/json" or media.endswith("+json") or media.startswith("text/"):
        return TEXT_ENCODING
    return BINARY_ENCODING


def _text(what: str, value: object) -> str:
    """A text field: a str that UTF-8 can encode, without NUL (enqueue refuses both)."""
    if type(value) is not str:
        raise MalformedRow(f"{what} is stored as {type(value).__name__}, not text")
    if "\x00" in value:
        raise MalformedRow(f"{what} contains a NUL character")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise MalformedRow(f"{what} is not valid UTF-8: {exc.reason}") from None
    return value


def _shortstr(what: str, value: object) -> str:
    text = _text(what, value)
    if len(text) > SHORTSTR_MAX // 4 and _str_size(text) - 5 > SHORTSTR_MAX:
        raise MalformedRow(f"{what} is {_str_size(text) - 5} bytes, over AMQP's limit of 255")
    return text


def _str_size(value: str) -> int:
    """Bytes of a string header value: type octet, 4-byte length, UTF-8 (already checked)."""
    return 5 + (len(value) if value.isascii() else len(value.encode("utf-8")))


def _stored_headers(stored: object) -> dict[str, Any]:
    """The caller's headers, checked, without reserved names (those are the relay's alone)."""
    if stored is None:
        return {}
    if isinstance(stored, UnreadableJson):  # the store's decoder could not read it
        raise MalformedRow(f"headers are {stored.reason}")
    if not isinstance(stored, Mapping):
        raise MalformedRow(f"headers must be a JSON object, found {_describe(stored)}")
    headers: dict[str, Any] = {}
    for name, value in stored.items():
        if type(name) is not str or not name:
            raise MalformedRow(f"headers: a name is {name!r}, not a non-empty string")
        lowered = name.lower()
        if lowered in RESERVED_HEADERS or lowered.startswith(RESERVED_PREFIX):
            continue  # the relay sets its own, or none: a stored copy is never sent
        if _str_size(_text(f"header name {name[:40]!r}", name)) - 5 > SHORTSTR_MAX:
            raise MalformedRow(f"header name {name[:40]!r}... is over AMQP's limit of 255 bytes")
        kind = type(value)
        if kind is str:
            _text(f"header {name!r}", value)
        elif kind is int:
            if value not in _INT64:
                raise MalformedRow(f"header {name!r}: {value} does not fit in 64 bits")
        elif kind is float:
            if not math.isfinite(value):
                raise MalformedRow(f"header {name!r}: {value} is not a finite number")
        elif kind is not bool:
            raise MalformedRow(f"header {name!r} has a {_describe(value)} value")
        headers[name] = value
    return headers


def _stored_trace(row: Claimed) -> tuple[str | None, str | None]:
    """The trace context enqueue stored (W3C), checked: it becomes two headers."""
    parent, state = row.traceparent, row.tracestate
    if parent is None:
        return None, None
    if type(parent) is not str or not _TRACEPARENT.fullmatch(parent):
        raise MalformedRow(f"traceparent {parent!r:.80} is not a W3C traceparent")
    return parent, _tracestate(state)


def _tracestate(state: object) -> str | None:
    if state is None or (type(state) is str and _TRACESTATE.fullmatch(state)):
        return state
    raise MalformedRow(f"tracestate {state!r:.80} is not a W3C tracestate")


def _describe(value: object) -> str:
    text = str(value) if not isinstance(value, str | bytes) else repr(value)
    return f"{type(value).__name__} {text[:80]}"
