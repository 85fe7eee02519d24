"""Validation and encoding of enqueue arguments: pure, no database."""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import outbox
from outbox import encoding


@pytest.mark.parametrize(
    ("payload", "body", "content_type"),
    [
        ({"a": 1, "é": "ü"}, '{"a":1,"é":"ü"}'.encode(), encoding.JSON_TYPE),
        ([1, 2.5, None, True], b"[1,2.5,null,true]", encoding.JSON_TYPE),
        ("héllo", "héllo".encode(), encoding.TEXT_TYPE),
        (b"\x00\xff", b"\x00\xff", encoding.BYTES_TYPE),
        (bytearray(b"ab"), b"ab", encoding.BYTES_TYPE),
        (memoryview(b"cd"), b"cd", encoding.BYTES_TYPE),
    ],
)
def test_payload_types_encode_with_their_content_type(
    payload: object, body: bytes, content_type: str
) -> None:
    encoded = encoding.encode_payload(payload, None, 1000)
    assert encoded.body == body
    assert encoded.content_type == content_type


def test_content_type_override_wins() -> None:
    assert encoding.encode_payload({"a": 1}, "application/vnd.x+json", 100).content_type == (
        "application/vnd.x+json"
    )


@pytest.mark.parametrize(
    ("payload", "error", "words"),
    [
        ({"a": {1, 2}}, outbox.PayloadEncodingError, "JSON"),
        ({"a": math.nan}, outbox.PayloadEncodingError, "JSON"),
        ([object()], outbox.PayloadEncodingError, "JSON"),
        ("\ud800", outbox.PayloadEncodingError, "UTF-8"),
        (42, outbox.PayloadEncodingError, "not int"),
        (None, outbox.PayloadEncodingError, "not NoneType"),
        ("x" * 11, outbox.PayloadTooLarge, "11 bytes"),
    ],
)
def test_bad_payloads_are_rejected_with_a_clear_message(
    payload: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        encoding.encode_payload(payload, None, 10)


def test_every_error_is_an_outbox_error() -> None:
    with pytest.raises(outbox.OutboxError):
        encoding.encode_payload(3.5, None, 10)


@pytest.mark.parametrize(
    ("exchange", "routing_key", "ok"),
    [
        ("orders", "", True),  # fanout-style: empty routing key on a named exchange
        ("", "queue-name", True),  # default exchange routes by queue name
        ("", "", False),
        ("x" * 256, "k", False),
        ("e", "k" * 256, False),
        (None, "k", False),
        ("e", 5, False),
    ],
)
def test_destination_rules(exchange: object, routing_key: object, ok: bool) -> None:
    if ok:
        encoding.check_destination(exchange, routing_key)
    else:
        with pytest.raises(outbox.InvalidDestination):
            encoding.check_destination(exchange, routing_key)


@pytest.mark.parametrize(
    "headers",
    [
        {"a": None},
        {"a": [1]},
        {"a": b"x"},
        {"a": {"b": 1}},
        {"a": math.inf},
        {"a": 2**63},
        {"": "x"},
        {1: "x"},
        {"traceparent": "x"},
        {"x-outbox-key": "k"},
        {"X-Outbox-Anything": "k"},
    ],
)
def test_bad_headers_are_rejected(headers: dict[object, object]) -> None:
    with pytest.raises(outbox.InvalidHeader):
        encoding.check_headers(headers)  # type: ignore[arg-type]


def test_good_headers_keep_their_types() -> None:
    headers = {"s": "x", "i": -(2**63), "f": 1.5, "b": True}
    assert encoding.check_headers(headers) == headers
    assert encoding.check_headers({}) is None
    assert encoding.check_headers(None) is None


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        (None, None),
        (0, None),
        (1.5, dt.timedelta(seconds=1.5)),
        (dt.timedelta(days=3), dt.timedelta(days=3)),
    ],
)
def test_delays(delay: object, expected: dt.timedelta | None) -> None:
    assert encoding.check_delay(delay) == expected


@pytest.mark.parametrize(
    "delay", [-1, -0.001, dt.timedelta(seconds=-1), math.nan, math.inf, True, "5", 10**12]
)
def test_bad_delays_are_rejected(delay: object) -> None:
    with pytest.raises(outbox.InvalidOption):
        encoding.check_delay(delay)


@pytest.mark.parametrize("value", [True, 1.0, "1", 2**31])
def test_int_options_must_be_int32(value: object) -> None:
    with pytest.raises(outbox.InvalidOption):
        encoding.check_int_option("priority", value, encoding.INT32_MIN)


def test_max_attempts_must_be_positive() -> None:
    with pytest.raises(outbox.InvalidOption, match="between 1"):
        encoding.check_int_option("max_attempts", 0, 1)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), lambda c: st.lists(c)))
def test_json_payloads_round_trip(value: object) -> None:
    payload = [value]
    encoded = encoding.encode_payload(payload, None, 10**9)
    assert json.loads(encoded.body) == payload


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (
            lambda: encoding.check_destination("orders\x00", "k"),
            outbox.InvalidDestination,
            "exchange",
        ),
        (
            lambda: encoding.check_destination("orders", "a.\x00b"),
            outbox.InvalidDestination,
            "routing_key",
        ),
        (lambda: encoding.check_headers({"n\x00": 1}), outbox.InvalidHeader, "header name"),
        (lambda: encoding.check_headers({"n": "v\x00"}), outbox.InvalidHeader, "header 'n'"),
        (lambda: encoding.check_text_option("key", "k\x00"), outbox.InvalidOption, "key"),
        (
            lambda: encoding.encode_payload({}, "text/\x00", 10),
            outbox.InvalidOption,
            "content_type",
        ),
    ],
)
def test_nul_characters_are_refused_in_every_text_field(
    call: object, error: type[Exception], field: str
) -> None:
    # PostgreSQL cannot store U+0000 in text or jsonb; SQLite could, so both refuse it up front.
    with pytest.raises(error, match=rf"{field}.*NUL"):
        call()  # type: ignore[operator]
