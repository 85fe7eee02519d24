"""Limits on guessing the console's token: failed attempts per client, rate limited (a 429 once a
client has used up its allowance), and the token's own strength, estimated at start."""

from __future__ import annotations

import math
import string
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

MIN_BITS = 128  # a token estimated weaker than this is refused at start
FAILURES = 10  # failed attempts a client may make at once ...
REFILL = 6.0  # ... and one more every so many seconds (ten a minute)
CLIENTS = 10_000  # clients remembered at most: memory stays bounded whoever tries
_HEX = set(string.hexdigits.lower())
_BASE64 = set(string.ascii_letters + string.digits + "-_+/=")


def token_bits(token: str) -> float:
    """A conservative estimate of a token's entropy: its length times the bits of the smallest
    usual alphabet that holds it (hex, base64, printable ASCII, or more), and none at all for a
    token of repeated characters (fewer distinct ones than a quarter of what a random token of
    that length would show)."""
    chars = set(token)
    if chars <= _HEX:
        alphabet = 16
    elif chars <= _BASE64:
        alphabet = 64
    elif all(" " <= c <= "~" for c in chars):
        alphabet = 95
    else:
        alphabet = 1024  # beyond ASCII: generous, the length check still holds
    if len(chars) < min(alphabet, len(token)) / 4:
        return 0.0
    return len(token) * math.log2(alphabet)


class Throttle:
    """Each client's allowance of failed attempts: FAILURES at once, one more every REFILL
    seconds (a token bucket per client address)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self._lock = threading.Lock()

    def _level(self, client: str, now: float) -> float:
        tokens, at = self._buckets.get(client, (float(FAILURES), now))
        return min(float(FAILURES), tokens + (now - at) / REFILL)

    def wait(self, client: str) -> float:
        """Seconds until `client` may try again (0: it may now)."""
        with self._lock:
            level = self._level(client, self._clock())
        return 0.0 if level >= 1 else (1 - level) * REFILL

    def failed(self, client: str) -> None:
        with self._lock:
            now = self._clock()
            self._buckets[client] = (max(0.0, self._level(client, now) - 1), now)
            self._buckets.move_to_end(client)
            while len(self._buckets) > CLIENTS:
                self._buckets.popitem(last=False)
