"""Resource names: the broker's id from its URL, and each scope's part of a row."""

from __future__ import annotations

import pytest

from relay.core.resources import SCOPES, Naming, broker_id


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("amqp://guest:secret@LocalHost:5672/%2F", "localhost:5672/%2F"),  # no credentials
        ("amqp://rabbit", "rabbit:5672/%2F"),  # default port and vhost
        ("amqps://rabbit/", "rabbit:5671/%2F"),
        ("amqp://rabbit:5673/orders", "rabbit:5673/orders"),
        ("amqp://rabbit/team%2Fa", "rabbit:5672/team%2Fa"),  # a vhost with a slash stays one
    ],
)
def test_broker_id(url: str, expected: str) -> None:
    assert broker_id(url) == expected


@pytest.mark.parametrize(
    ("scope", "part", "name"),
    [
        ("broker", "", "b:5672/%2F"),
        ("exchange", "orders", "b:5672/%2F/orders"),
        ("routing_key", "orders/order.paid", "b:5672/%2F/orders/order.paid"),
    ],
)
def test_each_scope_names_a_part_and_reads_it_back(scope: str, part: str, name: str) -> None:
    naming = Naming("b:5672/%2F", scope)
    assert naming.part("orders", "order.paid") == part
    assert naming.name(part) == name
    assert naming.part_of(name) == part
    assert naming.part_of("other:5672/%2F/orders") is None  # another broker's


def test_the_scopes_are_the_ones_naming_knows() -> None:
    assert SCOPES == ("broker", "exchange", "routing_key")
    with pytest.raises(ValueError, match="unknown resource scope"):
        Naming("b:5672/%2F", "queue")
