"""A token bucket for per-resource rate limits, as pure functions over the stored state.

The bucket lives in the resource's shared row, so every relay draws from the same tokens and
several relays together keep to the rate. It holds at most `burst` tokens (one second's worth
by default) and refills at `rate` per second.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Bucket:
    tokens: float | None = None  # None: never drawn from, so full
    at: dt.datetime | None = None  # when `tokens` was last computed


def take(
    b: Bucket, now: dt.datetime, *, rate: float, burst: float, want: int
) -> tuple[Bucket, int]:
    """Draw up to `want` whole tokens; return the new bucket and how many were granted."""
    if b.tokens is None or b.at is None:
        available = burst
    else:
        elapsed = max(0.0, (now - b.at).total_seconds())  # clocks may step back
        available = min(burst, b.tokens + elapsed * rate)
    granted = max(0, min(want, int(available)))
    return Bucket(available - granted, now), granted


def refund(b: Bucket, n: int, *, burst: float) -> Bucket:
    """Return tokens drawn but not used (fewer messages were waiting than were granted)."""
    if n <= 0 or b.tokens is None:
        return b
    return Bucket(min(burst, b.tokens + n), b.at)


def wait_for(b: Bucket, *, rate: float, want: int = 1) -> float:
    """Seconds until `want` tokens will have accumulated (0 when they are there now)."""
    have = b.tokens if b.tokens is not None else float(want)
    return max(0.0, (want - have) / rate)
