"""Which node the publisher connects to next, and how soon (relay/amqp/nodes.py, Rounds): the
next node at once after a failure; a backoff, longer each time, once a whole round failed."""

from __future__ import annotations

from relay.amqp.nodes import MIN_WAIT, Rounds, broker_nodes
from relay.amqp.publisher import RECONNECT_MAX_DELAY


def test_a_failure_moves_on_to_the_next_node_at_once() -> None:
    rounds = Rounds(broker_nodes("amqp://a:5672,amqp://b:5672,amqp://c:5672"), 15.0)
    assert rounds.current.name == "a:5672"
    failure = rounds.failed()
    assert (failure.node.name, failure.round_over, failure.next_node) == ("a:5672", False, "b:5672")
    assert rounds.backoff(failure) == 0.0
    assert rounds.current.name == "b:5672"


def test_a_round_that_failed_backs_off_longer_each_time_up_to_the_maximum() -> None:
    rounds = Rounds(broker_nodes("amqp://a:5672,amqp://b:5672"), 3.0)
    assert not rounds.failed().round_over
    failure = rounds.failed()
    assert (failure.node.name, failure.round_over, failure.next_node) == ("b:5672", True, "a:5672")
    assert MIN_WAIT <= rounds.backoff(failure) <= 0.1  # full jitter in the first window
    assert rounds.attempt == 1
    rounds.failed()
    assert MIN_WAIT <= rounds.backoff(rounds.failed()) <= 0.2
    for _ in range(8):
        rounds.failed()
        assert MIN_WAIT <= rounds.backoff(rounds.failed()) <= 3.0
    assert rounds.attempt == 10
    rounds.connected()
    assert rounds.attempt == 0


def test_by_default_a_lost_broker_is_tried_again_within_a_second() -> None:
    rounds = Rounds(broker_nodes("amqp://a:5672"), RECONNECT_MAX_DELAY)
    waits = [rounds.backoff(rounds.failed()) for _ in range(200)]
    assert max(waits) <= RECONNECT_MAX_DELAY < 1.0
    assert len({round(w, 3) for w in waits[10:]}) > 100  # still jittered at the cap


def test_a_connection_starts_a_new_round() -> None:
    rounds = Rounds(broker_nodes("amqp://a:5672,amqp://b:5672"), 15.0)
    rounds.failed()
    rounds.connected()  # b answered
    assert rounds.current.name == "b:5672"
    failure = rounds.failed()
    assert not failure.round_over  # a is still to be tried in this round
    assert rounds.backoff(failure) == 0.0


def test_a_single_node_names_no_next_one_and_backs_off_at_each_failure() -> None:
    rounds = Rounds(broker_nodes("amqp://a:5672"), 15.0)
    failure = rounds.failed()
    assert (failure.round_over, failure.next_node) == (True, None)
    assert rounds.backoff(failure) >= MIN_WAIT
