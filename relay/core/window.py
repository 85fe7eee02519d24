"""The publisher's window: how many messages the relay may have sent and not yet written.

What a relay killed mid-drain leaves sent and unmarked (for the next relay to publish again) is
this window, so it should be as small as the broker's confirm round needs and no smaller. That
need is not a constant: at full speed the broker keeps about rate x confirm latency messages
unconfirmed, and both change with its load. So the window follows the measured round, as TCP
sizes its window to the path: one epoch at a time (a quarter of a second or a few turns of the
window), it measures the rate at which outcomes are written, and

- while the window is what holds the hand-over back, it moves towards `ROUND` seconds of that
  rate (half way in each epoch, at most doubling or halving): a window that turns faster than
  `ROUND` grows, the rate growing with it, until the round (the broker's confirms and the
  relay's writes, queued behind each other) takes `ROUND`; one that turns slower shrinks;
- while it is not (the work comes slower than the window could send it), it shrinks to twice
  what was in flight at most, so a kill at a steady rate leaves only a few messages behind.

The rate measured against the window's size is noisy (marks are written in bursts, the broker
fsyncs in groups): a target of a time, not a search for the rate's peak, keeps the window steady
under that noise. `ceiling` (`--max-in-flight`) bounds it always. Pure: the caller says what
happened, with its clock's time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The smallest window: one chain's chunk (relay/loop/chains.py CHUNK) must always fit in it, or a
# hot key would wait for room that never comes.
FLOOR = 64
START = 256  # the first window: a drain starts at a fair speed and grows from there
# Seconds of the relay's own rate the window holds at full speed: about what the broker's
# confirm round takes under load (50-100 ms at a few thousand messages a second), with the
# relay's writes behind it. A killed relay leaves at most this much to publish again.
ROUND = 0.15
EPOCH_MIN = 0.25  # seconds an epoch lasts at least ...
EPOCH_TURNS = 2  # ... and long enough to write this many windows' worth of outcomes ...
EPOCH_MAX = 2.0  # ... or this long, whichever comes first


@dataclass(frozen=True, slots=True)
class Epoch:
    """What one epoch measured (for the relay's metrics and logs)."""

    size: int  # the window during the epoch
    rate: float  # outcomes written a second
    limited: bool  # the window held a hand-over back


class Window:
    def __init__(self, ceiling: int, *, start: int = START, floor: int = FLOOR) -> None:
        if ceiling < 1:
            raise ValueError("the window's ceiling must be at least 1")
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.size = max(self.floor, min(start, ceiling))
        self._began: float | None = None  # the epoch's start (None: none running)
        self._written = 0
        self._limited = False
        self._peak = 0  # the most messages in flight during the epoch
        self.last: Epoch | None = None

    # ----------------------------------------------------------------- what happened

    def written(self, messages: int, now: float) -> None:
        """`messages` outcomes were written (published, retried or dead)."""
        if messages <= 0:
            return
        if self._began is None:
            self._began = now
        self._written += messages
        self._turn(now)

    def held_back(self) -> None:
        """The window was full while rows waited to be handed over."""
        self._limited = True

    @property
    def limited(self) -> bool:
        """Whether the window held a hand-over back in the epoch running now."""
        return self._limited

    def in_flight(self, messages: int) -> None:
        """Messages sent and not written, now."""
        if messages > self._peak:
            self._peak = messages

    # ----------------------------------------------------------------- sizing

    def _turn(self, now: float) -> None:
        began = self._began
        assert began is not None
        elapsed = now - began
        # A full window's rate is measured over a few of its turns; a window the work does not
        # fill needs no more than the shortest epoch to show it.
        turns = self._written >= EPOCH_TURNS * self.size or not self._limited
        if elapsed < EPOCH_MIN or (elapsed < EPOCH_MAX and not turns):
            return
        epoch = Epoch(self.size, self._written / elapsed, self._limited)
        self.last = epoch
        peak = self._peak
        self._began, self._written, self._limited, self._peak = now, 0, False, 0
        if epoch.limited:
            # Half way (geometrically) to ROUND seconds of the rate: noise moves it little.
            want = epoch.rate * ROUND
            step = math.sqrt(want / self.size) if want > 0 else 0.5
            self._set(round(self.size * min(2.0, max(0.5, step))))
        else:
            # The work came slower than the window sends it: twice what was in flight is
            # enough (halving at most, each epoch).
            want = max(self.floor, 2 * peak)
            if want < self.size:
                self._set(max(want, self.size // 2))

    def _set(self, size: int) -> None:
        self.size = max(self.floor, min(self.ceiling, size))
