"""A nack on the publisher's thread, without a broker (relay/amqp/nacks.py): the nacked channel is
retired, the message goes again on a fresh channel after a pause, and only a nack there too is
reported REJECTED. A fake connection stands in for pika's at the port boundary."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pika import spec

from relay.amqp.nacks import RESEND_PAUSES, resend_pause
from relay.amqp.publisher import Publisher
from relay.amqp.stall import Action, Silence
from relay.core.circuit import is_resource_failure
from relay.core.failures import classify
from relay.core.outcome import Fate, Outcome
from relay.ports import Outgoing


class FakeChannel:
    def __init__(self, number: int) -> None:
        self.channel_number = number
        self.is_open = True
        self.closed = False
        self.on_confirm: Callable[[Any], None] = lambda _f: None

    def add_on_close_callback(self, _cb: Any) -> None:
        pass

    def add_on_return_callback(self, _cb: Any) -> None:
        pass

    def confirm_delivery(self, on_confirm: Callable[[Any], None], callback: Any) -> None:
        self.on_confirm = on_confirm
        callback(None)  # confirm mode on at once

    def close(self) -> None:
        self.closed = True
        self.is_open = False

    def answer(self, tag: int, *, ack: bool) -> None:
        method = spec.Basic.Ack(tag) if ack else spec.Basic.Nack(tag)
        self.on_confirm(type("Frame", (), {"method": method})())


class FakeConnection:
    """Opens channels at once and records which channel each message went on."""

    is_open = True
    is_closed = False

    def __init__(self) -> None:
        self.channels: list[FakeChannel] = []
        self.sent: list[tuple[int, int]] = []  # (channel number, seq)

    def channel(self, on_open_callback: Callable[[FakeChannel], None]) -> None:
        ch = FakeChannel(len(self.channels) + 1)
        self.channels.append(ch)
        on_open_callback(ch)

    @contextlib.contextmanager
    def coalesced(self) -> Iterator[None]:
        yield

    def send_frames(self, frames: tuple[int, bytes]) -> None:
        number, method = frames
        self.sent.append((number, int(method)))


class FakeLoop:
    """pika's IOLoop as far as the nack path uses it: timers, run by the test."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, cb: Callable[[], None]) -> object:
        self.timers.append((delay, cb))
        return object()

    def run_timers(self) -> list[float]:
        timers, self.timers = self.timers, []
        for _, cb in timers:
            cb()
        return [d for d, _ in timers]


@pytest.fixture
def wired(monkeypatch: pytest.MonkeyPatch) -> tuple[Publisher, FakeConnection, FakeLoop]:
    publisher = Publisher("amqp://guest:guest@127.0.0.1:5681/%2F")
    publisher._ioloop.close()  # pika's own loop (its wake-up sockets): the fake one stands in
    conn, loop = FakeConnection(), FakeLoop()
    publisher._conn = conn
    publisher._ioloop = loop
    # Which message went on which channel: the "frames" are its channel and seq here.
    monkeypatch.setattr("relay.amqp.frames.frame", lambda number, method, *_a: (number, method))
    return publisher, conn, loop


def items(*seqs: int) -> list[Outgoing]:
    return [Outgoing(seq, f"id-{seq}", "orders", "rk", b"", str(seq).encode(), b"") for seq in seqs]


def publish(publisher: Publisher, *seqs: int) -> list[list[Outcome]]:
    answers: list[list[Outcome]] = []
    publisher.publish(items(*seqs), answers.append)
    return answers


def test_a_nack_before_any_confirm_is_sent_again_on_a_fresh_channel_and_confirmed(
    wired: tuple[Publisher, FakeConnection, FakeLoop],
) -> None:
    publisher, conn, loop = wired
    answers = publish(publisher, 1, 2)
    first = conn.channels[0]
    first.answer(1, ack=False)  # a quorum queue electing its leader: the first answers
    first.answer(2, ack=False)
    assert answers == []  # not reported: they go again
    assert first.closed  # nothing left in flight on it: closed
    assert loop.run_timers() == [RESEND_PAUSES[0]] * 2
    assert len(conn.channels) == 2
    assert conn.sent[-2:] == [(2, 1), (2, 2)]  # on the new channel
    conn.channels[1].answer(2, ack=True)  # multiple=False: answer each
    conn.channels[1].answer(1, ack=True)
    assert [(o.seq, o.fate) for o in answers[0]] == [(1, Fate.CONFIRMED), (2, Fate.CONFIRMED)]


def test_a_nack_after_confirms_on_its_channel_is_the_destinations_and_reported_at_once(
    wired: tuple[Publisher, FakeConnection, FakeLoop],
) -> None:
    publisher, conn, loop = wired
    answers = publish(publisher, 1, 2)
    first = conn.channels[0]
    first.answer(1, ack=True)
    first.answer(2, ack=False)  # a full queue (x-overflow reject-publish)
    assert [(o.seq, o.fate) for o in answers[0]] == [(1, Fate.CONFIRMED), (2, Fate.REJECTED)]
    assert loop.timers == []
    assert first.closed  # retired all the same: the next message goes on a new channel
    publish(publisher, 3)
    assert conn.sent[-1] == (2, 3)


def test_nothing_more_is_sent_on_a_nacked_channel_while_it_waits_for_its_answers(
    wired: tuple[Publisher, FakeConnection, FakeLoop],
) -> None:
    publisher, conn, _loop = wired
    publish(publisher, 1, 2)
    first = conn.channels[0]
    first.answer(1, ack=False)
    assert not first.closed  # message 2 is still in flight on it
    publish(publisher, 3)  # e.g. a half-open circuit's probe
    assert conn.sent[-1] == (2, 3)
    first.answer(2, ack=True)
    assert first.closed


def test_a_message_nacked_on_fresh_channels_too_is_the_destinations_refusal(
    wired: tuple[Publisher, FakeConnection, FakeLoop],
) -> None:
    publisher, conn, loop = wired
    answers = publish(publisher, 1)
    pauses = []
    for _ in RESEND_PAUSES:
        conn.channels[-1].answer(1, ack=False)
        pauses += loop.run_timers()
    assert pauses == list(RESEND_PAUSES)
    assert answers == []
    conn.channels[-1].answer(1, ack=False)
    assert len(conn.channels) == len(RESEND_PAUSES) + 1  # each try on a channel of its own
    (outcome,) = answers[0]
    assert outcome.fate is Fate.REJECTED
    assert outcome.detail == "basic.nack from broker"
    # Counted as today: an attempt, and a failure for its circuit.
    failure = classify(outcome)
    assert failure is not None
    assert is_resource_failure(outcome, failure, frozenset())


def test_a_lost_connection_answers_what_waits_to_be_sent_again_as_lost_with_it(
    wired: tuple[Publisher, FakeConnection, FakeLoop],
) -> None:
    publisher, conn, loop = wired
    answers = publish(publisher, 1, 2)
    conn.channels[0].answer(1, ack=False)
    publisher._fail_everything("connection closed")
    assert [(o.seq, o.fate, o.connection_lost) for o in answers[0]] == [
        (1, Fate.UNCONFIRMED, True),
        (2, Fate.UNCONFIRMED, True),
    ]
    failure = classify(answers[0][0])
    assert failure is not None
    assert not is_resource_failure(answers[0][0], failure, frozenset())
    loop.run_timers()  # the resend finds it answered: nothing is sent
    assert len(conn.sent) == 2


@pytest.mark.parametrize(
    ("nacks", "pause"),
    [(0, None), *((n + 1, p) for n, p in enumerate(RESEND_PAUSES)), (len(RESEND_PAUSES) + 1, None)],
)
def test_resend_pauses(nacks: int, pause: float | None) -> None:
    assert resend_pause(nacks) == pause


class Silent(FakeConnection):
    """A node that stops answering: its byte count stands still; dropped like pika drops one."""

    bytes_received = 100
    dropped: str | None = None

    def _terminate_stream(self, error: Exception) -> None:
        self.dropped = str(error)


def test_a_node_silent_while_confirms_are_owed_is_asked_once_then_dropped(
    wired: tuple[Publisher, FakeConnection, FakeLoop],
) -> None:
    publisher, _conn, _loop = wired
    conn = Silent()
    publisher._conn = conn
    t0 = 1000.0
    publisher._check_stalled(t0)  # heard 100 bytes now
    publisher.publish(items(1), lambda _o: None)
    next(iter(publisher._chans.values())).unconfirmed[1][0].sent_at = t0
    publisher._check_stalled(t0 + 2.9)
    assert len(conn.channels) == 1  # owed less than 3 s: nothing
    publisher._check_stalled(t0 + 3.0)
    assert len(conn.channels) == 2  # asked to open a channel
    publisher._check_stalled(t0 + 5.9)
    assert conn.dropped is None
    publisher._check_stalled(t0 + 6.0)  # no answer to that either
    assert conn.dropped is not None
    assert "answered nothing" in conn.dropped


def test_a_node_that_answers_the_channel_is_kept(
    wired: tuple[Publisher, FakeConnection, FakeLoop],
) -> None:
    publisher, _conn, _loop = wired
    conn = Silent()
    publisher._conn = conn
    t0 = 1000.0
    publisher._check_stalled(t0)
    publisher.publish(items(1), lambda _o: None)
    next(iter(publisher._chans.values())).unconfirmed[1][0].sent_at = t0
    publisher._check_stalled(t0 + 3.0)  # asked
    conn.bytes_received += 20  # channel.open-ok: alive, only waiting (a queue's leader elsewhere)
    publisher._check_stalled(t0 + 4.0)
    publisher._check_stalled(t0 + 6.5)
    assert conn.dropped is None
    publisher._check_stalled(t0 + 7.0)  # silent 3 s again: asked again, not dropped
    assert conn.dropped is None
    assert len(conn.channels) == 3


def test_a_blocked_connection_or_nothing_owed_is_never_taken_for_silent() -> None:
    silence = Silence(3.0)
    silence.check(0.0, 10, None, blocked=False)
    assert silence.check(100.0, 10, None, blocked=False) is Action.NONE  # nothing owed
    assert silence.check(100.0, 10, 0.0, blocked=True) is Action.NONE  # a resource alarm
    assert silence.check(100.0, 10, 0.0, blocked=False) is Action.ASK
    assert silence.check(103.0, 10, 0.0, blocked=False) is Action.DROP
