"""How often one application process may NOTIFY the relay: a token bucket.

A NOTIFY wakes an idle relay at the commit, so the message is claimed at once instead of at the
relay's next poll. But every notifying commit takes PostgreSQL's cluster-wide notification lock and
holds it through its WAL flush, so notifying commits queue behind one another, and notifying on
every commit would tax a busy application. Rationing by *rate* lets a quiet or steady producer
notify on every message (100 msg/s stays under the rate), while a flood of commits notifies at most
`rate` times a second: a relay that busy is polling every few milliseconds anyway. The burst lets a
short run of commits close together notify each one: a relay woken by the first may have claimed
before the second committed.

Pure: the caller passes the monotonic clock's reading.
"""

from __future__ import annotations

import math
import threading


class NotifyRation:
    """A token bucket: `rate` tokens a second, holding at most `burst`."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._at: float | None = None  # when _tokens was last brought up to date
        # Writers on several threads share one process-wide ration.
        self._lock = threading.Lock()

    def take(self, now: float) -> bool:
        """Whether a commit at `now` may notify (taking a token if so)."""
        if self.rate == math.inf:  # every commit (inf * 0 s would be NaN)
            return True
        with self._lock:
            if self._at is not None:
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False
