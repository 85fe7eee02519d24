"""content_encoding on the wire (relay/amqp/wire.py): derived from the stored content type, so
kombu (Celery) reads JSON, text and bytes as they were enqueued, old rows included."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kombu import serialization
from kombu.exceptions import DecodeError

from outbox.encoding import BYTES_TYPE, JSON_TYPE, TEXT_TYPE, encode_payload
from relay.amqp.frames import decode_properties
from relay.amqp.wire import content_encoding, to_outgoing
from relay.ports import Claimed, MalformedRow

NOW = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
# kombu's own decoder (what Celery and kombu consumers run on every body), typed for mypy.
loads: Callable[[bytes, str | None, str | None], Any] = serialization.loads


def row(**changes: Any) -> Claimed:
    base = Claimed(
        seq=1,
        id=str(uuid.UUID(int=1)),
        exchange="orders",
        routing_key="order.created",
        payload=b"{}",
        content_type=JSON_TYPE,
        headers=None,
        key=None,
        priority=0,
        attempts=1,
        max_attempts=None,
        available_at=NOW,
        created_at=NOW,
        traceparent=None,
        tracestate=None,
    )
    return base._replace(**changes)


ENCODINGS: list[tuple[str, str]] = [
    # What enqueue stores for dict/list, str and bytes payloads.
    (JSON_TYPE, "utf-8"),
    (TEXT_TYPE, "utf-8"),
    (BYTES_TYPE, "binary"),
    # A caller's content_type=...: a named charset wins, whatever the media type.
    ('text/plain; charset="ISO-8859-1"', "iso-8859-1"),
    ("application/xml;charset=UTF-16", "utf-16"),
    ("text/html; level=1; Charset=latin-1", "latin-1"),
    ("application/octet-stream; charset=utf-8", "utf-8"),
    # JSON and text without one: UTF-8, which is what enqueue encodes text and JSON as.
    ("Application/JSON", "utf-8"),
    ("application/cloudevents+json", "utf-8"),
    ("text/csv", "utf-8"),
    ("text/plain; charset=", "utf-8"),  # an empty charset names nothing
    # Anything else is bytes, handed over undecoded.
    ("application/x-protobuf", "binary"),
    ("image/png", "binary"),
    ("application/octet-stream; name=a.bin", "binary"),
    ("not a media type", "binary"),
]


@pytest.mark.parametrize(("content_type", "expected"), ENCODINGS, ids=[e[0] for e in ENCODINGS])
def test_content_encoding_follows_the_content_type(content_type: str, expected: str) -> None:
    assert content_encoding(content_type) == expected
    out = to_outgoing(row(content_type=content_type))
    assert decode_properties(out.header).content_encoding == expected


PAYLOADS: list[tuple[str, object, str, str]] = [
    ("json object", {"order": 42, "name": "Zoë"}, JSON_TYPE, "utf-8"),
    ("json list", [1, "ü", None], JSON_TYPE, "utf-8"),
    ("text", "Grüße, 世界", TEXT_TYPE, "utf-8"),
    ("bytes not UTF-8", b"\xff\xfe\x00\x80raw", BYTES_TYPE, "binary"),
    ("bytes that are UTF-8", "é".encode(), BYTES_TYPE, "binary"),
]


@pytest.mark.parametrize(
    ("payload", "content_type", "encoding"),
    [p[1:] for p in PAYLOADS],
    ids=[p[0] for p in PAYLOADS],
)
def test_kombu_decodes_what_enqueue_encoded(
    payload: object, content_type: str, encoding: str
) -> None:
    """The row as enqueue writes it (an old row is the same: nothing new is stored) goes out with
    properties kombu's own decoder turns back into the payload: bytes stay bytes."""
    encoded = encode_payload(payload, None, max_bytes=1 << 20)
    out = to_outgoing(row(payload=encoded.body, content_type=encoded.content_type))
    props = decode_properties(out.header)
    assert (props.content_type, props.content_encoding) == (content_type, encoding)
    assert loads(out.body, props.content_type, props.content_encoding) == payload


def test_without_content_encoding_kombu_cannot_read_bytes() -> None:
    # Why the property is needed: kombu's default for a body it has no serializer for is UTF-8.
    with pytest.raises(DecodeError):
        loads(b"\xff\xfe", BYTES_TYPE, None)


@pytest.mark.parametrize(
    "content_type",
    [BYTES_TYPE, TEXT_TYPE, "text/plain; charset=" + "x" * 200, "a/" + "b" * 253],
)
@pytest.mark.parametrize("headers", [None, {"tenant": "a", "n": 1.5}])
def test_the_measured_frame_counts_the_encoding(
    content_type: str, headers: dict[str, Any] | None
) -> None:
    """The header frame the wire measures (against frame_max) includes content_encoding exactly:
    a row measured at its frame size passes, one byte less is refused."""
    spoilt = row(content_type=content_type, headers=headers, key="k")
    out = to_outgoing(spoilt)
    size = 7 + len(out.header) + 1  # the content header frame, framing included
    assert decode_properties(to_outgoing(spoilt, frame_max=size).header).content_encoding
    with pytest.raises(MalformedRow, match="frame_max"):
        to_outgoing(spoilt, frame_max=size - 1)
