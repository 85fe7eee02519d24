"""The NOTIFY ration: by rate (a token bucket), so a steady stream notifies on every message while
a flood of commits notifies a bounded number of times."""

from __future__ import annotations

import math
import threading

import pytest

import outbox
from outbox.config import DEFAULT_NOTIFY_BURST, DEFAULT_NOTIFY_RATE, settings
from outbox.ration import NotifyRation


def _taken(ration: NotifyRation, times: list[float]) -> int:
    return sum(ration.take(t) for t in times)


def test_a_steady_100_per_second_notifies_on_every_message_by_default() -> None:
    ration = NotifyRation(DEFAULT_NOTIFY_RATE, DEFAULT_NOTIFY_BURST)
    assert _taken(ration, [n / 100 for n in range(1000)]) == 1000  # ten seconds at 100/s


def test_a_flood_notifies_its_burst_then_at_the_rate() -> None:
    ration = NotifyRation(200.0, 10)
    # 5,000 commits in one second: the burst, then 200 a second.
    taken = _taken(ration, [n / 5000 for n in range(5000)])
    assert 200 <= taken <= 210 + 1


def test_commits_at_the_same_instant_share_the_burst() -> None:
    ration = NotifyRation(200.0, 5)
    assert [ration.take(7.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert not ration.take(7.001)  # a fifth of a token so far
    assert ration.take(7.006)  # a whole token (and a bit) 6 ms on


def test_idle_time_refills_no_more_than_the_burst() -> None:
    ration = NotifyRation(100.0, 3)
    assert _taken(ration, [0.0] * 3) == 3
    assert _taken(ration, [3600.0] * 10) == 3  # an hour idle: still only the burst


def test_an_infinite_rate_notifies_every_commit() -> None:
    ration = NotifyRation(math.inf, 1)
    assert _taken(ration, [1.0] * 1000) == 1000


def test_writers_on_many_threads_never_take_more_than_the_bucket_holds() -> None:
    ration = NotifyRation(1e-9, 50)  # no refill to speak of: the burst is all there is
    taken: list[int] = []

    def writer() -> None:
        taken.append(sum(ration.take(1.0) for _ in range(1000)))

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken) == 50


@pytest.mark.parametrize(
    ("changes", "error", "says"),
    [
        ({"notify_rate": 0}, ValueError, "notify_rate must be positive"),
        ({"notify_rate": -5.0}, ValueError, "notify=False turns NOTIFY off"),
        ({"notify_rate": math.nan}, ValueError, "notify_rate must be positive"),
        ({"notify_rate": "fast"}, TypeError, "notify_rate must be a number"),
        ({"notify_rate": True}, TypeError, "notify_rate must be a number"),
        ({"notify_burst": 0}, ValueError, "notify_burst must be positive"),
        ({"notify_burst": 2.5}, TypeError, "notify_burst must be an integer"),
    ],
)
def test_configure_refuses_a_bad_ration_and_keeps_the_old_one(
    changes: dict[str, object], error: type[Exception], says: str
) -> None:
    before = settings()
    with pytest.raises(error, match=says):
        outbox.configure(**changes)  # type: ignore[arg-type]
    assert settings() == before


def test_configure_sets_the_ration() -> None:
    before = settings()
    try:
        now = outbox.configure(notify_rate=math.inf, notify_burst=3)
        assert (now.notify_rate, now.notify_burst) == (math.inf, 3)
    finally:
        outbox.configure(notify_rate=before.notify_rate, notify_burst=before.notify_burst)
