"""The values a JSON payload may hold beyond JSON's own (outbox/jsonvalues.py) and
`outbox.configure(json_default=...)`: pure, no database."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import ipaddress
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

import outbox
from outbox import config
from outbox.encoding import JSON_TYPE, encode_payload
from outbox.errors import PayloadEncodingError, PayloadTooDeep
from outbox.prepared import prepare
from tests.docs_blocks import block
from tests.unit.test_outbox_imports import run_fresh

UTC = dt.UTC
PLUS_2 = dt.timezone(dt.timedelta(hours=2))
MINUS_0330 = dt.timezone(-dt.timedelta(hours=3, minutes=30))


class Colour(enum.Enum):
    RED = "red"
    CODE = 7


class Size(enum.IntEnum):
    L = 3


class Flag(enum.StrEnum):
    ON = "on"


@dataclasses.dataclass
class Line:
    sku: str
    price: decimal.Decimal
    colour: Colour = Colour.RED


@dataclasses.dataclass(frozen=True)
class Order:
    id: uuid.UUID
    lines: list[Line]
    placed_at: dt.datetime


class Customer(pydantic.BaseModel):
    id: uuid.UUID
    joined: dt.datetime
    balance: decimal.Decimal


class Point:
    """A class outbox knows nothing of."""

    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y


ID = uuid.UUID("0190a5d4-8f3e-7c41-9d2b-5e6f7a8b9c0d")


def written_body(payload: object) -> object:
    """The payload column enqueue and enqueue_async write, with the settings in force."""
    return prepare(
        exchange="e", routing_key="k", payload=payload, key=None, headers=None,
        idempotency_key=None, delay=None, priority=0, max_attempts=None, content_type=None,
    ).params["payload"]  # fmt: skip


def body(payload: object, **kwargs: Any) -> str:
    return encode_payload(payload, None, 1 << 20, **kwargs).body.decode()


@pytest.mark.parametrize(
    ("value", "json_text"),
    [
        (
            dt.datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
            '"2030-01-02T03:04:05.123456+00:00"',
        ),
        (dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=PLUS_2), '"2030-01-02T03:04:05+02:00"'),
        (
            dt.datetime(2030, 1, 2, 3, 4, 5, 1000, tzinfo=MINUS_0330),
            '"2030-01-02T03:04:05.001000-03:30"',
        ),
        (dt.datetime(2030, 1, 2, 3, 4, 5), '"2030-01-02T03:04:05"'),  # naive: no offset added
        (dt.date(2030, 1, 2), '"2030-01-02"'),
        (dt.time(3, 4, 5, 6), '"03:04:05.000006"'),
        (dt.time(3, 4, tzinfo=UTC), '"03:04:00+00:00"'),
        (ID, '"0190a5d4-8f3e-7c41-9d2b-5e6f7a8b9c0d"'),
        (decimal.Decimal("19.90"), '"19.90"'),  # trailing zeros kept: a string, never a float
        (decimal.Decimal("0.1"), '"0.1"'),
        (decimal.Decimal("-1E+3"), '"-1E+3"'),
        (Colour.RED, '"red"'),
        (Colour.CODE, "7"),
        (Size.L, "3"),
        (Flag.ON, '"on"'),
        (Line("A-1", decimal.Decimal("2.50")), '{"sku":"A-1","price":"2.50","colour":"red"}'),
        (
            Customer(
                id=ID, joined=dt.datetime(2030, 1, 2, tzinfo=UTC), balance=decimal.Decimal("1.5")
            ),
            # pydantic's own JSON forms (model_dump(mode="json")): as FastAPI would return it
            '{"id":"0190a5d4-8f3e-7c41-9d2b-5e6f7a8b9c0d","joined":"2030-01-02T00:00:00Z",'
            '"balance":"1.5"}',
        ),
    ],
)
def test_each_value_encodes_as_documented(value: object, json_text: str) -> None:
    assert body({"v": value}) == '{"v":' + json_text + "}"


def test_dataclasses_convert_recursively_and_may_be_the_payload() -> None:
    order = Order(ID, [Line("A-1", decimal.Decimal("2.50"))], dt.datetime(2030, 1, 2, tzinfo=UTC))
    encoded = encode_payload(order, None, 1 << 20)
    assert encoded.content_type == JSON_TYPE
    assert json.loads(encoded.body) == {
        "id": str(ID),
        "lines": [{"sku": "A-1", "price": "2.50", "colour": "red"}],
        "placed_at": "2030-01-02T00:00:00+00:00",
    }
    model = Customer(id=ID, joined=dt.datetime(2030, 1, 2, tzinfo=UTC), balance=decimal.Decimal(1))
    assert json.loads(body(model)) == {
        "id": str(ID),
        "joined": "2030-01-02T00:00:00Z",
        "balance": "1",
    }


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        ({"a": 1, "é": "ü"}, '{"a":1,"é":"ü"}'),
        ([1, 2.5, None, True, (1, 2)], "[1,2.5,null,true,[1,2]]"),
        (
            {1: "int keys", None: "as json.dumps makes them"},
            '{"1":"int keys","null":"as json.dumps makes them"}',
        ),
    ],
)
def test_plain_json_is_encoded_exactly_as_before(payload: object, text: str) -> None:
    assert body(payload) == text == json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


@given(st.datetimes(timezones=st.none() | st.timezones()))
def test_datetimes_read_back_exactly(value: dt.datetime) -> None:
    (text,) = json.loads(body([value]))
    parsed = dt.datetime.fromisoformat(text)
    # The wall time and the offset: `==` across zones is False for a time a DST change skips.
    assert parsed.replace(tzinfo=None) == value.replace(tzinfo=None)
    assert parsed.utcoffset() == value.utcoffset()


@given(st.decimals(allow_nan=False, allow_infinity=False), st.uuids())
def test_decimals_and_uuids_read_back_exactly(number: decimal.Decimal, value: uuid.UUID) -> None:
    text, uid = json.loads(body([number, value]))
    assert decimal.Decimal(text).as_tuple() == number.as_tuple()  # digits and exponent
    assert uuid.UUID(uid) == value


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (
            {"lines": [1, {"at": Point(1, 2)}]},
            r"payload\['lines'\]\[1\]\['at'\]: Point is not JSON-encodable",
        ),
        ([{1, 2}], r"payload\[0\]: set is not JSON-encodable \(outbox encodes datetime"),
        ({"ids": {ID: 1}}, r"payload\['ids'\]: the key UUID\(.*\) is a UUID"),
        ({"a": float("nan")}, r"payload\['a'\]: nan is not a JSON number"),
        (
            Order(ID, [Line("x", decimal.Decimal(1), Point(0, 0))], dt.datetime(2030, 1, 1)),  # type: ignore[arg-type]
            r"payload\['lines'\]\[0\]\['colour'\]: Point",
        ),
        (
            dt.datetime(2030, 1, 1),
            "payload must be dict, list, a dataclass, a pydantic model, str or bytes, not datetime",
        ),
    ],
)
def test_what_does_not_encode_is_named_with_its_path(payload: object, words: str) -> None:
    with pytest.raises(PayloadEncodingError, match=words):
        body(payload)


def test_a_circular_payload_is_named() -> None:
    loop: dict[str, object] = {}
    loop["self"] = [loop]
    with pytest.raises(
        PayloadEncodingError, match=r"payload\['self'\]\[0\]: refers back to itself"
    ):
        body(loop)


def test_converted_values_count_towards_the_depth_limit() -> None:
    @dataclasses.dataclass
    class Node:
        child: object

    deep: object = None
    for _ in range(10):
        deep = Node(deep)
    with pytest.raises(PayloadTooDeep, match="more than 5 levels"):
        encode_payload({"tree": deep}, None, 1 << 20, max_depth=5)


@pytest.fixture
def settings_restored() -> Iterator[None]:
    yield
    config.reset()


def point_default(value: object) -> object:
    if isinstance(value, Point):
        return {"x": value.x, "y": value.y}
    if isinstance(value, frozenset):
        return sorted(value)
    raise TypeError(f"no JSON form for {type(value).__name__} here")


@pytest.mark.usefixtures("settings_restored")
def test_json_default_adds_types_and_outbox_still_converts_first() -> None:
    outbox.configure(json_default=point_default)
    payload = {"p": Point(1, 2), "tags": frozenset({"b", "a"}), "at": dt.date(2030, 1, 2)}
    written = written_body(payload)
    assert written == b'{"p":{"x":1,"y":2},"tags":["a","b"],"at":"2030-01-02"}'
    config.reset()
    with pytest.raises(PayloadEncodingError, match=r"payload\['p'\]: Point is not"):
        body(payload, json_default=config.settings().json_default)


@pytest.mark.usefixtures("settings_restored")
def test_json_default_may_return_what_outbox_converts() -> None:
    outbox.configure(json_default=lambda value: {"id": ID, "at": dt.date(2030, 1, 1)})
    assert body([Point(0, 0)], json_default=config.settings().json_default) == (
        f'[{{"id":"{ID}","at":"2030-01-01"}}]'
    )


@pytest.mark.parametrize(
    ("default", "words"),
    [
        (
            point_default,
            r"payload\['x'\]\[0\]: complex is not JSON-encodable: json_default raised "
            "TypeError: no JSON form for complex here",
        ),
        (lambda value: value, r"payload\['x'\]\[0\]: refers back to itself"),
        (lambda value: 1 / 0, "json_default raised ZeroDivisionError"),
    ],
)
def test_what_json_default_refuses_is_named_with_its_path(
    default: Callable[[object], object], words: str
) -> None:
    with pytest.raises(PayloadEncodingError, match=words):
        body({"x": [1j]}, json_default=default)


@pytest.mark.usefixtures("settings_restored")
def test_configure_checks_json_default_and_reset_removes_it() -> None:
    with pytest.raises(TypeError, match="json_default must be a function of one value, not int"):
        outbox.configure(json_default=5)  # type: ignore[arg-type]
    assert outbox.configure(json_default=point_default).json_default is point_default
    assert outbox.configure(max_json_depth=10).json_default is point_default  # kept
    assert config.reset().json_default is None
    assert config.settings().max_json_depth == config.DEFAULT_MAX_JSON_DEPTH


def test_pydantic_is_never_imported_to_encode() -> None:
    loaded = run_fresh(
        """
        import dataclasses, datetime, json, sys
        from outbox.encoding import encode_payload
        @dataclasses.dataclass
        class D:
            at: datetime.date
        encode_payload({"d": D(datetime.date(2030, 1, 1))}, None, 1000)
        encode_payload(D(datetime.date(2030, 1, 1)), None, 1000)
        print(json.dumps("pydantic" in sys.modules))
        """
    )
    assert loaded is False


@pytest.mark.usefixtures("settings_restored")
def test_the_docs_json_default_example() -> None:
    code = block("guides/payloads.md", "json-default-example")
    exec(compile(code, "docs/guides/payloads.md (json-default-example)", "exec"), {})
    payload = {
        "tags": {"b", "a"},
        "ttl": dt.timedelta(minutes=1, microseconds=500_000),
        "peer": ipaddress.ip_address("192.0.2.1"),
        "at": dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
    }
    written = written_body(payload)
    assert written == (
        b'{"tags":["a","b"],"ttl":60.5,"peer":"192.0.2.1","at":"2030-01-02T03:04:05+00:00"}'
    )
    with pytest.raises(
        PayloadEncodingError,
        match=r"payload\['p'\]: Point is not JSON-encodable: json_default raised TypeError: "
        "Point has no JSON form in this application",
    ):
        written_body({"p": Point(0, 0)})
