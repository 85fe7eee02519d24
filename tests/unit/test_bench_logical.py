"""The logical phase's report (benchmarks/logical.py): each figure reaches its target line, with
what the table mode and the broker did beside it, and the rows that are not rates stay out of
the rate table; the CPU split names the server processes the phase counted."""

from __future__ import annotations

import pytest

from benchmarks.logical import ALONE, BARE, LOGGED, NOTHING, TABLE, EmitCost
from benchmarks.machine import CpuSplit
from benchmarks.report import _table, figures, logical_figures
from benchmarks.results import Results, add
from benchmarks.targets import LogicalFigures, logical_lines, target_lines

MET = LogicalFigures(
    drain=9000.0,
    ceiling=10000.0,
    table=7500.0,
    single=8000.0,
    relay_us=23.0,
    table_relay_us=29.0,
    ceiling_us=20.0,
    database_us=8.0,
    table_database_us=48.0,
    single_database_us=12.0,
    enqueue=0.96,
    enqueue_bare=0.97,
    enqueue_nothing=0.98,
    enqueue_table=0.93,
    p50_ms=1.4,
    p99_ms=9.0,
    floor_p50_ms=0.8,
    floor_p99_ms=4.0,
    table_p50_ms=3.5,
    table_p99_ms=11.0,
)


def test_every_logical_target_with_what_stood_beside_it() -> None:
    assert logical_lines(MET) == [
        "target drain from the log >= 0.8x its ceiling (80-byte bodies): met "
        "(log: 9,000 vs 10,000 msg/s: 0.90x)",
        "  beside: the table's drain of the same backlog, 7,500 vs 10,000 msg/s: 0.75x",
        "  beside: from the log, one message a transaction, 8,000 vs 10,000 msg/s: 0.80x",
        "target database CPU per message from the log <= 0.33x the table's (walsender "
        "included): met (8.0 vs 48.0 us: 0.17x)",
        "  beside: one message a transaction, 12.0 us: 0.25x the table's",
        "  beside: the relay's CPU per message, from the log 23 us, from the table 29 us, raw "
        "pika 20 us (1.15x and 1.45x raw pika's)",
        "target one writer's commits with a message in the log >= 0.95x without it: met (0.96x)",
        "  beside: the same emit bare (no library) 0.97x; a statement that writes nothing "
        "(SELECT 1) 0.98x; a message in the table (outbox.enqueue) 0.93x",
        "target commit-to-consumer p50 from the log <= the broker's floor + 1 ms: met "
        "(1.40 vs 0.80 ms: +0.60 ms)",
        "  beside: p99 from the log 9.00 ms, the floor's 4.00 ms; from the table p50 3.50 ms, "
        "p99 11.00 ms",
    ]


@pytest.mark.parametrize(
    ("changed", "start", "end"),
    [
        (
            {"drain": 7999.0},
            "target drain from the log",
            "NOT met (log: 7,999 vs 10,000 msg/s: 0.80x)",
        ),
        ({"database_us": 16.1}, "target database CPU", "NOT met (16.1 vs 48.0 us: 0.34x)"),
        ({"database_us": 16.0}, "target database CPU", ": met (16.0 vs 48.0 us: 0.33x)"),
        ({"enqueue": 0.94}, "target one writer's commits", "NOT met (0.94x)"),
        ({"p50_ms": 1.81}, "target commit-to-consumer", "NOT met (1.81 vs 0.80 ms: +1.01 ms)"),
    ],
)
def test_a_logical_target_missed_says_so(changed: dict[str, float], start: str, end: str) -> None:
    fields = {name: getattr(MET, name) for name in MET.__dataclass_fields__}
    lines = logical_lines(LogicalFigures(**{**fields, **changed}))
    [line] = [line for line in lines if line.startswith(start)]
    assert line.endswith(end), line


def test_a_logical_figure_without_its_bound_cannot_be_judged() -> None:
    lines = logical_lines(LogicalFigures(drain=9000.0, database_us=8.0, p50_ms=1.4))
    assert lines == [
        "target drain from the log >= 0.8x its ceiling (80-byte bodies): cannot be judged "
        "(log: 9,000 msg/s; its bound was not measured)",
        "target database CPU per message from the log <= 0.33x the table's (walsender "
        "included): cannot be judged (8.0 us; the table's was not measured)",
        "target commit-to-consumer p50 from the log <= the broker's floor + 1 ms: cannot be "
        "judged (1.40 ms; the floor was not measured)",
    ]


def test_nothing_of_the_logical_phase_measured_judges_nothing() -> None:
    assert logical_lines(LogicalFigures()) == []


def _drain(results: Results, key: str, rate: float, relay_us: float, database_us: float) -> None:
    row = add(results, key, rate)
    row.relay_us.append(relay_us)
    row.database_us.append(database_us)


def test_the_logical_rows_reach_the_targets_and_only_the_rates_the_table() -> None:
    results: Results = {}
    ceiling = add(results, "logical-ceiling", 10000.0)
    ceiling.relay_us.append(20.0)
    _drain(results, "logical-table", 7500.0, 29.0, 48.0)
    _drain(results, "logical", 9000.0, 23.0, 8.0)
    _drain(results, "logical-single", 8000.0, 25.0, 12.0)
    for key, value in (
        ("logical-enqueue", 0.96),
        ("logical-enqueue-bare", 0.97),
        ("logical-enqueue-nothing", 0.98),
        ("logical-enqueue-table", 0.93),
        ("logical-latency", 1.4),
        ("logical-latency-p99", 9.0),
        ("logical-floor", 0.8),
        ("logical-floor-p99", 4.0),
        ("logical-latency-table", 3.5),
        ("logical-latency-table-p99", 11.0),
    ):
        add(results, key, value)
    assert logical_figures(results) == MET
    assert figures(results).logical == MET
    assert target_lines(figures(results)) == logical_lines(MET)
    table = _table(results)
    assert len(table) == 2 + 4, table  # header, rule, the four drains
    row = next(line for line in table if line.startswith("relay drain from the log (--capture"))
    assert row.endswith("9,000 msg/s  0.90x 80-byte ceiling"), row


def test_the_median_of_the_rounds_is_judged() -> None:
    results: Results = {}
    for floor, p50 in ((0.8, 1.2), (0.7, 2.5), (0.9, 1.6)):
        add(results, "logical-floor", floor)
        add(results, "logical-latency", p50)
    found = logical_figures(results)
    assert (found.floor_p50_ms, found.p50_ms) == (0.8, 1.6)


def test_the_enqueue_cost_names_every_variant_and_the_statements() -> None:
    cost = EmitCost(
        rates={ALONE: 500.0, LOGGED: 470.0, BARE: 480.0, NOTHING: 490.0, TABLE: 460.0},
        ratios={ALONE: 1.0, LOGGED: 0.94, BARE: 0.96, NOTHING: 0.98, TABLE: 0.92},
        rounds=20,
        statement_us={LOGGED: 90.0, BARE: 70.0, NOTHING: 65.0, TABLE: 140.0},
    )
    assert cost.describe() == (
        "one writer: business row alone 500 commits/s; outbox.enqueue into the log 470 = 0.94x, "
        "the same emit, bare (no library) 480 = 0.96x, a statement that writes nothing "
        "(SELECT 1) 490 = 0.98x, outbox.enqueue into the table 460 = 0.92x (median of 20 "
        "interleaved rounds); per statement inside one transaction: outbox.enqueue into the log "
        "90 us, the same emit, bare (no library) 70 us, a statement that writes nothing "
        "(SELECT 1) 65 us, outbox.enqueue into the table 140 us"
    )


def test_the_cpu_split_names_the_server_processes_it_counted() -> None:
    split = CpuSplit(
        2.0,
        {"relay": 0.4, "rabbitmq": 1.0, "database": 0.2, "other": 0.1, "idle": 0.3},
        server=0.5,
        roles={"client backend": 0.05, "walsender": 0.15},
    )
    assert split.describe(10_000) == (
        "cores: relay 0.20 (40 us/msg), rabbitmq 0.50 (100 us/msg), database 0.10 (20 us/msg), "
        "other 0.05 (10 us/msg), idle 0.15, every database process 0.25 (50 us/msg), database "
        "by process: walsender 15.0 us/msg, client backend 5.0 us/msg"
    )


def test_a_cpu_split_of_the_whole_server_says_nothing_more() -> None:
    split = CpuSplit(1.0, {"relay": 0.1, "database": 0.2})
    assert split.describe(1000).endswith("idle 0.00")
