"""How the recorder turns scrapes into promtool series (tests/prometheus/series.py)."""

from __future__ import annotations

import pytest

from tests.prometheus import series

AGE = ("outbox_oldest_ready_age_seconds", ())
BUCKET = "outbox_publish_latency_milliseconds_bucket"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], "1+1x3"),
        ([5.0, 5.0, 5.0], "5+0x2"),
        (["_", "_", 1.0, 2.5], "_x2 1 2.5"),
        ([3.0, 1.0, 2.0, 3.0, "stale", "_", 7.0], "3 1+1x2 stale _ 7"),
        ([10.0, 7.5, 5.0], "10-2.5x2"),
    ],
)
def test_runs_are_written_in_promtools_notation(values: list[float | str], expected: str) -> None:
    assert series.compress(values) == expected


def test_a_missing_series_gets_one_stale_marker_then_blanks() -> None:
    scrapes: list[series.Scrape] = [None, {AGE: 1.0}, {}, None, {AGE: 2.0}]
    assert series.tokens(AGE, scrapes) == ["_", 1.0, "stale", "_", 2.0]


def test_time_is_scaled_and_counts_are_not() -> None:
    text = (
        "outbox_oldest_ready_age_seconds 2.5\n"
        f'{BUCKET}{{exchange="ar.1.orders",le="250.0"}} 3.0\n'
        f'{BUCKET}{{exchange="ar.1.orders",le="+Inf"}} 4.0\n'
        "outbox_other 1.0\n"
    )
    scrape = series.parse(text, {AGE[0], BUCKET})
    scaled = series.rescale(scrape, 60.0, lambda v: v.replace("ar.1.", ""))
    assert scaled == {
        AGE: 150.0,
        (BUCKET, (("exchange", "orders"), ("le", "15000"))): 3.0,
        (BUCKET, (("exchange", "orders"), ("le", "+Inf"))): 4.0,
    }


def test_up_says_which_scrapes_answered() -> None:
    rows = series.input_series([{AGE: 0.0}, None, {AGE: 0.0}], {"job": "j"})
    assert rows == [
        {"series": 'up{job="j"}', "values": "1 0 1"},
        {"series": 'outbox_oldest_ready_age_seconds{job="j"}', "values": "0 stale 0"},
    ]
