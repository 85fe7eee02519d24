"""Which node the publisher connects to next, and how soon (relay/amqp/nodes.py, Rounds): the
next node at once after a failure; a backoff, longer each time, once a whole round failed."""

from __future__ import annotations

from relay.amqp.nodes import Rounds, broker_nodes


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
    assert 0.5 <= rounds.backoff(failure) <= 1.0  # full jitter up to 0.5 * 2
    rounds.failed()
    assert 0.5 <= rounds.backoff(rounds.failed()) <= 2.0
    for _ in range(5):
        rounds.failed()
        assert rounds.backoff(rounds.failed()) <= 3.0


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
    assert rounds.backoff(failure) >= 0.5
