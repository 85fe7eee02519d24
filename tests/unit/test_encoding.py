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
from outbox.amqp_codec import encode_table
from outbox.config import LibrarySettings, configure, settings
from outbox.errors import HeadersTooLarge, PayloadTooDeep


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
    encoded = encoding.encode_payload(payload, None, 10**9, max_depth=10**6)
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


def nested(depth: int) -> list[object]:
    """A list `depth` levels deep."""
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "limit", "refused"),
    [
        (nested(64), 64, False),
        (nested(65), 64, True),
        (nested(5000), 64, True),  # past json.dumps' own recursion limit: no RecursionError
        (nested(5000), 10_000, True),  # a limit past what json can encode is still an error
        ({"a": {"b": {"c": [1]}}}, 4, False),
        ({"a": {"b": {"c": [1]}}}, 3, True),
        ({"brackets": "[[[[[[[[{{{{{{{{"}, 2, False),  # inside strings they are no depth
        ([[]] * 1000, 2, False),  # wide, not deep
    ],
)
def test_json_deeper_than_the_limit_is_refused(payload: object, limit: int, refused: bool) -> None:
    if not refused:
        encoding.encode_payload(payload, None, 10**9, max_depth=limit)
        return
    with pytest.raises(PayloadTooDeep, match=r"payload is nested (more than|too deep)"):
        encoding.encode_payload(payload, None, 10**9, max_depth=limit)


def test_a_content_type_over_255_bytes_is_refused() -> None:
    with pytest.raises(outbox.InvalidOption, match="content_type is 400 bytes"):
        encoding.encode_payload({}, "é" * 200, 100)


HEADER_TABLES: list[dict[str, encoding.HeaderValue]] = [
    {},
    {"a": "b", "é": "ü" * 10, "t": True, "f": False, "x": 1.5},
    {"i32": 2**31 - 1, "n32": -(2**31), "i64": 2**31, "n64": -(2**31) - 1, "m": 2**63 - 1},
    {f"h{i}": "v" * i for i in range(100)},
]


@pytest.mark.parametrize("headers", HEADER_TABLES, ids=range(len(HEADER_TABLES)))
def test_header_table_size_is_the_encoded_size(headers: dict[str, encoding.HeaderValue]) -> None:
    pieces: list[bytes] = []
    encode_table(pieces, dict(headers))
    assert encoding.header_table_size(headers) == sum(len(p) for p in pieces)


@pytest.mark.parametrize(
    ("headers", "key", "trace", "limit", "refused"),
    [
        ({"a": "x" * 100}, None, None, 4 + 2 + 105, False),
        ({"a": "x" * 100}, None, None, 4 + 2 + 104, True),
        # the relay's own headers count too: x-outbox-key (13 + 5 + 1) and traceparent (12 + 5 + 55)
        ({"a": "x"}, "k", None, 4 + 2 + 6 + 13 + 6, False),
        ({"a": "x"}, "k", None, 4 + 2 + 6 + 13 + 5, True),
        ({"a": "x"}, None, "0" * 55, 4 + 2 + 6 + 12 + 60, False),
        ({"a": "x"}, None, "0" * 55, 4 + 2 + 6 + 12 + 59, True),
        (None, "k" * 255, "0" * 55, 1, False),  # no caller headers: the relay's alone are small
    ],
)
def test_headers_over_the_size_limit_are_refused(
    headers: dict[str, encoding.HeaderValue] | None,
    key: str | None,
    trace: str | None,
    limit: int,
    refused: bool,
) -> None:
    def check() -> None:
        encoding.check_header_size(
            headers, key=key, traceparent=trace, tracestate=None, limit=limit
        )

    if refused:
        with pytest.raises(HeadersTooLarge, match=r"headers encode to \d+ bytes"):
            check()
    else:
        check()


@pytest.mark.parametrize(
    ("text", "decoded"),
    [
        ('{"a": 1}', {"a": 1}),
        (b'{"a": "\xc3\xa9"}', {"a": "é"}),
        ("[1]", [1]),
        ('{"n": 1e400}', {"n": math.inf}),  # decodes; the relay's check refuses it
    ],
)
def test_stored_json_decodes(text: str | bytes, decoded: object) -> None:
    assert encoding.load_stored_json(text) == decoded


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "not JSON"),
        (b"\xff", "not JSON"),
        ("[" * 5000 + "]" * 5000, "nested too deep"),
        (5, "not JSON"),  # SQLite: an integer in the headers column
    ],
)
def test_unreadable_stored_json_is_a_value_not_an_exception(text: object, reason: str) -> None:
    value = encoding.load_stored_json(text)  # type: ignore[arg-type]
    assert isinstance(value, encoding.UnreadableJson)
    assert reason in value.reason


def test_limits_are_configurable_and_checked() -> None:
    before = settings()
    try:
        now = configure(max_json_depth=3, max_header_bytes=100)
        assert (now.max_json_depth, now.max_header_bytes) == (3, 100)
        for bad in (0, -1):
            with pytest.raises(ValueError, match="must be positive"):
                configure(max_header_bytes=bad)
        with pytest.raises(TypeError, match="max_json_depth must be an integer"):
            configure(max_json_depth=True)
    finally:
        configure(max_json_depth=before.max_json_depth, max_header_bytes=before.max_header_bytes)
    assert LibrarySettings().max_json_depth == 64
    assert LibrarySettings().max_header_bytes == 16 * 1024
