"""outbox.dramatiq_message against Dramatiq's own Message (no broker: Dramatiq's StubBroker)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

import outbox
from outbox.encoding import JSON_TYPE, encode_payload
from outbox.errors import InvalidOption


@pytest.fixture(scope="module")
def broker() -> Iterator[StubBroker]:
    stub = StubBroker()
    yield stub
    stub.close()


@pytest.fixture(scope="module")
def actors(broker: StubBroker) -> dict[str, Any]:
    def confirm(order_id: int, notify: bool = False) -> None: ...

    def audit(message: Any, result: Any) -> None: ...

    return {
        "confirm": dramatiq.actor(actor_name="shop.confirm", queue_name="mail", broker=broker)(
            confirm
        ),
        "audit": dramatiq.actor(actor_name="shop.audit", broker=broker)(audit),
    }


def decoded(message: outbox.dramatiq_task.DramatiqMessage) -> dramatiq.Message[Any]:
    """The message as a Dramatiq worker decodes the body the relay publishes."""
    body = encode_payload(message["payload"], message["content_type"], 1 << 20).body
    return dramatiq.Message.decode(body)


def test_the_message_is_the_one_dramatiq_builds(actors: dict[str, Any]) -> None:
    confirm = actors["confirm"]
    ours = outbox.dramatiq_message(confirm, 42, notify=True)
    theirs = confirm.message_with_options(args=(42,), kwargs={"notify": True})
    got = decoded(ours)
    assert got.asdict() == {
        **theirs.asdict(),
        "message_id": got.message_id,
        "message_timestamp": got.message_timestamp,
    }
    assert uuid.UUID(got.message_id)
    assert abs(got.message_timestamp - theirs.message_timestamp) < 60_000
    # RabbitmqBroker.enqueue: the default exchange, routing key the queue's name.
    assert (ours["exchange"], ours["routing_key"], ours["content_type"]) == ("", "mail", JSON_TYPE)


def test_options_and_callbacks_as_dramatiq_sends_them(actors: dict[str, Any]) -> None:
    confirm, audit = actors["confirm"], actors["audit"]
    ours = outbox.dramatiq_message_with_options(
        confirm, args=[7], max_retries=3, time_limit=60_000, on_success=audit, message_id="m-1"
    )
    theirs = confirm.message_with_options(
        args=(7,), max_retries=3, time_limit=60_000, on_success=audit
    )
    got = decoded(ours)
    assert (
        got.options
        == theirs.options
        == {
            "max_retries": 3,
            "time_limit": 60_000,
            "on_success": "shop.audit",
        }
    )
    assert got.message_id == "m-1"


@pytest.mark.parametrize("delay", [1500, dt.timedelta(seconds=1.5)])
def test_a_delay_goes_to_the_delay_queue_with_an_eta(actors: dict[str, Any], delay: Any) -> None:
    ours = outbox.dramatiq_message_with_options(actors["confirm"], args=[1], delay=delay)
    got = decoded(ours)
    assert ours["routing_key"] == got.queue_name == "mail.DQ"
    assert got.options["eta"] == got.message_timestamp + 1500


def test_an_actor_name_on_the_default_queue_or_a_queue_given() -> None:
    assert decoded(outbox.dramatiq_message("shop.confirm")).queue_name == "default"
    named = outbox.dramatiq_message_with_options("shop.confirm", queue_name="mail", args=[1])
    assert (named["routing_key"], decoded(named).actor_name) == ("mail", "shop.confirm")


def test_arguments_are_encoded_as_payloads_are() -> None:
    when = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    got = decoded(outbox.dramatiq_message("a", decimal.Decimal("9.90"), at=when))
    assert (got.args, got.kwargs) == (("9.90",), {"at": "2030-01-02T03:04:05+00:00"})


def test_an_actor_keyword_may_be_called_actor() -> None:
    assert decoded(outbox.dramatiq_message("a", actor="x")).kwargs == {"actor": "x"}


@pytest.mark.parametrize(
    ("actor", "call", "problem"),
    [
        ("", {}, "non-empty actor name"),
        (5, {}, "actor must be a Dramatiq actor .* not int"),
        ("a", {"queue_name": "mail.DQ"}, "queue_name must be a Dramatiq queue name"),
        ("a", {"queue_name": "1bad"}, "queue_name must be a Dramatiq queue name"),
        ("a", {"args": "abc"}, "args must be a list or tuple, not str"),
        ("a", {"kwargs": {1: "a"}}, "kwargs must be a mapping with str keys"),
        ("a", {"delay": -1}, "delay must not be negative"),
        ("a", {"delay": 1.5j}, "delay must be milliseconds"),
        ("a", {"delay": True}, "delay must be milliseconds"),
        ("a", {"message_id": ""}, "message_id must be a non-empty str"),
        ("a", {"broker_priority": 5}, "'broker_priority' cannot be sent through the outbox"),
        ("a", {"eta": 5}, "give delay= instead"),
        ("a", {"on_failure": 5}, "'on_failure' must be an actor or an actor's name"),
    ],
)
def test_bad_arguments_name_the_problem(actor: Any, call: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidOption, match=problem):
        outbox.dramatiq_message_with_options(actor, **call)
