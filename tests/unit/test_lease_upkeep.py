"""A relay keeps its own leases, however short: a claim still being published (a slow broker, a
hot key's run) is extended before its lease runs out, and before any reclaim of expired leases
could take it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest

from tests.unit.fakes import FakePublisher, FakeStore, make_claimed
from tests.unit.test_relay_loop import make_relay


class LeaseClock(FakeStore):
    """Records, on the relay's clock, each extension and each reclaim of expired leases."""

    def __init__(self, clock: object) -> None:
        super().__init__()
        self.clock = clock
        self.events: list[tuple[str, float]] = []

    def extend_leases(self, tokens: Sequence[uuid.UUID], lease_seconds: float) -> int:
        self.events.append(("extend", self.clock()))  # type: ignore[operator]
        return len(tokens)

    def reclaim_expired(self, *, relay_id: str = "", max_attempts: int = 10) -> int:
        self.events.append(("reclaim", self.clock()))  # type: ignore[operator]
        return 0


@pytest.mark.parametrize("lease", [6.0, 4.0, 30.0])
def test_a_lease_held_for_long_is_extended_before_it_could_run_out(lease: float) -> None:
    publisher = FakePublisher(hold=True)  # the broker never answers during the test
    store = LeaseClock(None)
    store.add(make_claimed(1))
    relay, clock = make_relay(
        store,
        publisher,
        lease_seconds=lease,
        reclaim_interval=5.0,
        confirm_timeout=1.0,
        batch_life=1000.0,
    )
    store.clock = clock
    claimed_at = clock.now
    relay.run_once()
    assert relay.in_flight == 1
    while clock.now - claimed_at < lease * 4:
        clock.now += 0.1
        relay.run_once()
    extended = [at for what, at in store.events if what == "extend"]
    # From the claim on, never more than half the lease without an extension (a third of it
    # old, and at most a sixth more before the next look).
    gaps = [b - a for a, b in zip([claimed_at, *extended], extended, strict=False)]
    assert extended
    assert max(gaps) <= lease / 2 + 0.15
    # And each reclaim of expired leases came after this relay's extension was due.
    for what, at in store.events:
        if what == "reclaim":
            last = max([claimed_at, *(e for e in extended if e <= at)])
            assert at - last < lease
