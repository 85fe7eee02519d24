"""The publisher on its own, against the real broker."""

from __future__ import annotations

import os
import threading

import pytest

from relay.amqp.publisher import Publisher
from relay.errors import BrokerUnavailable

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
    thread_errors: list[BaseException],  # how the IO thread ends is the next test's business
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
