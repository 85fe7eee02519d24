"""A node gone silent while confirms are owed: a paused VM, a host cut off. Its connection stays
open, so nothing fails until the AMQP heartbeat's timeout (heartbeat + 5 s to twice that, and the
broker's default heartbeat is 60 s); meanwhile every message sent to it waits for its confirm.

`Silence` decides, from the connection's byte count sampled once a second, when to ask the node
to open a channel (which it answers itself, even while a queue's leader on another node keeps its
confirms waiting) and when to drop it for the next node: silent for `timeout` seconds while
confirms have been owed that long, then silent `timeout` more after the question.
"""

from __future__ import annotations

from enum import Enum

# Seconds of silence, while confirms are owed that long, before the node is asked; as many again
# without an answer and it is dropped. A live broker, even a slow one, answers a channel open
# sooner; a blocked connection (a resource alarm) is exempt.
STALL_TIMEOUT = 3.0


class Action(Enum):
    NONE = "none"
    ASK = "ask"  # open a channel: the node answers it if it is alive
    DROP = "drop"  # the node did not answer: move on to the next


class Silence:
    def __init__(self, timeout: float = STALL_TIMEOUT) -> None:
        self.timeout = timeout
        self._bytes = -1  # the connection's byte count when last sampled
        self._since = 0.0  # when it last changed (or the node was asked)
        self._asked = False

    def reset(self, now: float) -> None:
        """A new connection: nothing heard yet, nothing asked."""
        self._bytes, self._since, self._asked = -1, now, False

    def check(self, now: float, received: int, owed_since: float | None, blocked: bool) -> Action:
        """`received`: the connection's bytes received so far; `owed_since`: when the oldest
        unconfirmed message was sent (None: none is owed)."""
        if received != self._bytes:  # the node spoke
            self._bytes, self._since, self._asked = received, now, False
            return Action.NONE
        if blocked or owed_since is None or now - owed_since < self.timeout:
            return Action.NONE
        if now - self._since < self.timeout:
            return Action.NONE
        if not self._asked:
            self._asked, self._since = True, now
            return Action.ASK
        return Action.DROP
