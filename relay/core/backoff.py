"""Jittered exponential backoff as a pure function of the attempt number and a random source.

"Full jitter" (uniform between a floor and the exponential window, as tenacity's
`wait_random_exponential`): unlike `wait_exponential_jitter`, it stays jittered at the cap, so
many relays retrying the same outage do not all come back at the same instant. The window is
tenacity's `wait_exponential` formula, `base * 2 ** (attempt - 1)` held between floor and cap,
written out here so that the randomness is the caller's (tests/unit/test_core_policy.py checks
it against tenacity's own waits).
"""

from __future__ import annotations

import math
import random


def window(attempt: int, *, base: float, cap: float, floor: float) -> float:
    """The upper bound of the delay after `attempt` failed attempts (1-based)."""
    exponent = max(1, attempt) - 1
    # Past the cap already: 2 ** exponent could overflow a float for a large attempt number.
    if base > 0 and cap > 0 and exponent > math.log2(cap) - math.log2(base):
        return max(floor, cap)
    return max(floor, min(base * 2.0**exponent, cap))


def delay(attempt: int, rng: random.Random, *, base: float, cap: float, floor: float) -> float:
    """Seconds to wait before the next attempt, uniform in [floor, window]."""
    return rng.uniform(floor, window(attempt, base=base, cap=cap, floor=floor))
