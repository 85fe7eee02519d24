"""The consumer's log lines: the message itself says what happened to which delivery (Python's
default output drops `extra`), and `extra` still carries the fields for structured formatters.

A `BaseProcessor` runs against a fake channel and a fake database side (`Transactions`): the
port boundary, as pika and the database see it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from outbox.consumer.consumer import ConsumerLoop
from outbox.consumer.policy import ConsumerPolicy
from outbox.consumer.processor import BaseProcessor, Message

QUEUE = "billing.orders"
ID = "0190c0de-0000-7000-8000-000000000001"


class Channel:
    """What a Processor uses of a pika channel (and of its connection): acks, nacks, a
    confirm-mode channel to publish retry and dead-letter copies on, call_later."""

    def __init__(self, *, publish_fails: bool = False) -> None:
        self.is_open = True
        self.acked: list[int] = []
        self.published: list[str] = []
        self.later: list[Callable[[], None]] = []
        self._publish_fails = publish_fails
        self.connection = SimpleNamespace(
            channel=lambda: self, call_later=lambda _delay, fn: self.later.append(fn)
        )

    def basic_ack(self, tag: int) -> None:
        self.acked.append(tag)

    def basic_nack(self, tag: int, requeue: bool) -> None:
        pass

    def confirm_delivery(self) -> None:
        pass

    def queue_declare(self, name: str, **_kw: Any) -> None:
        pass

    def basic_publish(self, _exchange: str, target: str, *_a: Any, **_kw: Any) -> None:
        if self._publish_fails:
            raise ConnectionError("the broker went away")
        self.published.append(target)


class Transactions:
    """The database side: `outcome` is what `run` returns, or raises."""

    def __init__(self, outcome: bool | BaseException) -> None:
        self.outcome = outcome

    def run(self, consumer: str, message: Message) -> bool:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def purge(self, consumer: str, *, cutoff: dt.datetime, batch_size: int) -> Iterator[int]:
        return iter(())


class SerializationFailure(Exception):
    sqlstate = "40001"


def deliver(outcome: bool | BaseException, *, attempt: int = 1, **channel: bool) -> str:
    processor = BaseProcessor(
        Transactions(outcome), consumer="billing", queue=QUEUE, policy=ConsumerPolicy()
    )
    method = SimpleNamespace(
        exchange="orders", routing_key="order.created", delivery_tag=7, redelivered=False
    )
    headers = {"x-outbox-consumer-attempt": attempt}
    properties = SimpleNamespace(
        message_id=ID,
        headers=headers,
        content_type="application/json",
        content_encoding=None,
        timestamp=None,
        correlation_id=None,
        type=None,
    )
    return processor(Channel(**channel), method, properties, b"{}")


@pytest.mark.parametrize(
    ("outcome", "attempt", "channel", "level", "line", "fields"),
    [
        (
            False,
            1,
            {},
            logging.INFO,
            f"consumer.duplicate message_id={ID} queue={QUEUE}",
            {"message_id": ID, "queue": QUEUE},
        ),
        (
            ValueError("boom"),
            1,
            {},
            logging.WARNING,
            f"consumer.retry message_id={ID} queue={QUEUE} attempt=1 in_s=1: ValueError: boom",
            {"message_id": ID, "queue": QUEUE, "attempt": 1, "in_s": 1},
        ),
        (
            ValueError("boom"),
            5,
            {},
            logging.ERROR,
            f"consumer.dead_lettered message_id={ID} queue={QUEUE}: "
            "gave up after 5 attempts: ValueError: boom",
            {"message_id": ID, "queue": QUEUE},
        ),
        (
            OperationalError("SELECT 1", {}, Exception("server closed the connection")),
            1,
            {},
            logging.WARNING,
            f"consumer.database_unavailable message_id={ID} queue={QUEUE}: OperationalError: ",
            {"message_id": ID, "queue": QUEUE},
        ),
        (
            OperationalError("SELECT 1", {}, SerializationFailure("could not serialize")),
            1,
            {},
            logging.WARNING,
            f"consumer.conflict message_id={ID} queue={QUEUE} conflicts=1 in_s=",
            {"message_id": ID, "queue": QUEUE, "conflicts": 1},
        ),
        (
            ValueError("boom"),
            1,
            {"publish_fails": True},
            logging.ERROR,
            f"consumer.forward_failed message_id={ID} queue={QUEUE} target={QUEUE}.retry.1s: "
            "ConnectionError('the broker went away')",
            {"message_id": ID, "queue": QUEUE, "target": f"{QUEUE}.retry.1s"},
        ),
    ],
    ids=["duplicate", "retry", "dead_lettered", "database_unavailable", "conflict", "forward"],
)
def test_each_line_names_its_delivery_in_the_message_and_in_extra(
    caplog: pytest.LogCaptureFixture,
    outcome: bool | BaseException,
    attempt: int,
    channel: dict[str, bool],
    level: int,
    line: str,
    fields: dict[str, object],
) -> None:
    caplog.set_level(logging.INFO, logger="outbox.consumer")
    deliver(outcome, attempt=attempt, **channel)
    (record,) = [r for r in caplog.records if r.name == "outbox.consumer"]
    assert record.levelno == level
    assert record.getMessage().startswith(line)
    event = line.split(" ", 1)[0]
    assert record.msg.startswith(event + " ")  # the event name leads the format, unchanged
    assert {k: getattr(record, k) for k in fields} == fields


class Purging(Transactions):
    def __init__(self, batches: list[int] | Exception) -> None:
        super().__init__(True)
        self.batches = batches

    def purge(self, consumer: str, *, cutoff: dt.datetime, batch_size: int) -> Iterator[int]:
        if isinstance(self.batches, Exception):
            raise self.batches
        return iter(self.batches)


@pytest.mark.parametrize(
    ("batches", "line", "fields"),
    [
        ([1000, 5], "consumer.inbox_purged consumer=billing deleted=1005", {"deleted": 1005}),
        (
            RuntimeError("the database is gone"),
            "consumer.inbox_purge_failed consumer=billing: the database is gone",
            {"error": "the database is gone"},
        ),
    ],
    ids=["purged", "purge_failed"],
)
def test_the_purge_lines_name_their_consumer(
    caplog: pytest.LogCaptureFixture,
    batches: list[int] | Exception,
    line: str,
    fields: dict[str, object],
) -> None:
    caplog.set_level(logging.INFO, logger="outbox.consumer")
    loop = ConsumerLoop(Purging(batches), "amqp://127.0.0.1:1/%2F", QUEUE, name="billing")
    loop._purge()  # what the purge thread runs every retention_interval
    (record,) = [r for r in caplog.records if r.name == "outbox.consumer"]
    assert record.getMessage() == line
    assert {k: getattr(record, k) for k in ("consumer", *fields)} == {
        "consumer": "billing",
        **fields,
    }
