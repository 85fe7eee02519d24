"""Waiting is polling against a deadline, never a bare sleep whose length is a guess."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import pytest

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> T:
    """Poll `condition` until it returns something truthy (returned) or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or condition!r}")
        time.sleep(interval)


class DoesIO(Protocol):
    def wait(self, timeout: float) -> None: ...


def doing_io(publisher: DoesIO, condition: Callable[[], T]) -> Callable[[], T]:
    """`condition`, looked at after each turn of `publisher`'s IO: the publisher has no thread of
    its own (its answers, reconnects and timers run in `wait`), so a test waiting on it does it."""

    def turn() -> T:
        publisher.wait(0.02)
        return condition()

    return turn
