"""The retention policy: how long terminal messages are kept, and how much one pass may delete.

A pass deletes at most `max_batches` batches per group of states (published; dead, discarded and
cancelled), so it holds the relay loop up for a few short statements at most. A pass that used its
whole budget leaves a backlog behind: `next_run_in` then asks for the next pass soon rather than
after the full interval, so retention keeps up with any publish rate without ever taking long
turns. The statements themselves are the store's (relay/store/retention.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from outbox.states import State
from relay.errors import ConfigError

FAILED_STATES: tuple[str, ...] = (State.DEAD.value, State.DISCARDED.value, State.CANCELLED.value)

DAY = 86400.0


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long terminal messages are kept, and how much a pass may delete.

    An age of None keeps that group for ever.
    """

    published_after: float | None = 3 * DAY  # seconds after published_at
    failed_after: float | None = 30 * DAY  # dead, discarded, cancelled; see relay.store.retention
    batch_size: int = 500  # messages per delete (one short transaction each)
    interval: float = 60.0  # seconds between passes when there is no backlog
    max_batches: int = 4  # batches per group of states in one pass
    backlog_interval: float = 1.0  # seconds to the next pass when the last one used its budget

    def __post_init__(self) -> None:
        for name in ("published_after", "failed_after"):
            age = getattr(self, name)
            if age is not None and not (math.isfinite(age) and age > 0):
                raise ConfigError(f"retention {name} must be a positive number of seconds or None")
        for name in ("batch_size", "max_batches"):
            if getattr(self, name) < 1:
                raise ConfigError(f"retention {name} must be at least 1")
        for name in ("interval", "backlog_interval"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"retention {name} must be positive")

    @property
    def budget(self) -> int:
        """The most messages one group of states loses in one pass."""
        return self.batch_size * self.max_batches

    def groups(self) -> list[tuple[tuple[str, ...], float]]:
        """(states, age in seconds) for each group this policy purges."""
        chosen: list[tuple[tuple[str, ...], float]] = []
        if self.published_after is not None:
            chosen.append(((State.PUBLISHED.value,), self.published_after))
        if self.failed_after is not None:
            chosen.append((FAILED_STATES, self.failed_after))
        return chosen

    def next_run_in(self, deleted: int) -> float:
        """Seconds until the next pass, after one that deleted `deleted` messages."""
        return self.backlog_interval if deleted >= self.budget else self.interval
