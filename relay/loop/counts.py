"""What the relay did: one counter set for a pass and for a whole run."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Counts:
    """One pass's work (`run_once`), or a whole run's (`run`: the sum of its passes, by `add`)."""

    claimed: int = 0
    published: int = 0
    retried: int = 0  # failed attempts to be tried again, each charged an attempt
    deferred: int = 0  # held back for later, no attempt charged (backpressure, an open circuit)
    dead: int = 0
    released: int = 0  # released unsent (shutdown)
    reclaimed: int = 0  # expired leases, of any relay, returned to the ready set
    failures: dict[str, int] = field(default_factory=dict)  # failed attempts by failure class
    full_batch: bool = False  # the (last) pass's claim filled its batch: more is waiting
    drained: bool = True  # every claimed row was settled: none was released at the stop

    def add(self, other: Counts) -> None:
        self.claimed += other.claimed
        self.published += other.published
        self.retried += other.retried
        self.deferred += other.deferred
        self.dead += other.dead
        self.released += other.released
        self.reclaimed += other.reclaimed
        for cls, n in other.failures.items():
            self.failures[cls] = self.failures.get(cls, 0) + n
        self.full_batch = other.full_batch
        self.drained = self.drained and other.drained
