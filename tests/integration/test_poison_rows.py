"""Property-based: a row can only hurt itself.

Rows are spoiled by hand, as an operator's UPDATE or another writer could (raw SQL that bypasses
`enqueue`: a payload stored as text, a routing key as a BLOB, headers that are not JSON, nested
5,000 deep, `1e400`, too large for a frame, a content type over AMQP's 255 bytes, ...), in the same
batches as valid rows, under a real relay, store and broker. Whatever the mix: the relay keeps
running on its one connection, every valid row is published exactly once, and every spoiled row
ends `dead` as malformed, with a reason naming its field.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import example as hypothesis_example
from hypothesis import strategies as st
from sqlalchemy import Engine, bindparam, select, text
from sqlalchemy.types import Uuid

import outbox
from outbox.schema import message
from relay.amqp.publisher import Publisher
from tests.support.broker import Broker
from tests.support.db import make_app_engine
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# (column, value written into it, the word the dead row's reason must contain)
Spoil = tuple[str, Any, str]

FRAME_MAX = 131072  # RabbitMQ's default
HEADER_TEXTS: list[str] = [
    "[" * 5000 + "]" * 5000,  # RecursionError for a plain json.loads
    '{"a":' * 5000 + "1" + "}" * 5000,
    '{"n": 1e400}',  # infinity: RabbitMQ closes the connection (541) on some encoders
    '{"n": 123456789012345678901234567890}',  # beyond 64 bits
    '{"n": null}',
    '{"n": {"nested": 1}}',
    '{"n": [1, 2]}',
    '{"": 1}',
    "[1, 2]",
    '"just a string"',
    "42",
    '{"big": "' + "x" * FRAME_MAX + '"}',  # a header frame larger than frame_max
    '{"' + "h" * 300 + '": 1}',  # a header name over 255 bytes
]
# On SQLite any value of any type can be stored in any column.
SQLITE_ONLY: list[Spoil] = [
    ("headers", "not json", "header"),
    ("headers", b"\xff\xfe", "header"),
    ("headers", 5, "header"),
    ("payload", "stored as text", "payload"),
    ("payload", 12345, "payload"),
    ("routing_key", b"order.created", "routing_key"),
    ("routing_key", "order.\x00evil", "routing_key"),
    ("routing_key", "r" * 300, "routing_key"),
    ("exchange", b"blob", "exchange"),
    ("content_type", b"application/json", "content_type"),
    ("content_type", "text/\x00", "content_type"),
    ("key", b"k", "key"),
]


TWO_BAD_KEYS: Spoil = ("key", b"k", "key")


def both(n: int) -> st.SearchStrategy[str]:
    """Text of n two-byte characters: at most 255 characters, as varchar(255) allows, yet over
    AMQP's 255 bytes from n = 128."""
    return st.just("é" * n)


def spoils(database: str) -> st.SearchStrategy[Spoil]:
    anywhere: st.SearchStrategy[Spoil] = st.one_of(
        st.sampled_from(HEADER_TEXTS).map(lambda t: ("headers", t, "header")),
        st.integers(128, 255).flatmap(both).map(lambda t: ("content_type", t, "content_type")),
        st.integers(128, 255).flatmap(both).map(lambda t: ("routing_key", t, "routing_key")),
        st.integers(128, 255).flatmap(both).map(lambda t: ("exchange", t, "exchange")),
    )
    if database == "postgresql":
        return anywhere
    return anywhere | st.sampled_from(SQLITE_ONLY)


# Stored copies of the relay's own headers: the row is valid, and the copies are never sent.
RESERVED_COPIES = (
    '{"tenant": "a", "x-outbox-key": "forged", "traceparent": "forged", "X-Outbox-X": 1}'
)

# A valid row, or one spoiled by its Spoil (with no field named: valid, its headers rewritten).
Row = Spoil | None
RESERVED: Spoil = ("headers", RESERVED_COPIES, "")


def rows_of(database: str) -> st.SearchStrategy[list[Row]]:
    one: st.SearchStrategy[Row] = st.one_of(st.none(), st.just(RESERVED), spoils(database))
    return st.lists(one, min_size=1, max_size=12)


def spoil_statement(database: str, column: str) -> Any:
    # The column is one of a fixed few, never data; the value is bound, as written (no type).
    value = "CAST(:value AS json)" if database == "postgresql" and column == "headers" else ":value"
    sql = f"UPDATE outbox_message SET {column} = {value} WHERE id = :id"
    return text(sql).bindparams(bindparam("id", type_=Uuid()))


@pytest.fixture(params=["postgresql", "sqlite"])
def database(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def engine(database: str, request: pytest.FixtureRequest) -> Iterator[tuple[str, Engine]]:
    url = str(request.getfixturevalue("pg_url" if database == "postgresql" else "sqlite_url"))
    built = make_app_engine(url)
    outbox.create_schema(built)
    yield url, built
    built.dispose()


def test_poison_rows_hurt_only_themselves(
    database: str, engine: tuple[str, Engine], broker: Broker, relay_factory: RelayFactory
) -> None:
    url, app = engine
    # dead_key="skip": one relay serves every example, and hypothesis writes the same spoiled key
    # (a BLOB b'k') again and again; under "hold" the first dead row would rightly hold the later
    # ones behind it, which is ordering, not what this test is about.
    relay = relay_factory(url, claim_max=16, dead_key="skip")
    publisher = relay.publisher
    assert isinstance(publisher, Publisher)
    published: set[uuid.UUID] = set()
    spoiled: set[uuid.UUID] = set()

    @settings(
        max_examples=25,
        deadline=None,
        # No shrinking: a failing example waits out its 20 s per try, and hypothesis takes the
        # timeout's exception for one more failure to shrink, so a failure ran on for minutes.
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(rows=rows_of(database))
    def example(rows: list[Row]) -> None:
        valid: dict[uuid.UUID, dict[str, Any]] = {}
        bad: dict[uuid.UUID, str] = {}
        # One transaction: the relay never sees a spoiled row in its valid state.
        with app.begin() as conn:
            for n, row in enumerate(rows):
                message_id = outbox.enqueue(
                    conn,
                    exchange=broker.exchange,
                    routing_key="poison.test",
                    payload={"n": n},
                    headers={"tenant": "a"},
                )
                if row is not None:
                    column, value, field = row
                    event(f"spoiled: {column}" if field else "stored reserved headers")
                    conn.execute(spoil_statement(database, column), {
                        "id": message_id, "value": value,
                    })  # fmt: skip
                if row is None or not row[2]:
                    valid[message_id] = {"tenant": "a"}
                else:
                    bad[message_id] = row[2]
        ids = [*valid, *bad]
        final = wait_until(lambda: settled(app, ids), timeout=20, what=f"{len(ids)} rows settled")
        assert final is not None
        for message_id, field in bad.items():
            state, error = final[message_id]
            assert state == "dead", (field, state, error)
            assert "malformed" in error, error
            assert field in error, error
        for message_id in valid:
            assert final[message_id][0] == "published", final[message_id]
        deliveries = broker.collect_ids(list(valid), timeout=20)
        by_id = {d.message_id: d for d in deliveries}
        for message_id, headers in valid.items():
            got = by_id[str(message_id)].properties.headers
            assert got == headers  # stored copies of reserved headers were not sent
        published.update(valid)
        spoiled.update(bad)

    if database == "sqlite":
        # Two rows of one key, both malformed the same way, in one claim: a chain whose first
        # two rows cannot be built. The second must not be left in flight for ever.
        example = hypothesis_example(rows=[TWO_BAD_KEYS, TWO_BAD_KEYS])(example)
    example()

    assert publisher.connections == 1, "the broker closed the relay's connection"
    assert publisher.ready
    delivered = collections.Counter(d.message_id for d in broker.finish())
    assert {mid for mid, n in delivered.items() if n > 1} == set(), "delivered more than once"
    assert set(delivered) == {str(m) for m in published}
    assert not spoiled & {uuid.UUID(m) for m in delivered if m}


def settled(app: Engine, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[str, str]] | None:
    """Every row's (state, last_error) once all are published or dead; None before."""
    with app.connect() as conn:
        found = conn.execute(
            select(message.c.id, message.c.state, message.c.last_error).where(message.c.id.in_(ids))
        ).all()
    if len(found) < len(ids) or any(r.state not in ("published", "dead") for r in found):
        return None
    return {r.id: (r.state, r.last_error or "") for r in found}
