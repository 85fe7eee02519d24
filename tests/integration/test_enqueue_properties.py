"""Property-based: every `enqueue` input is either rejected with an OutboxError before anything is
written, or delivered by the real relay through the real broker byte-exact, with its headers;
and the same on PostgreSQL and SQLite (each example is enqueued on both)."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import DBAPIError

import outbox
from outbox.amqp_codec import install_float_decoding
from outbox.config import DEFAULT_MAX_JSON_DEPTH
from outbox.schema import message
from tests.support.broker import Broker
from tests.support.db import make_app_engine
from tests.support.relays import RelayFactory


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


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


# Text without NUL, which the odd cases bring in on purpose.
_chars = st.characters(exclude_characters="\x00")


def mostly(valid: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` six times in seven: an example has five fields, and a single odd one refuses it."""
    return st.integers(0, 6).flatmap(lambda pick: valid if pick else odd)


# Text PostgreSQL or AMQP cannot carry: NUL, lone surrogates; and 2-byte characters near 255.
_odd_text = st.text(st.sampled_from("a.é\x00\ud800"), max_size=8)
payloads = mostly(
    st.dictionaries(st.text(max_size=8), _json, max_size=5)
    | st.lists(_json, max_size=5)
    | st.text(max_size=200)
    | st.binary(max_size=200),
    # not encodable: rejected
    st.builds(object)
    | st.sets(st.integers(), max_size=2)
    | st.just({"nan": math.nan})
    # nested around the depth limit, and far past json's own recursion limit: rejected or sent
    | st.integers(DEFAULT_MAX_JSON_DEPTH - 2, DEFAULT_MAX_JSON_DEPTH + 2).map(nested)
    | st.just(nested(5000)),
)
header_values = mostly(
    st.text(_chars, max_size=30)
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans(),
    st.integers(-(2**70), 2**70)  # beyond 64 bits: rejected
    | st.none()  # not a header value: rejected
    | st.lists(st.integers(), max_size=2)  # rejected
    | st.just(math.inf)  # rejected
    | _odd_text
    | st.integers(16_300, 16_400).map(lambda n: "x" * n),  # around the 16 KiB table limit
)
headers = st.none() | st.dictionaries(
    mostly(st.text(_chars, min_size=1, max_size=12), _odd_text), header_values, max_size=3
)
routing_keys = mostly(
    st.text(_chars, max_size=40),
    st.text(min_size=250, max_size=300) | _odd_text.map("k.".__add__),
)
content_types = mostly(
    st.none() | st.just("application/vnd.test+json"),
    st.integers(120, 135).map(lambda n: "é" * n) | _odd_text,  # 255 bytes is the limit
)
delays = mostly(st.none(), st.floats(min_value=-5, max_value=0, allow_nan=False))


def expected_body(payload: Any) -> bytes | None:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode("utf-8")
    return None  # JSON: compared as parsed values


@pytest.fixture
def engines(
    pg_url: str, sqlite_url: str, relay_factory: RelayFactory
) -> Iterator[dict[str, Engine]]:
    """One migrated engine per database, with a relay running on each for every example."""
    install_float_decoding()  # the collector reads float headers as sent (outbox/amqp_codec.py)
    built = {}
    for name, url in (("postgresql", pg_url), ("sqlite", sqlite_url)):
        engine = make_app_engine(url)
        outbox.create_schema(engine)
        relay_factory(url)
        built[name] = engine
    yield built
    for engine in built.values():
        engine.dispose()


def try_enqueue(engine: Engine, **args: Any) -> uuid.UUID | outbox.OutboxError:
    """Enqueue and commit; or the OutboxError, after checking that nothing was written and that
    the transaction is still usable."""
    with engine.connect() as conn, conn.begin() as tx:
        before = conn.execute(select(func.count()).select_from(message)).scalar_one()
        try:
            message_id = outbox.enqueue(conn, **args)
        except outbox.OutboxError as exc:
            refused = exc
        except DBAPIError as exc:  # pragma: no cover - the failure this test looks for
            pytest.fail(f"enqueue let the database refuse it: {exc}")
        else:
            tx.commit()
            return message_id
        assert str(refused)  # says what is wrong
        # The same transaction still runs statements (PostgreSQL aborts it on any error).
        after = conn.execute(select(func.count()).select_from(message)).scalar_one()
        assert after == before, "a rejected enqueue wrote a row"
        tx.rollback()
        return refused


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(
    payload=payloads,
    headers=headers,
    routing_key=routing_keys,
    delay=delays,
    content_type=content_types,
)
def test_enqueue_rejects_before_writing_or_delivers_exactly(
    engines: dict[str, Engine],
    broker: Broker,
    payload: Any,
    headers: dict[str, Any] | None,
    routing_key: str,
    delay: float | None,
    content_type: str | None,
) -> None:
    key = uuid.uuid4().hex
    args = {
        "exchange": broker.exchange,
        "routing_key": routing_key,
        "payload": payload,
        "headers": headers,
        "key": key,
        "delay": delay,
        "content_type": content_type,
    }
    results = {name: try_enqueue(engine, **args) for name, engine in engines.items()}
    kinds = {name: type(r).__name__ for name, r in results.items()}
    # Identically on every database: refused by both with the same error, or accepted by both.
    assert len(set(kinds.values())) == 1, kinds
    refused = results["postgresql"]
    if isinstance(refused, outbox.OutboxError):
        event(f"rejected: {type(refused).__name__}")
        return
    ids = [r for r in results.values() if isinstance(r, uuid.UUID)]
    deliveries = {d.message_id: d for d in broker.collect_ids(ids, timeout=20)}
    event("delivered")
    for message_id in ids:
        delivery = deliveries[str(message_id)]
        body = expected_body(payload)
        if body is None:
            assert json.loads(delivery.body) == payload
        else:
            assert delivery.body == body
        assert delivery.routing_key == routing_key
        if content_type is not None:
            assert delivery.properties.content_type == content_type
        got = dict(delivery.properties.headers or {})
        assert got.pop("x-outbox-key") == key
        assert got == (headers or {})
