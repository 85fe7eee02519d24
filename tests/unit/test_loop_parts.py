"""The loop's parts on their own: one counter set, the upkeep's schedule, the claimer's pacing."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import random

import pytest

from relay.core.outcome import Fate, Outcome
from relay.core.retention import RetentionPolicy
from relay.errors import DatabaseUnavailable
from relay.loop.claimer import UNANNOUNCED_MEMORY
from relay.loop.counts import Counts
from relay.loop.leases import Leases
from relay.loop.maintenance import Maintenance
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.ports import Outgoing
from relay.runtime.config import RelayConfig
from tests.unit.fakes import EPOCH, FakePublisher, FakeStore, make_claimed


def test_a_run_is_the_sum_of_its_passes() -> None:
    total = Counts()
    total.add(Counts(claimed=3, published=2, failures={"rejected": 1}, full_batch=True))
    total.add(Counts(published=1, retried=1, deferred=2, failures={"rejected": 1, "never_sent": 2}))
    assert total == Counts(
        claimed=3, published=3, retried=1, deferred=2, failures={"rejected": 2, "never_sent": 2}
    )  # full_batch is the last pass's: no backlog any more
    total.add(Counts(drained=False))
    total.add(Counts())
    assert not total.drained  # once a stop released rows, the run did not drain


def test_the_summary_counts_what_the_passes_reported() -> None:
    store = FakeStore()
    store.add(*(make_claimed(i) for i in range(1, 8)))

    def decide(item: Outgoing) -> Outcome:
        return Outcome(item.seq, Fate.REJECTED if item.seq == 4 else Fate.CONFIRMED, "nack")

    cfg = RelayConfig(db_url="sqlite://", relay_id="t", claim_max=3)
    wall = EPOCH + dt.timedelta(minutes=1)  # the rows were made a minute ago
    relay = wire_relay(
        store, FakePublisher(decide=decide), cfg, clock=lambda: 1000.0, wall=lambda: wall
    )
    passes = Counts()
    for _ in range(6):
        passes.add(relay.run_once())
    assert relay.summary == passes
    assert (passes.claimed, passes.published, passes.retried) == (7, 6, 1)
    assert passes.failures == {"rejected": 1}


class PurgingStore(FakeStore):
    def __init__(self, results: list[int | None]) -> None:
        super().__init__()
        self.results = results  # None: the database is down
        self.calls = 0

    def purge_expired(self, policy: RetentionPolicy, now: dt.datetime) -> int:
        self.calls += 1
        result = self.results.pop(0)
        if result is None:
            raise DatabaseUnavailable("down")
        return result


def test_retention_comes_back_soon_only_after_a_pass_that_used_its_budget() -> None:
    policy = RetentionPolicy(batch_size=10, max_batches=2, interval=60, backlog_interval=1)
    cfg = RelayConfig(db_url="sqlite://", relay_id="t", retention=policy)
    # a full budget (a backlog), less, a database outage, nothing
    store = PurgingStore([20, 5, None, 0])
    upkeep = Maintenance(store, cfg, leases=Leases(), wall=lambda: EPOCH)
    now = 0.0
    assert upkeep.retention_due(now) is policy
    for wait in (1, 60, 60, 60):
        with contextlib.suppress(DatabaseUnavailable):
            upkeep.purge(policy, now)
        assert upkeep.retention_due(now + wait - 0.01) is None
        assert upkeep.retention_due(now + wait) is policy
        now += wait
    assert store.calls == 4


def test_retention_off_is_never_due() -> None:
    cfg = RelayConfig(db_url="sqlite://", relay_id="t", retention=None)
    upkeep = Maintenance(FakeStore(), cfg, leases=Leases(), wall=lambda: EPOCH)
    assert upkeep.retention_due(1e9) is None


def test_a_failing_database_backs_claims_off_longer_each_time_until_a_claim_works() -> None:
    now = [1000.0]
    store = FakeStore(fail_next=["claim", "claim", "claim"])
    store.add(make_claimed(1))
    cfg = RelayConfig(db_url="sqlite://", relay_id="t")
    relay = wire_relay(store, FakePublisher(), cfg, clock=lambda: now[0], rng=random.Random(1))
    waits = []
    for attempt in (1, 2, 3):
        assert relay.run_once().claimed == 0
        assert relay.claimer.db_attempt == attempt
        waits.append(relay.claimer.next_turn(now[0]) - now[0])
        now[0] += waits[-1]
    # Full jitter in a window that doubles: 0.1, 0.2, 0.4 s, never under 0.05 s.
    for wait, window in zip(waits, (0.1, 0.2, 0.4), strict=True):
        assert 0.05 <= wait <= window
    assert relay.run_once().claimed == 1
    assert relay.claimer.db_attempt == 0


def _after_a_claim_that_took_all_there_was() -> tuple[Relay, FakeStore, RelayConfig, list[float]]:
    """A relay whose claim just took the one row there was (its clock in a list, to move)."""
    now = [1000.0]
    store = FakeStore()
    store.add(make_claimed(1))
    cfg = RelayConfig(db_url="sqlite://", relay_id="t", claim_max=10)
    relay = wire_relay(store, FakePublisher(hold=True), cfg, clock=lambda: now[0])
    assert relay.run_once().claimed == 1
    return relay, store, cfg, now


def test_a_claim_that_took_all_there_was_looks_again_after_the_shortest_wait_not_at_once() -> None:
    # A look at once finds nothing, and its work would hold the GIL just as the publisher's
    # thread wakes to send what the claim handed it (the latency of every quiet message).
    relay, store, cfg, now = _after_a_claim_that_took_all_there_was()
    assert relay.claimer.next_turn(now[0]) - now[0] == pytest.approx(cfg.min_poll_interval)
    # A full batch (a backlog) is followed by the next claim at once.
    store.add(*(make_claimed(i) for i in range(2, 30)))
    now[0] += cfg.min_poll_interval
    counts = relay.run_once()
    assert (counts.claimed, counts.full_batch) == (10, True)


def test_the_looks_after_a_claim_that_took_all_there_was_double_their_wait() -> None:
    relay, _, cfg, now = _after_a_claim_that_took_all_there_was()
    looks = []
    for _ in range(4):
        now[0] = relay.claimer.next_turn(now[0])
        looks.append(now[0] - 1000.0)
        assert relay.run_once().claimed == 0
    shortest = cfg.min_poll_interval
    assert looks == pytest.approx([shortest, 3 * shortest, 7 * shortest, 15 * shortest])


def _announcing(key: str | None = None) -> tuple[Relay, FakeStore, RelayConfig, list[float]]:
    """A relay that was told of one row (a notification, as LISTEN delivers it) and claimed it,
    the broker answering at once."""
    now = [1000.0]
    store = FakeStore()
    cfg = RelayConfig(db_url="sqlite://", relay_id="t", claim_max=10)
    relay = wire_relay(store, FakePublisher(), cfg, clock=lambda: now[0])
    store.add(make_claimed(1, key=key))
    relay.wake()
    assert relay.run_once().claimed == 1
    return relay, store, cfg, now


def test_after_rows_that_each_came_with_a_notification_the_next_look_waits_for_the_next_one() -> (
    None
):
    relay, store, cfg, now = _announcing()
    assert relay.claimer.next_turn(now[0]) - now[0] == pytest.approx(cfg.poll_interval)
    now[0] += 0.01
    assert relay.run_once().published == 1
    assert relay.claimer.next_turn(now[0]) - now[0] == pytest.approx(cfg.poll_interval - 0.01)
    # The next notification ends the wait.
    store.add(make_claimed(2))
    relay.wake()
    assert relay.run_once().claimed == 1
    assert relay.claimer.next_turn(now[0]) - now[0] == pytest.approx(cfg.poll_interval)


def test_settling_a_keyed_message_looks_for_its_keys_next_at_once_then_waits() -> None:
    relay, store, cfg, now = _announcing(key="k")
    now[0] += 0.01
    claims = len(store.runs_asked)
    assert relay.run_once().published == 1
    assert len(store.runs_asked) == claims + 1  # the key's next may be claimable: looked at once
    # Nothing came: back to waiting for a notification, not looking every few milliseconds.
    assert relay.claimer.next_turn(now[0]) - now[0] == pytest.approx(cfg.poll_interval)


def test_settling_an_unkeyed_message_looks_for_nothing() -> None:
    relay, store, _, now = _announcing()
    now[0] += 0.01
    claims = len(store.runs_asked)
    assert relay.run_once().published == 1
    assert len(store.runs_asked) == claims


def test_a_notification_a_claim_could_not_use_yet_still_counts_for_its_row() -> None:
    # A keyed message whose key is busy: the claim that its notification prompted finds
    # nothing; the claim after the settlement that frees the key finds it, announced.
    relay, store, cfg, now = _announcing(key="k")
    store.add(make_claimed(2, key="k"))
    relay.wake()
    now[0] += 0.01
    relay.run_once()
    assert relay.claimer.next_turn(now[0]) - now[0] == pytest.approx(cfg.poll_interval)


def test_rows_no_notification_announced_keep_the_quick_looks_for_a_while() -> None:
    relay, store, cfg, now = _after_a_claim_that_took_all_there_was()  # no notification at all
    assert relay.claimer.next_turn(now[0]) - now[0] == pytest.approx(cfg.min_poll_interval)
    relay.publisher.confirm_held()  # type: ignore[attr-defined]
    for seconds in (5.0, UNANNOUNCED_MEMORY + 1):
        now[0] += seconds
        store.add(make_claimed(int(now[0])))
        relay.wake()  # this one was announced: a rationed writer announces some of its rows
        assert relay.run_once().claimed == 1
        relay.publisher.confirm_held()  # type: ignore[attr-defined]
        quick = seconds < UNANNOUNCED_MEMORY
        wait = cfg.min_poll_interval if quick else cfg.poll_interval
        assert relay.claimer.next_turn(now[0]) - now[0] == pytest.approx(wait), seconds


def test_a_working_relay_says_so_at_info_at_once_then_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FakeStore()
    store.add(make_claimed(1))
    now = [1000.0]
    cfg = RelayConfig(db_url="sqlite://", relay_id="t")
    relay = wire_relay(store, FakePublisher(), cfg, clock=lambda: now[0], wall=lambda: EPOCH)

    def progress() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == "relay.progress"]

    with caplog.at_level(logging.INFO, logger="relay"):
        relay.run_once()  # claims and sends
        relay.run_once()  # settles: the first message after a quiet spell is said at once
        said = [(r.levelname, r.__dict__["published"], r.__dict__["in_flight"]) for r in progress()]
        assert said == [("INFO", 1, 0)]
        store.add(make_claimed(2), make_claimed(3))
        now[0] += 30.0
        relay.run_once()
        relay.run_once()
        assert len(progress()) == 1  # within the minute: counted, not said
        now[0] += 31.0
        relay.run_once()  # nothing new, but two were settled since the last line
        later = [(r.__dict__["published"], r.__dict__["seconds"]) for r in progress()[1:]]
        assert later == [(2, 61.0)]
        now[0] += 120.0
        relay.run_once()
        assert len(progress()) == 2  # nothing to do: nothing said
