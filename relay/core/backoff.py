"""Jittered exponential backoff as a pure function of the attempt number and a random source.

"Full jitter" (uniform between a floor and the exponential window, as tenacity's
`wait_random_exponential`): unlike `wait_exponential_jitter`, it stays jittered at the cap, so
many relays retrying the same outage do not all come back at the same instant. The window itself
is tenacity's `wait_exponential`, called as the pure function it is.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import cast

from tenacity import RetryCallState
from tenacity.wait import wait_exponential


@dataclass(frozen=True, slots=True)
class _Attempt:
    attempt_number: int


def window(attempt: int, *, base: float, cap: float, floor: float) -> float:
    """The upper bound of the delay after `attempt` failed attempts (1-based)."""
    state = cast(RetryCallState, _Attempt(max(1, attempt)))
    return float(wait_exponential(multiplier=base, max=cap, min=floor)(state))


def delay(attempt: int, rng: random.Random, *, base: float, cap: float, floor: float) -> float:
    """Seconds to wait before the next attempt, uniform in [floor, window]."""
    return rng.uniform(floor, window(attempt, base=base, cap=cap, floor=floor))
