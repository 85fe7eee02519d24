"""The delivery checker: what the application committed against what the consumer received.

Jepsen's queue checker, with per-key order: lost = committed and never received; unexpected =
received and never committed (a rolled-back transaction's message, say); duplicated = received more
than once (allowed: delivery is at least once); out of order = a key whose messages were first
received in an order other than the one they were committed in. A run passes when lost, unexpected
and out-of-order are all zero.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Set
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Report:
    committed: int
    received: int
    lost: int
    unexpected: int
    duplicated: int
    out_of_order: int
    lost_ids: tuple[str, ...] = ()
    disordered_keys: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.unexpected == 0 and self.out_of_order == 0


@dataclass
class DeliveryChecker:
    """Thread-safe: writers call `committed`/`rolled_back`, the consumer calls `received`."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _committed: dict[str, str | None] = field(default_factory=dict)  # id -> key
    _order: dict[str, list[str]] = field(default_factory=dict)  # key -> ids in commit order
    _rolled_back: set[str] = field(default_factory=set)
    _received: list[str] = field(default_factory=list)
    _arrived: set[str] = field(default_factory=set)  # _received without its repeats
    _in_order: dict[str, int] = field(default_factory=dict)  # key -> its first ids all arrived
    _arrived_at: dict[str, float] = field(default_factory=dict)  # id -> first arrival (monotonic)

    def committed(self, message_id: str, key: str | None) -> None:
        """Call after the transaction committed (per key, from one writer, in commit order)."""
        with self._lock:
            self._committed[message_id] = key
            if key is not None:
                self._order.setdefault(key, []).append(message_id)

    def rolled_back(self, message_id: str) -> None:
        with self._lock:
            self._rolled_back.add(message_id)

    def received(self, message_id: str) -> None:
        with self._lock:
            self._received.append(message_id)
            self._arrived.add(message_id)
            self._arrived_at.setdefault(message_id, time.monotonic())

    def all_received(self, ids: set[str] | None = None) -> bool:
        """Whether every committed message (or every one of `ids`) has arrived."""
        with self._lock:
            return (self._committed.keys() if ids is None else ids) <= self._arrived

    def waiting(self, ids: Set[str]) -> int:
        """How many of `ids` have not arrived yet."""
        with self._lock:
            return len(ids - self._arrived)

    def arrival_times(self, ids: Set[str]) -> list[float]:
        """When each of `ids` that has arrived first did (time.monotonic())."""
        with self._lock:
            arrived_at = self._arrived_at
            return [arrived_at[i] for i in ids if i in arrived_at]

    def backlog(self, key: str) -> int:
        """Messages of `key` committed and not arrived yet, counted from the first of them that
        has not arrived: what waits behind the key's head."""
        with self._lock:
            ids = self._order.get(key, [])
            n = self._in_order.get(key, 0)
            while n < len(ids) and ids[n] in self._arrived:
                n += 1
            self._in_order[key] = n
            return len(ids) - n

    @property
    def received_count(self) -> int:
        """Deliveries so far, duplicates included."""
        with self._lock:
            return len(self._received)

    def key_order(self) -> dict[str, list[str]]:
        """Each key's message ids in commit order."""
        with self._lock:
            return {key: list(ids) for key, ids in self._order.items()}

    def received_ids(self) -> set[str]:
        with self._lock:
            return set(self._arrived)

    def committed_ids(self) -> set[str]:
        with self._lock:
            return set(self._committed)

    @property
    def committed_count(self) -> int:
        with self._lock:
            return len(self._committed)

    def report(self) -> Report:
        with self._lock:
            counts = Counter(self._received)
            committed = set(self._committed)
            lost = sorted(committed - counts.keys())
            unexpected = [i for i in counts if i not in committed]
            first_seen: dict[str, int] = {}
            for position, message_id in enumerate(self._received):
                first_seen.setdefault(message_id, position)
            disordered = []
            for key, ids in self._order.items():
                seen = [first_seen[i] for i in ids if i in first_seen]
                if seen != sorted(seen):
                    disordered.append(key)
            return Report(
                committed=len(committed),
                received=len(self._received),
                lost=len(lost),
                unexpected=len(unexpected),
                duplicated=sum(n - 1 for n in counts.values() if n > 1),
                out_of_order=len(disordered),
                lost_ids=tuple(lost[:10]),
                disordered_keys=tuple(disordered[:10]),
            )
