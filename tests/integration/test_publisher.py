"""The publisher on its own, against the real broker."""

from __future__ import annotations

import os
import threading
import uuid

import pika
import pytest

from relay.amqp.coalesce import WRITE_AT
from relay.amqp.publisher import Publisher
from relay.amqp.wire import with_properties
from relay.core.outcome import Fate, Outcome
from relay.errors import BrokerUnavailable
from relay.ports import Outgoing
from tests.support.broker import Broker
from tests.support.waiting import doing_io, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/%2F"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """Exceptions that escaped a thread during the test, recorded instead of printed."""
    errors: list[BaseException] = []

    def record(args: threading.ExceptHookArgs) -> None:
        errors.append(args.exc_value or args.exc_type())

    monkeypatch.setattr(threading, "excepthook", record)
    return errors


def test_a_stopped_publisher_holds_no_file_descriptors(amqp_url: str) -> None:
    before = open_fds()
    publishers = [Publisher(amqp_url) for _ in range(3)]  # kept referenced: no GC closes them
    for publisher in publishers:
        publisher.start()
        assert publisher.ready
        publisher.stop()
        assert not publisher.ready
    assert open_fds() == before


def test_a_publisher_that_failed_to_start_holds_no_file_descriptors(
    thread_errors: list[BaseException],  # no thread may fail meanwhile
) -> None:
    before = open_fds()
    publisher = Publisher(UNREACHABLE)
    with pytest.raises(BrokerUnavailable):
        publisher.start(timeout=10)
    assert open_fds() == before


def test_start_against_an_unreachable_broker_fails_cleanly(
    thread_errors: list[BaseException],
) -> None:
    publisher = Publisher(UNREACHABLE)
    with pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1:1"):
        publisher.start(timeout=10)
    assert not publisher.ready
    assert thread_errors == []


def test_an_unreachable_broker_is_reported_with_its_reason(
    thread_errors: list[BaseException],
) -> None:
    publisher = Publisher(UNREACHABLE)
    with pytest.raises(BrokerUnavailable) as raised:
        publisher.start(timeout=10)
    reason = str(raised.value).rsplit("connection failed:", 1)[-1].strip()
    assert reason, str(raised.value)


def test_publisher_connects_and_stops(amqp_url: str, thread_errors: list[BaseException]) -> None:
    publisher = Publisher(amqp_url)
    publisher.start()
    assert publisher.ready
    publisher.stop()
    assert not publisher.ready
    assert thread_errors == []


def _item(ref: int, exchange: str, routing_key: str = "r") -> Outgoing:
    message_id = str(uuid.uuid4())
    props = pika.BasicProperties(message_id=message_id, delivery_mode=2)
    return with_properties(ref, exchange, routing_key, f"{ref}".encode(), props)


def test_a_chain_sends_nothing_after_a_message_that_was_not_confirmed(
    amqp_url: str, broker: Broker
) -> None:
    """Three batches of one chain: the second batch's third message is unroutable (its routing
    key reaches no queue); nothing after it is sent, in its batch or the next, while a batch
    of another chain goes on. Each batch is answered on its own, in order."""
    bound = broker.declare_exchange()
    queue = broker.declare_queue(bind_to=bound, binding_key="ok")
    publisher = Publisher(amqp_url)
    publisher.start()
    answers: list[list[Outcome]] = []

    def answered(outcomes: list[Outcome]) -> None:
        answers.append(outcomes)

    try:
        first = [_item(n, bound, "ok") for n in range(1, 4)]
        second = [_item(n, bound, "ok") for n in range(4, 6)] + [_item(6, bound, "nowhere")]
        second += [_item(7, bound, "ok")]
        third = [_item(n, bound, "ok") for n in range(8, 10)]
        other = [_item(n, bound, "ok") for n in range(10, 12)]
        for batch in (first, second, third):
            publisher.publish(batch, answered, chain="k")
        publisher.publish(other, answered, chain="other")
        wait_until(doing_io(publisher, lambda: len(answers) == 4), what="four answers")
    finally:
        publisher.stop()
    fates = {o.seq: o for outcomes in answers for o in outcomes}
    assert [fates[n].fate for n in range(1, 6)] == [Fate.CONFIRMED] * 5
    assert fates[6].fate is Fate.UNROUTABLE
    assert all(fates[n].held_back and fates[n].fate is Fate.NOT_SENT for n in (7, 8, 9))
    assert [fates[n].fate for n in (10, 11)] == [Fate.CONFIRMED] * 2
    # Every batch answered once, the chain's in the order handed over.
    by_batch = [sorted(o.seq for o in outcomes) for outcomes in answers]
    assert sorted(by_batch) == [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11]]
    chain = [b for b in by_batch if b[0] < 10]
    assert chain == [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    channel = broker._channel
    arrived = []
    while True:
        method, _props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        arrived.append(int(body))
    assert sorted(arrived) == [1, 2, 3, 4, 5, 10, 11]
    assert [n for n in arrived if n < 10] == [1, 2, 3, 4, 5]  # in order, and nothing after 6


def _answers(
    publisher: Publisher, batches: list[list[Outgoing]], chain: str | None = None
) -> list[Outcome]:
    """Publish `batches` and wait for every answer; the outcomes, in the order answered."""
    outcomes: list[Outcome] = []
    answers = 0

    def answered(answer: list[Outcome]) -> None:
        nonlocal answers
        outcomes.extend(answer)
        answers += 1

    for batch in batches:
        publisher.publish(batch, answered, chain=chain)
    wait_until(doing_io(publisher, lambda: answers == len(batches)), what="every answer")
    return outcomes


def _spy_writes(publisher: Publisher) -> list[bytes]:
    """What the publisher's connection sends from now on, one entry per write (to the socket,
    or to pika's transport for what the socket did not take)."""
    writes: list[bytes] = []
    conn = publisher._conn
    send_now = conn._send_now

    def spied(data: bytes) -> None:
        writes.append(bytes(data))
        send_now(data)

    conn._send_now = spied
    return writes


def test_a_batch_reaches_the_socket_in_one_write_and_arrives_intact(
    amqp_url: str, broker: Broker
) -> None:
    """pika writes every frame apart (method, header, body: three sends per message). The
    publisher hands a batch's frames to the transport as one write (in writes of about WRITE_AT
    bytes when the batch is larger), and a chain's message as one write: the broker receives
    every message whole, in order, bodies split over several frames included."""
    publisher = Publisher(amqp_url)
    publisher.start()
    try:
        _answers(publisher, [[_item(0, broker.exchange)]])  # the channel is open now
        writes = _spy_writes(publisher)
        small = [_item(n, broker.exchange) for n in range(1, 101)]
        outcomes = _answers(publisher, [small])
        small_writes = list(writes)
        large = [_item(n, broker.exchange) for n in range(101, 111)]
        for n in (103, 107):  # over frame_max (131,072): three body frames each
            props = pika.BasicProperties(message_id=large[n - 101].message_id, delivery_mode=2)
            large[n - 101] = with_properties(n, broker.exchange, "r", bytes([n]) * 300_000, props)
        outcomes += _answers(publisher, [large])
        large_writes = writes[len(small_writes) :]
        chain = [_item(n, broker.exchange) for n in range(111, 114)]
        outcomes += _answers(publisher, [chain], chain="k")
        chain_writes = writes[len(small_writes) + len(large_writes) :]
    finally:
        publisher.stop()
    assert [o.fate for o in outcomes] == [Fate.CONFIRMED] * 113
    assert len(small_writes) == 1, [len(w) for w in writes]
    # 600 KB in writes of at least WRITE_AT each but the last, so three at most.
    assert 2 <= len(large_writes) <= 3, [len(w) for w in large_writes]
    assert all(len(w) >= WRITE_AT for w in large_writes[:-1]), [len(w) for w in large_writes]
    assert len(chain_writes) == 3, [len(w) for w in chain_writes]  # one a message
    received = broker.collect(lambda got: len(got) == 114)
    sent = small + large + chain
    assert [d.message_id for d in received[1:]] == [i.message_id for i in sent]
    assert [d.body for d in received[1:]] == [i.body for i in sent]
