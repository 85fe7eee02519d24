"""One broker connection for several databases' loops (relay/amqp/shared.py), on the real broker:
each loop's answers come back on its own thread, in its own wait; one loop's chain of a key never
holds up, or is held up by, another loop's chain of the same key; each loop publishes on channels
of its own."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pika
import pytest

from relay.amqp.publisher import Publisher
from relay.amqp.shared import Broker, Share
from relay.amqp.wire import with_properties
from relay.core.outcome import Fate, Outcome
from relay.ports import Outgoing
from tests.support.broker import Broker as Destination

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _item(ref: int, exchange: str) -> Outgoing:
    props = pika.BasicProperties(message_id=str(uuid.uuid4()), delivery_mode=2)
    return with_properties(ref, exchange, "r", f"{ref}".encode(), props)


def _wait_for(share: Share, answered: list[list[Outcome]], chunks: int) -> None:
    deadline = time.monotonic() + 15
    while len(answered) < chunks and time.monotonic() < deadline:
        share.wait(0.2)
    assert len(answered) == chunks


@pytest.fixture
def shared(amqp_url: str) -> Iterator[Broker]:
    broker = Broker(Publisher(amqp_url, name="test shared broker"))
    broker.start()
    yield broker
    broker.stop()


def test_each_loop_gets_its_answers_on_its_own_thread(shared: Broker, broker: Destination) -> None:
    threads: dict[str, set[str]] = {}
    errors: list[BaseException] = []

    def loop(name: str, first: int) -> None:
        try:
            share = shared.share()
            answered: list[list[Outcome]] = []

            def done(outcomes: list[Outcome]) -> None:
                threads.setdefault(name, set()).add(threading.current_thread().name)
                answered.append(outcomes)

            for chunk in range(5):
                items = [_item(first + chunk * 100 + i, broker.exchange) for i in range(50)]
                share.publish(items, done)
            _wait_for(share, answered, 5)
            assert all(o.fate is Fate.CONFIRMED for chunk in answered for o in chunk)
            share.close()
        except BaseException as exc:
            errors.append(exc)

    workers = [
        threading.Thread(target=loop, args=(f"db-{n}", n * 10_000), name=f"db-{n}")
        for n in range(3)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert errors == []
    assert threads == {f"db-{n}": {f"db-{n}"} for n in range(3)}
    broker.collect(lambda got: len(got) >= 750, what="every loop's messages")


def test_a_key_of_one_loop_is_not_chained_to_the_same_key_of_another(
    shared: Broker, broker: Destination
) -> None:
    """Two databases may both have a key 'order-1': each is its own chain. A chain that broke in
    one (a message not confirmed) holds back that database's rest only."""
    missing = f"t.missing.{uuid.uuid4().hex[:8]}"  # never declared: the broker refuses it
    first, second = shared.share(), shared.share()
    answers: dict[str, list[list[Outcome]]] = {"first": [], "second": []}
    first.publish(
        [_item(1, missing), _item(2, broker.exchange)], answers["first"].append, chain="order-1"
    )
    second.publish(
        [_item(1, broker.exchange), _item(2, broker.exchange)],
        answers["second"].append,
        chain="order-1",
    )
    _wait_for(first, answers["first"], 1)
    _wait_for(second, answers["second"], 1)
    assert [o.fate for o in answers["first"][0]] == [Fate.DESTINATION_MISSING, Fate.NOT_SENT]
    assert answers["first"][0][1].held_back
    assert [o.fate for o in answers["second"][0]] == [Fate.CONFIRMED, Fate.CONFIRMED]
    first.close()
    second.close()


def test_a_wait_ends_on_interrupt_and_on_a_watched_socket(shared: Broker) -> None:
    share = shared.share()
    started = time.monotonic()
    threading.Timer(0.2, share.interrupt).start()
    share.wait(10.0)
    assert time.monotonic() - started < 5.0
    reader, writer = socket.socketpair()
    seen: list[int] = []
    share.watch(reader.fileno(), lambda: seen.append(reader.recv(16)[0]))
    threading.Timer(0.2, lambda: writer.send(b"\x07")).start()
    share.wait(10.0)
    assert seen == [7]
    share.unwatch(reader.fileno())
    share.close()
    reader.close()
    writer.close()


def test_stop_waits_for_what_this_loop_handed_over(shared: Broker, broker: Destination) -> None:
    share = shared.share()
    answered: list[list[Outcome]] = []
    share.publish([_item(i, broker.exchange) for i in range(200)], answered.append)
    share.stop(10.0)
    assert len(answered) == 1
    assert len(answered[0]) == 200
    share.close()
