"""How long a reconnect loop waits before its next attempt: tenacity's full jitter
(`wait_random_exponential`: uniform between a floor and a window that doubles up to a cap), on a
real `RetryCallState` that numbers the attempts.

The broker's reconnect (relay/amqp/nodes.py) and the loop's database retries
(relay/loop/claimer.py) both wait this way and log the attempt with the wait. The caps are short
(under a second for the broker), so a connection comes back within a second of the server
accepting connections again; the jitter keeps a fleet of relays from reconnecting in lockstep.
Neither loop can block in tenacity's `Retrying` (one is pika's IO loop, the other the relay
loop, whose every wait a stop or a wake-up must end), so they ask for the wait and schedule it.
"""

from __future__ import annotations

from tenacity import RetryCallState, Retrying, stop_never
from tenacity.wait import wait_random_exponential


class Backoff:
    """Attempt numbers and jittered waits for one reconnect loop; `succeeded` starts over."""

    def __init__(self, *, first: float, cap: float, floor: float = 0.0) -> None:
        if not 0.0 <= floor <= first <= cap:
            raise ValueError(f"need 0 <= floor <= first <= cap, got {floor}, {first}, {cap}")
        self.cap = cap
        self._wait = wait_random_exponential(multiplier=first, max=cap, min=floor)
        self._retrying = Retrying(wait=self._wait, stop=stop_never)
        self._state: RetryCallState | None = None

    @property
    def attempt(self) -> int:
        """Attempts that failed since the last success (0: none)."""
        return 0 if self._state is None else self._state.attempt_number

    def failed(self) -> float:
        """An attempt failed: the seconds to wait before the next one."""
        if self._state is None:
            self._state = RetryCallState(self._retrying, None, (), {})
        else:
            self._state.prepare_for_next_attempt()
        return float(self._wait(self._state))

    def succeeded(self) -> None:
        self._state = None
