"""Float headers on the wire: outbox.amqp_codec against pika's own encoding, byte for byte."""

from __future__ import annotations

from typing import Any

import pika
import pika.data
import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox import amqp_codec

# What pika itself encodes (and decodes back to the same value): no floats.
scalars = (
    st.text(max_size=20)
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.none()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
headers = st.none() | st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=5)
short = st.none() | st.text(min_size=1, max_size=20)


def wire(properties: Any) -> bytes:
    return b"".join(properties.encode())


@given(headers, short, short, short)
def test_without_floats_the_bytes_are_pikas_own(
    table: dict[str, Any] | None,
    content_type: str | None,
    content_encoding: str | None,
    message_id: str | None,
) -> None:
    fields = {
        "headers": table,
        "content_type": content_type,
        "content_encoding": content_encoding,
        "message_id": message_id,
        "delivery_mode": 2,
        "timestamp": 1_700_000_000,
    }
    assert wire(amqp_codec.Properties(**fields)) == wire(pika.BasicProperties(**fields))


@pytest.fixture
def float_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """pika decoding floats for this test only (monkeypatch restores its decoder afterwards)."""
    monkeypatch.setattr(pika.data, "decode_value", amqp_codec.decode_value)


@pytest.mark.usefixtures("float_decoding")
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=10),
        st.floats(allow_nan=False) | st.lists(st.floats(allow_nan=False), max_size=3),
        min_size=1,
        max_size=5,
    )
)
def test_floats_travel_as_doubles_and_come_back_as_floats(table: dict[str, Any]) -> None:
    table = {**table, "nested": {"ratio": 0.25, "n": 3}, "s": "text"}
    sent = amqp_codec.Properties(content_type="application/json", headers=table, message_id="m")
    received = pika.spec.BasicProperties().decode(wire(sent))
    assert received.headers == table
    assert received.message_id == "m"
    assert received.content_type == "application/json"


def test_pika_alone_cannot_encode_a_float_and_truncates_a_double() -> None:
    # Why the codec exists; if pika ever learns floats, this module can go.
    with pytest.raises(pika.exceptions.UnsupportedAMQPFieldException):
        wire(pika.BasicProperties(headers={"ratio": 0.25}))
    stock = amqp_codec._pika_decode_value
    assert stock(b"d" + b"\x3f\xd0" + bytes(6), 0) == (0, 9)  # 0.25 as a double


def test_install_is_idempotent_and_replaces_only_the_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pika.data, "decode_value", amqp_codec._pika_decode_value)
    encode = pika.data.encode_value
    assert not amqp_codec.float_decoding_installed()
    amqp_codec.install_float_decoding()
    amqp_codec.install_float_decoding()
    assert amqp_codec.float_decoding_installed()
    assert pika.data.decode_value is amqp_codec.decode_value
    assert pika.data.encode_value is encode
