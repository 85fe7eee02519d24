"""Property-based: every `enqueue` input is either rejected with an OutboxError before anything is
written, or delivered by the real relay through the real broker byte-exact, with its headers."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select

import outbox
from outbox.schema import message
from tests.conftest import Broker, RelayFactory

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
payloads = (
    st.dictionaries(st.text(max_size=8), _json, max_size=5)
    | st.lists(_json, max_size=5)
    | st.text(max_size=200)
    | st.binary(max_size=200)
    # not encodable: rejected
    | st.builds(object)
    | st.sets(st.integers(), max_size=2)
    | st.just({"nan": math.nan})
)
header_values = (
    st.text(max_size=30)
    | st.integers(-(2**70), 2**70)  # beyond 64 bits: rejected
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.none()  # not a header value: rejected
    | st.lists(st.integers(), max_size=2)  # rejected
)
headers = st.none() | st.dictionaries(st.text(min_size=0, max_size=12), header_values, max_size=4)
routing_keys = st.text(max_size=40) | st.text(min_size=250, max_size=300)
delays = st.none() | st.floats(min_value=-5, max_value=0, allow_nan=False)


def expected_body(payload: Any) -> bytes | None:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode("utf-8")
    return None  # JSON: compared as parsed values


@pytest.fixture
def running_relay(pg_url: str, relay_factory: RelayFactory) -> None:
    relay_factory(pg_url)  # one relay for every example


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=payloads, headers=headers, routing_key=routing_keys, delay=delays)
def test_enqueue_rejects_before_writing_or_delivers_exactly(
    pg_engine: Engine,
    broker: Broker,
    running_relay: None,
    payload: Any,
    headers: dict[str, Any] | None,
    routing_key: str,
    delay: float | None,
) -> None:
    key = uuid.uuid4().hex
    with pg_engine.connect() as conn, conn.begin() as tx:
        before = conn.execute(select(func.count()).select_from(message)).scalar_one()
        rejected: outbox.OutboxError | None = None
        try:
            message_id = outbox.enqueue(
                conn,
                exchange=broker.exchange,
                routing_key=routing_key,
                payload=payload,
                headers=headers,
                key=key,
                delay=delay,
            )
        except outbox.OutboxError as exc:
            rejected = exc
        if rejected is not None:
            event(f"rejected: {type(rejected).__name__}")
            assert str(rejected)  # says what is wrong
            after = conn.execute(select(func.count()).select_from(message)).scalar_one()
            assert after == before, "a rejected enqueue wrote a row"
            tx.rollback()
            return
        tx.commit()
    (delivery,) = [
        d for d in broker.collect_ids([message_id], timeout=20) if d.message_id == str(message_id)
    ]
    event("delivered")
    body = expected_body(payload)
    if body is None:
        assert json.loads(delivery.body) == payload
    else:
        assert delivery.body == body
    assert delivery.routing_key == routing_key
    got = dict(delivery.properties.headers or {})
    assert got.pop("x-outbox-key") == key
    assert got == (headers or {})
