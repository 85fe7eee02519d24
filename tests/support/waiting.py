"""Waiting is polling against a deadline, never a bare sleep whose length is a guess."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
