"""The self-sizing window (relay/core/window.py), driven by a simulated broker whose confirm
round is `base_s` plus the time to get through what is queued at `capacity` messages a second.
Pure: no clock but the test's."""

from __future__ import annotations

import random

import pytest

from relay.core.window import FLOOR, ROUND, START, Window


def rate_at(size: int, *, capacity: float, base_s: float) -> float:
    """A window of `size` turns once per round (Little's law); the round grows with what is
    queued."""
    return size / (base_s + size / capacity)


def settled_size(capacity: float, base_s: float) -> float:
    """The window whose round takes ROUND on this broker."""
    return (ROUND - base_s) * capacity


def drive(
    window: Window,
    seconds: float,
    *,
    capacity: float = 10_000.0,
    base_s: float = 0.02,
    offered: float | None = None,  # None: a backlog, the window always full
    noise: float = 0.0,
    start: float = 0.0,
    tick: float = 0.005,
    rng: random.Random | None = None,
) -> float:
    """Run the window for `seconds` of simulated time; return the clock at the end."""
    rng = rng or random.Random(3)
    now, owed = start, 0.0
    while now < start + seconds:
        now += tick
        rate = rate_at(window.size, capacity=capacity, base_s=base_s)
        if offered is None:
            window.held_back()
            window.in_flight(window.size)
        else:
            rate = min(rate, offered)
            window.in_flight(max(1, round(rate * base_s)))  # little queues at this rate
        rate *= 1.0 + rng.uniform(-noise, noise)
        owed += rate * tick
        done = int(owed)
        owed -= done
        window.written(done, now)
    return now


@pytest.mark.parametrize(
    ("capacity", "base_s"), [(10_000.0, 0.02), (6_000.0, 0.05), (3_000.0, 0.01), (20_000, 0.1)]
)
def test_a_backlog_takes_the_window_to_the_size_whose_round_takes_round(
    capacity: float, base_s: float
) -> None:
    window = Window(100_000)
    drive(window, 10.0, capacity=capacity, base_s=base_s)
    assert window.size == pytest.approx(settled_size(capacity, base_s), rel=0.1)


def test_it_gets_there_within_a_couple_of_seconds() -> None:
    window = Window(4096)
    drive(window, 2.5)
    assert window.size >= 0.8 * settled_size(10_000.0, 0.02)


def test_noise_in_the_rate_moves_it_little() -> None:
    window = Window(100_000)
    now = drive(window, 10.0, noise=0.4)
    sizes = []
    for _ in range(100):
        now = drive(window, 0.25, noise=0.4, start=now)
        sizes.append(window.size)
    target = settled_size(10_000.0, 0.02)
    assert 0.7 * target <= min(sizes)
    assert max(sizes) <= 1.3 * target


def test_the_ceiling_bounds_the_window() -> None:
    window = Window(200)
    drive(window, 10.0, capacity=50_000.0)  # would settle near 6,500
    assert window.size == 200
    small = Window(8)
    assert small.size == 8
    drive(small, 2.0)
    assert small.size == 8


def test_a_steady_trickle_keeps_the_window_small() -> None:
    window = Window(4096)
    now = drive(window, 10.0)  # a backlog first: the window grows
    grown = window.size
    assert grown > 1000
    drive(window, 5.0, offered=1000.0, start=now)  # then 1,000 msg/s: ~20 in flight
    assert window.size <= max(FLOOR, 2 * 30)


def test_a_slower_broker_shrinks_it_and_a_faster_one_grows_it() -> None:
    window = Window(100_000)
    now = drive(window, 10.0, capacity=20_000.0)
    fast = window.size
    now = drive(window, 10.0, capacity=5_000.0, start=now)
    assert window.size == pytest.approx(settled_size(5_000.0, 0.02), rel=0.1)
    assert window.size < fast / 3
    drive(window, 10.0, capacity=20_000.0, start=now)
    assert window.size == pytest.approx(fast, rel=0.1)


def test_the_first_window_the_floor_and_a_bad_ceiling() -> None:
    assert Window(4096).size == START
    window = Window(4096)
    drive(window, 5.0, offered=10.0)
    assert window.size == FLOOR
    with pytest.raises(ValueError, match="ceiling"):
        Window(0)


def test_no_outcomes_no_epoch() -> None:
    window = Window(4096)
    window.written(0, 1.0)
    window.held_back()
    assert window.last is None
    assert window.size == START


def test_a_chains_piece_always_fits_in_the_smallest_window() -> None:
    from relay.loop import chains

    assert FLOOR >= chains.CHUNK  # or a hot key could wait for room that never comes
