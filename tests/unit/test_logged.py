"""outbox.logged, the bytes logical capture writes into the WAL and the relay reads back: every
field survives the round trip (None apart from empty, any text, any size), the layout is the one
documented (the relay of another release reads it), and bytes that are not a message raise
LoggedError. Also the settings that turn logical capture on. No database."""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import outbox
from outbox import config, logged
from outbox.encoding import INT32_MAX, INT32_MIN
from outbox.logged import Logged, LoggedError
from outbox.prepared import prepare

AT = dt.datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=dt.UTC)
ID = uuid.UUID("01959f2c-1c2d-7e3f-8a4b-5c6d7e8f9a0b")


def params(**overrides: Any) -> dict[str, Any]:
    """A prepared row's bind values (outbox/prepared.py), as pack takes them."""
    given: dict[str, Any] = {
        "id": ID,
        "exchange": "orders",
        "routing_key": "order.created",
        "payload": b'{"id":17}',
        "content_type": "application/json",
        "headers": None,
        "key": None,
        "idempotency_key": None,
        "priority": 0,
        "max_attempts": None,
        "traceparent": None,
        "tracestate": None,
    }
    given.update(overrides)
    return given


def round_trip(
    given: dict[str, Any], *, delay: dt.timedelta | None = None, has_row: bool = False
) -> Logged:
    return logged.unpack(logged.stamped(logged.pack(given, delay=delay, has_row=has_row), AT))


def expected(given: dict[str, Any], **overrides: Any) -> Logged:
    fields: dict[str, Any] = {
        "id": str(given["id"]),
        "has_row": False,
        "exchange": given["exchange"],
        "routing_key": given["routing_key"],
        "payload": given["payload"],
        "content_type": given["content_type"],
        "headers": given["headers"],
        "key": given["key"],
        "priority": given["priority"],
        "max_attempts": given["max_attempts"],
        "delay": None,
        "traceparent": given["traceparent"],
        "tracestate": given["tracestate"],
        "created_at": AT,
    }
    fields.update(overrides)
    return Logged(**fields)


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "empty key, not none": {"key": ""},
    "empty headers, not none": {"headers": {}},
    "headers of every type": {"headers": {"s": "é☃", "i": -(2**63), "f": 0.1, "b": False}},
    "unicode text fields": {
        "exchange": "commandes",
        "routing_key": "commande.créée.☃",
        "key": "clé-🔑",
        "content_type": "text/plain; charset=utf-8",
    },
    "empty exchange": {"exchange": ""},
    "empty payload": {"payload": b""},
    "binary payload": {"payload": bytes(range(256)) * 3},
    "large payload": {"payload": b"x" * (3 << 20)},
    "lowest priority": {"priority": INT32_MIN},
    "highest priority": {"priority": INT32_MAX},
    "max_attempts one": {"max_attempts": 1},
    "max_attempts highest": {"max_attempts": INT32_MAX},
    "trace context": {"traceparent": TRACEPARENT, "tracestate": "vendor=opaque,other=x"},
    "empty tracestate": {"traceparent": TRACEPARENT, "tracestate": ""},
}


@pytest.mark.parametrize("overrides", list(CASES.values()), ids=list(CASES))
def test_every_field_survives_the_round_trip(overrides: dict[str, Any]) -> None:
    given = params(**overrides)
    assert round_trip(given) == expected(given)


@pytest.mark.parametrize(
    "delay",
    [dt.timedelta(microseconds=1), dt.timedelta(seconds=90.5), dt.timedelta(days=3650)],
)
def test_a_delay_and_a_row_survive_the_round_trip(delay: dt.timedelta) -> None:
    given = params()
    got = round_trip(given, delay=delay, has_row=True)
    assert got == expected(given, delay=delay, has_row=True)
    assert got.available_at == AT + delay


def test_without_a_delay_a_message_is_due_when_it_was_made() -> None:
    got = round_trip(params())
    assert (got.delay, got.available_at) == (None, AT)


@pytest.mark.parametrize(
    "created_at",
    [
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
    ],
)
def test_the_creation_time_is_kept_to_the_microsecond(created_at: dt.datetime) -> None:
    data = logged.stamped(logged.pack(params(), delay=None, has_row=False), created_at)
    assert logged.unpack(data).created_at == created_at


texts = st.text(st.characters(blacklist_categories=["Cs"]), max_size=300)
header_values = st.one_of(
    st.text(st.characters(blacklist_categories=["Cs"]), max_size=20),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)


@given(
    exchange=texts,
    routing_key=texts,
    content_type=texts,
    key=st.none() | texts,
    traceparent=st.none() | texts,
    tracestate=st.none() | texts,
    headers=st.none() | st.dictionaries(texts, header_values, max_size=5),
    payload=st.binary(max_size=2000),
    priority=st.integers(INT32_MIN, INT32_MAX),
    max_attempts=st.none() | st.integers(1, INT32_MAX),
    delay_us=st.none() | st.integers(1, 10**15),
    has_row=st.booleans(),
)
def test_any_message_survives_the_round_trip(
    delay_us: int | None, has_row: bool, **fields: Any
) -> None:
    delay = None if delay_us is None else dt.timedelta(microseconds=delay_us)
    given = params(id=uuid.uuid4(), **fields)
    assert round_trip(given, delay=delay, has_row=has_row) == expected(
        given, delay=delay, has_row=has_row
    )


def test_what_prepare_builds_packs_as_it_was_given() -> None:
    prepared = prepare(
        exchange="orders",
        routing_key="order.created",
        payload={"id": 17},
        key="17",
        headers={"tenant": "acme"},
        idempotency_key="once",
        delay=2.5,
        priority=-1,
        max_attempts=4,
        content_type=None,
    )
    got = round_trip(dict(prepared.params), delay=prepared.wait, has_row=True)
    assert uuid.UUID(got.id) == prepared.id
    assert (got.payload, got.headers, got.key) == (b'{"id":17}', {"tenant": "acme"}, "17")
    assert (got.priority, got.max_attempts, got.delay) == (-1, 4, dt.timedelta(seconds=2.5))


def test_the_layout_is_the_documented_one() -> None:
    """Version 1, byte for byte, as the module docstring lays it out: a relay of another
    release reads these bytes."""
    given = params(key="k", headers={"h": 1}, priority=-2, max_attempts=3)
    data = logged.pack(given, delay=dt.timedelta(seconds=1), has_row=True)
    head = struct.pack("!BBiiqHHHHHHII", 1, 1, -2, 3, 1_000_000, 6, 13, 16, 1, 0xFFFF, 0xFFFF, 7, 9)
    fields = b"orders" + b"order.created" + b"application/json" + b"k" + b'{"h":1}'
    assert data == head + str(ID).encode() + fields + b'{"id":17}'
    stamp = logged.stamped(data, AT)[len(data) :]
    assert stamp == struct.pack("!q", int(AT.timestamp()) * 1_000_000 + AT.microsecond)


def test_the_emitted_statement_stamps_the_statements_time() -> None:
    assert logged.EMIT_SQL.startswith(
        f"SELECT FROM pg_logical_emit_message(true, '{logged.PREFIX}', "
    )
    assert "%(message)s::bytea || " + logged.STAMP_SQL in logged.EMIT_SQL
    # The clock a row's created_at takes: the statement's, not the transaction's.
    assert "statement_timestamp()" in logged.STAMP_SQL


# ------------------------------------------------------------------------ what is not a message


def good() -> bytes:
    return logged.stamped(
        logged.pack(params(key="k", headers={"a": 1}), delay=None, has_row=False), AT
    )


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "too short"),
        (b"\x01\x00", "too short"),
        (b"\x02" + good()[1:], "version 2; this relay reads 1"),
        (b"\x00" + good()[1:], "version 0"),
        (good()[:-1], "lengths say otherwise"),
        (good() + b"\x00", "lengths say otherwise"),
        (good()[:80], "lengths say otherwise"),
    ],
    ids=["empty", "two bytes", "newer", "zero", "short by one", "long by one", "cut"],
)
def test_bytes_that_are_not_a_message_raise(data: bytes, says: str) -> None:
    with pytest.raises(LoggedError, match=says):
        logged.unpack(data)


def _with_field(name: str, value: bytes) -> bytes:
    """A message whose field `name` (headers or exchange) holds `value` as it is."""
    given = params(headers={"x": 1}) if name == "headers" else params()
    data = logged.pack(given, delay=None, has_row=False)
    if name == "headers":
        at = data.index(b'{"x":1}')
        data = data[:at] + value + data[at + 7 :]
        head = bytearray(data)
        struct.pack_into("!I", head, 30, len(value))
        data = bytes(head)
    else:
        data = data.replace(b"orders", value, 1)
    return logged.stamped(data, AT)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("exchange", b"\xff\xfe\xfd\xfc\xfb\xfa", "does not decode"),
        ("headers", b"[1,2,3]", "not a JSON object"),
        ("headers", b'{"a":1}xx', "not a JSON object"),
        ("headers", b"{nope!}", "does not decode"),
    ],
)
def test_fields_that_do_not_decode_raise(name: str, value: bytes, says: str) -> None:
    with pytest.raises(LoggedError, match=says):
        logged.unpack(_with_field(name, value))


@pytest.mark.parametrize(
    "overrides",
    [
        {"key": "k" * 0xFFFF},
        {"tracestate": "t" * 70_000},
        {"priority": 2**31},
        {"max_attempts": 2**31},
    ],
    ids=["key of 64 KiB", "tracestate over 64 KiB", "priority over int32", "attempts over int32"],
)
def test_what_the_head_cannot_hold_is_refused_when_packed(overrides: dict[str, Any]) -> None:
    with pytest.raises(LoggedError):
        logged.pack(params(**overrides), delay=None, has_row=False)


def test_a_logged_error_is_a_value_error() -> None:
    assert issubclass(LoggedError, ValueError)


# ------------------------------------------------------------------------ the settings


@pytest.fixture
def restored() -> Any:
    yield
    config.reset()


def test_capture_is_table_unless_configured(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OUTBOX_CAPTURE", raising=False)
    monkeypatch.delenv("OUTBOX_CAPTURE_SLOT", raising=False)
    now = config.reset()
    assert (now.capture, now.capture_slot) == ("table", "outbox_relay")
    now = outbox.configure(capture="logical", capture_slot="my_slot_2")
    assert (now.capture, now.capture_slot) == ("logical", "my_slot_2")
    assert outbox.configure(notify=False).capture == "logical"  # kept when not given


@pytest.mark.parametrize(
    ("env", "capture", "slot"),
    [
        ({"OUTBOX_CAPTURE": "logical"}, "logical", "outbox_relay"),
        ({"OUTBOX_CAPTURE": " table "}, "table", "outbox_relay"),
        ({"OUTBOX_CAPTURE": "", "OUTBOX_CAPTURE_SLOT": ""}, "table", "outbox_relay"),
        ({"OUTBOX_CAPTURE_SLOT": "shop_relay"}, "table", "shop_relay"),
    ],
)
def test_the_environment_sets_capture(
    restored: None,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    capture: str,
    slot: str,
) -> None:
    monkeypatch.delenv("OUTBOX_CAPTURE", raising=False)
    monkeypatch.delenv("OUTBOX_CAPTURE_SLOT", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    now = config.reset()
    assert (now.capture, now.capture_slot) == (capture, slot)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("OUTBOX_CAPTURE", "wal", "OUTBOX_CAPTURE must be one of table, logical, got 'wal'"),
        ("OUTBOX_CAPTURE", "LOGICAL", "OUTBOX_CAPTURE must be one of table, logical"),
        ("OUTBOX_CAPTURE_SLOT", "Outbox", "OUTBOX_CAPTURE_SLOT: a slot name is 1 to 63"),
        ("OUTBOX_CAPTURE_SLOT", "1slot", "OUTBOX_CAPTURE_SLOT: a slot name"),
        ("OUTBOX_CAPTURE_SLOT", "s" * 64, "OUTBOX_CAPTURE_SLOT: a slot name"),
    ],
)
def test_a_bad_environment_names_the_variable(
    restored: None, monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=says):
        config.reset()


@pytest.mark.parametrize(
    ("changes", "error", "says"),
    [
        ({"capture": "wal"}, ValueError, "capture must be one of table, logical, got 'wal'"),
        ({"capture_slot": "has-dash"}, ValueError, "capture_slot: a slot name"),
        ({"capture_slot": ""}, ValueError, "capture_slot: a slot name"),
        ({"capture_slot": 7}, TypeError, "capture_slot must be a string"),
    ],
)
def test_configure_refuses_a_bad_capture_and_keeps_the_old_one(
    restored: None, changes: dict[str, Any], error: type[Exception], says: str
) -> None:
    before = outbox.configure(capture="logical")
    with pytest.raises(error, match=says):
        outbox.configure(**changes)
    assert config.settings() is before


def test_capture_not_set_up_is_an_outbox_error() -> None:
    assert issubclass(outbox.CaptureNotSetUp, outbox.OutboxError)
    assert "CaptureNotSetUp" in outbox.__all__
    assert "outbox-relay capture setup" in str(outbox.CaptureNotSetUp.__doc__)
