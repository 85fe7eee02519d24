"""Estimated counts: how they are made from the database's statistics (relay/store/estimates.py),
and that every output says which figures are estimates: `status` ("~", "?" and a note), its
JSON, and the `outbox.messages` gauge (`estimated="true"`)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from relay.cli.schema import estimate_notes, figure, format_exchanges, format_status
from relay.loop.observer import Observer
from relay.ports import StateCounts
from relay.store import estimates
from relay.store.estimates import ESTIMATED, EXACT_PAGES, TableStats
from tests.unit.fakes import FakeStore

MEASURED = TableStats(
    pages=50_000,
    live_tuples=1_000_000,
    measured=True,
    reltuples=900_000.0,
    relpages=45_000,
    state_shares={"published": 0.98, "cancelled": 0.01, "pending": 0.01},
    exchange_shares={"orders": 0.75, "billing": 0.25},
)
COUNTED = {"pending": 9_000, "in_flight": 500, "dead": 400, "discarded": 100}
ESTIMATED_LIST = sorted(ESTIMATED)  # as status --json lists them


# --------------------------------------------------------------------------- the estimates


def test_a_small_table_is_counted_exactly_a_large_one_is_not() -> None:
    assert TableStats(EXACT_PAGES, 0, True, 0.0, 0).small
    assert not TableStats(EXACT_PAGES + 1, 0, True, 0.0, 0).small


def test_the_rows_not_counted_exactly_are_split_by_analyzes_shares() -> None:
    # 1,000,000 live rows, 10,000 counted: 990,000 published or cancelled, 98 to 1.
    assert estimates.settled(MEASURED, COUNTED) == {"published": 980_000, "cancelled": 10_000}


def test_without_shares_all_of_it_is_published() -> None:
    never_analyzed = TableStats(50_000, 1_000_000, False, -1.0, 0)
    assert never_analyzed.rows() == 1_000_000  # the running count has seen every row
    assert estimates.settled(never_analyzed, COUNTED) == {"published": 990_000, "cancelled": 0}


def test_more_counted_than_the_statistics_know_of_is_none_settled() -> None:
    # The running count lags the exact counts by a second or so during a burst of enqueues.
    lagging = TableStats(50_000, 5_000, True, 0.0, 0)
    assert estimates.settled(lagging, COUNTED) == {"published": 0, "cancelled": 0}


def test_after_a_reset_of_the_statistics_the_planners_figure_scaled_to_the_heap_stands_in() -> None:
    # Reset (a crash): no VACUUM or ANALYZE recorded since, the running count restarted at 0.
    reset = TableStats(50_000, 0, False, 900_000.0, 45_000)
    assert reset.rows() == pytest.approx(1_000_000)
    # Never measured at all: nothing else to go by than the running count.
    assert TableStats(50_000, 7, False, -1.0, 0).rows() == 7
    assert TableStats(50_000, 7, False, 0.0, 0).rows() == 7  # measured when it had no pages


def test_shares_read_pg_stats_arrays_and_tolerate_their_absence() -> None:
    assert estimates.shares(["published", "pending"], [0.75, 0.25]) == {
        "published": 0.75,
        "pending": 0.25,
    }
    assert estimates.shares(None, None) == {}
    assert estimates.shares(["published"], None) == {}


def test_per_exchange_spreads_the_estimate_by_each_exchanges_share() -> None:
    totals = estimates.settled(MEASURED, COUNTED)
    counted = {"orders": {"pending": 9_000, "dead": 400}, "billing": {"in_flight": 500}}
    got = estimates.per_exchange(MEASURED, totals, counted)
    # orders: 750,000 rows less 9,400 counted; billing: 250,000 less 500; split 98 to 1.
    assert got == {
        "billing": {"cancelled": 2_520, "published": 246_980},
        "orders": {"cancelled": 7_481, "published": 733_119},
    }


def test_per_exchange_lists_exchanges_too_rare_for_a_share_with_nothing_estimated() -> None:
    got = estimates.per_exchange(MEASURED, {"published": 10, "cancelled": 0}, {"rare": {}})
    assert got["rare"] == {"cancelled": 0, "published": 0}
    assert set(got) == {"rare", "orders", "billing"}


def test_per_exchange_without_analyze_says_nothing_rather_than_guessing() -> None:
    never = TableStats(50_000, 1_000_000, True, -1.0, 0)
    got = estimates.per_exchange(never, {"published": 10}, {"orders": {"pending": 1}})
    assert got == {"orders": {"cancelled": None, "published": None}}


# --------------------------------------------------------------------------- status


def report(estimated: list[str]) -> dict[str, Any]:
    return {"pending": 3, "in_flight": 1, "published": 2_000_000, "dead": 2, "cancelled": 0,
            "discarded": 5, "ready": 2, "delayed": 1, "oldest_pending_age_s": 1.25,
            "estimated": estimated}  # fmt: skip


def exchange(name: str, published: int | None, estimated: list[str]) -> dict[str, Any]:
    return {"exchange": name, "pending": 3, "in_flight": 1, "published": published, "dead": 2,
            "cancelled": 0 if published is not None else None, "discarded": 5,
            "oldest_ready_age_s": None, "estimated": estimated}  # fmt: skip


def test_a_figure_is_marked_when_estimated_and_unknown_when_missing() -> None:
    assert figure(12, False) == "12"
    assert figure(12, True) == "~12"
    assert figure(None, True) == "?"


def test_status_marks_only_the_estimated_states() -> None:
    lines = dict(line.split(None, 1) for line in format_status(report(["cancelled", "published"]))
                 .replace("oldest ready age", "oldest_ready_age").splitlines())  # fmt: skip
    assert lines == {
        "pending": "3 (2 ready, 1 delayed)",
        "in_flight": "1",
        "published": "~2000000",
        "dead": "2",
        "cancelled": "~0",
        "discarded": "5",
        "oldest_ready_age": "1.2 s",
    }
    assert "~" not in format_status(report([]))


def test_the_exchange_table_marks_estimates_and_unknowns() -> None:
    text = format_exchanges(
        [exchange("orders", 700, ESTIMATED_LIST), exchange("", None, ESTIMATED_LIST)]
    )
    header, orders, default = text.splitlines()
    assert header.split() == ["EXCHANGE", "PENDING", "IN_FLIGHT", "PUBLISHED", "DEAD",
                              "CANCELLED", "DISCARDED", "OLDEST", "READY"]  # fmt: skip
    assert orders.split() == ["orders", "3", "1", "~700", "2", "~0", "5", "-"]
    assert default.split() == ["(default)", "3", "1", "?", "2", "?", "5", "-"]


def test_the_notes_explain_the_marks_that_are_there_and_no_others() -> None:
    assert estimate_notes(report([]), [exchange("a", 1, [])]) == []
    (tilde,) = estimate_notes(report(ESTIMATED_LIST), [exchange("a", 1, ESTIMATED_LIST)])
    assert tilde.startswith("~ estimated from the database's statistics")
    tilde, unknown = estimate_notes(report(ESTIMATED_LIST), [exchange("a", None, ESTIMATED_LIST)])
    assert unknown.startswith("? not estimated per exchange until the table is analyzed")


# --------------------------------------------------------------------------- the gauge


class EstimatingStore(FakeStore):
    def counts(self) -> StateCounts:
        return StateCounts({"pending": 4, "published": 1_000_000}, 3, 1, 2.5, ESTIMATED)


def test_the_gauge_labels_each_figure_estimated_or_not() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    Observer(None, meter).watch(EstimatingStore(), dict)
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "outbox.messages"
        for point in metric.data.data_points
    ]
    got = {}
    for point in points:
        assert isinstance(point, NumberDataPoint)
        attributes = dict(point.attributes or {})
        got[attributes["state"]] = (point.value, attributes["estimated"])
    assert got == {
        "pending": (4, "false"),
        "in_flight": (0, "false"),
        "published": (1_000_000, "true"),
        "dead": (0, "false"),
        "cancelled": (0, "true"),
        "discarded": (0, "false"),
        "ready": (3, "false"),
    }
