"""The soak's verdict (benchmarks/soak.py): a series is flat when the median of its last third
is at most 20% above its first third's, or within the series' slack; too few samples judge
nothing."""

from __future__ import annotations

from benchmarks.soak import judge


def test_a_steady_series_with_noise_is_flat() -> None:
    verdict = judge("rss", [50.0, 53.0, 49.0, 52.0, 51.0, 50.5, 54.0, 49.5, 51.0], 5.0)
    assert verdict is not None
    assert verdict.flat


def test_a_series_that_keeps_growing_is_not() -> None:
    verdict = judge("table size", [10.0 * n for n in range(1, 10)], 1.0)
    assert verdict is not None
    assert (verdict.first, verdict.last) == (20.0, 80.0)
    assert not verdict.flat
    assert "GROWING" in verdict.line("MB")


def test_small_values_are_judged_by_the_slack() -> None:
    verdict = judge("claim time", [0.8, 0.9, 0.8, 1.2, 1.1, 1.2], 0.5)  # +50%, but 0.4 ms
    assert verdict is not None
    assert verdict.flat


def test_a_shrinking_series_is_flat_and_two_samples_judge_nothing() -> None:
    verdict = judge("rss", [90.0, 80.0, 70.0, 60.0, 50.0, 40.0], 5.0)
    assert verdict is not None
    assert verdict.flat
    assert judge("rss", [1.0, 100.0], 5.0) is None
