"""The per-row checks of relay/amqp/wire.py as tables: every stored field a hand-edited row can
spoil is refused as MalformedRow naming it, and what passes encodes within the frame it was
measured against."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

from outbox.encoding import load_stored_json
from relay.amqp.frames import decode_properties
from relay.amqp.wire import DEFAULT_FRAME_MAX, to_outgoing
from relay.ports import Claimed, MalformedRow, Outgoing

NOW = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def row(**changes: Any) -> Claimed:
    base = Claimed(
        seq=1,
        id=str(uuid.UUID(int=1)),
        exchange="orders",
        routing_key="order.created",
        payload=b"{}",
        content_type="application/json",
        headers={"tenant": "a"},
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


def wire_size(out: Outgoing) -> int:
    """The bytes of the message's content header frame, as RabbitMQ counts them."""
    return 7 + len(out.header) + 1


MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("exchange as a BLOB", {"exchange": b"orders"}, "exchange is stored as bytes"),
    ("routing key as bytes", {"routing_key": b"ab"}, "routing_key is stored as bytes"),
    ("routing key as an integer", {"routing_key": 5}, "routing_key is stored as int"),
    ("routing key with NUL", {"routing_key": "order.\x00evil"}, "routing_key contains a NUL"),
    ("routing key of 256 bytes", {"routing_key": "r" * 256}, "routing_key is 256 bytes"),
    ("exchange of 128 two-byte chars", {"exchange": "é" * 128}, "exchange is 256 bytes"),
    ("content type of 200 é", {"content_type": "é" * 200}, "content_type is 400 bytes"),
    ("content type as NULL", {"content_type": None}, "content_type is stored as NoneType"),
    ("lone surrogate", {"routing_key": "a\ud800"}, "routing_key is not valid UTF-8"),
    ("payload as text", {"payload": "abc"}, "payload is stored as str"),
    ("payload as an integer", {"payload": 7}, "payload is stored as int"),
    ("key as bytes", {"key": b"k"}, "key is stored as bytes"),
    ("headers not JSON", {"headers": load_stored_json("not json")}, "headers are not JSON"),
    (
        "headers 5,000 deep",
        {"headers": load_stored_json("[" * 5000 + "]" * 5000)},
        "headers are nested too deep",
    ),
    ("headers a list", {"headers": [1, 2]}, "headers must be a JSON object, found list"),
    ("headers a string", {"headers": "x"}, "headers must be a JSON object, found str"),
    ("header 1e400", {"headers": load_stored_json('{"n":1e400}')}, "header 'n': inf"),
    ("header NaN", {"headers": {"n": float("nan")}}, "header 'n': nan is not a finite"),
    ("header 2**64", {"headers": {"n": 2**64}}, "does not fit in 64 bits"),
    ("header null", {"headers": {"n": None}}, "header 'n' has a NoneType"),
    ("header nested object", {"headers": {"n": {"a": 1}}}, "header 'n' has a dict"),
    ("header nested list", {"headers": {"n": [1]}}, "header 'n' has a list"),
    ("header empty name", {"headers": {"": 1}}, "a name is ''"),
    ("header name of 256 bytes", {"headers": {"h" * 256: 1}}, "over AMQP's limit of 255"),
    ("header value with NUL", {"headers": {"n": "a\x00"}}, "header 'n' contains a NUL"),
    (
        "headers over frame_max",
        {"headers": {"big": "x" * DEFAULT_FRAME_MAX}},
        "headers: the properties encode",
    ),
    ("traceparent not W3C", {"traceparent": "hello"}, "traceparent 'hello' is not"),
    ("traceparent as bytes", {"traceparent": TRACEPARENT.encode()}, "is not a W3C traceparent"),
    (
        "tracestate with a newline",
        {"traceparent": TRACEPARENT, "tracestate": "a=b\nc"},
        "is not a W3C tracestate",
    ),
    ("created before 1970", {"created_at": dt.datetime(1960, 1, 1, tzinfo=dt.UTC)}, "before 1970"),
]


@pytest.mark.parametrize(
    ("changes", "reason"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_a_spoiled_field_is_malformed_and_named(changes: dict[str, Any], reason: str) -> None:
    with pytest.raises(MalformedRow) as caught:
        to_outgoing(row(**changes))
    assert reason in str(caught.value)


def test_nothing_recurses_on_deep_stored_json() -> None:
    # The store's decoder turns what json cannot read into a value; nothing raises RecursionError.
    for text in ("[" * 100_000, "{" * 5000, '{"a":' * 5000 + "1" + "}" * 5000):
        with pytest.raises(MalformedRow):
            to_outgoing(row(headers=load_stored_json(text)))


RESERVED = [
    ("x-outbox-key", {"x-outbox-key": "forged"}, {}, {"tenant": "a"}),
    ("X-Outbox-Anything", {"X-Outbox-Anything": 1}, {}, {"tenant": "a"}),
    ("traceparent", {"traceparent": "forged"}, {}, {"tenant": "a"}),
    ("Tracestate", {"Tracestate": "forged"}, {}, {"tenant": "a"}),
    (
        "stored key header replaced by the row's key",
        {"x-outbox-key": "forged"},
        {"key": "k1"},
        {"tenant": "a", "x-outbox-key": "k1"},
    ),
    (
        "stored traceparent replaced by the row's",
        {"traceparent": "forged", "tracestate": "forged"},
        {"traceparent": TRACEPARENT},
        {"tenant": "a", "traceparent": TRACEPARENT},
    ),
]


@pytest.mark.parametrize(
    ("stored", "changes", "sent"), [c[1:] for c in RESERVED], ids=[c[0] for c in RESERVED]
)
def test_reserved_headers_are_the_relays_own(
    stored: dict[str, Any], changes: dict[str, Any], sent: dict[str, Any]
) -> None:
    out = to_outgoing(row(headers={"tenant": "a", **stored}, **changes))
    assert decode_properties(out.header).headers == sent


def test_the_relays_trace_context_replaces_the_stored_one() -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    out = to_outgoing(
        row(traceparent="not checked: replaced", tracestate=None),
        traceparent=other,
        tracestate="k=v",
    )
    assert decode_properties(out.header).headers == {
        "tenant": "a",
        "traceparent": other,
        "tracestate": "k=v",
    }


VALID_HEADERS: list[dict[str, Any]] = [
    {},
    {"s": "text", "é": "ü" * 300, "b": True, "f": 1.5, "i": 7},
    {"small": -(2**31), "edge": 2**31 - 1, "big": 2**31, "neg": -(2**63), "max": 2**63 - 1},
    {f"h{i}": "v" * 100 for i in range(200)},
]


@pytest.mark.parametrize("headers", VALID_HEADERS, ids=range(len(VALID_HEADERS)))
@pytest.mark.parametrize("key", [None, "k", "ключ" * 60])
@pytest.mark.parametrize("trace", [None, TRACEPARENT])
def test_the_measured_frame_is_the_encoded_frame(
    headers: dict[str, Any], key: str | None, trace: str | None
) -> None:
    """The frame size the check measures is exactly what pika writes: a message measured at
    frame_max passes, one byte less refuses it."""
    spoilt = row(headers=headers, key=key, traceparent=trace, tracestate="a=b" if trace else None)
    out = to_outgoing(spoilt)
    size = wire_size(out)
    assert (
        decode_properties(to_outgoing(spoilt, frame_max=size).header).headers
        == decode_properties(out.header).headers
    )
    with pytest.raises(MalformedRow, match="frame_max"):
        to_outgoing(spoilt, frame_max=size - 1)


def test_a_valid_row_is_sent_as_stored() -> None:
    out = to_outgoing(row(payload=memoryview(b"abc"), key="k"))
    assert (out.exchange, out.routing_key, out.body) == ("orders", "order.created", b"abc")
    props = decode_properties(out.header)
    assert props.content_type == "application/json"
    assert props.message_id == str(uuid.UUID(int=1))
    assert props.timestamp == int(NOW.timestamp())
    assert props.headers == {"tenant": "a", "x-outbox-key": "k"}
