"""The benchmark's targets (benchmarks/targets.py): K is the smallest window at 0.9x the largest
window's rate, and each target's line says met, NOT met, or that it cannot be judged."""

from __future__ import annotations

import pytest

from benchmarks import profiles
from benchmarks.neighbour import Held
from benchmarks.report import _comparisons, _table, figures
from benchmarks.results import Results, add
from benchmarks.targets import Figures, target_lines, window_line, window_need

RATES = {32: 2000.0, 64: 3500.0, 128: 6000.0, 256: 9100.0, 512: 9800.0, 1024: 9900.0, 2048: 10000.0}


def test_k_is_the_smallest_window_at_nine_tenths_of_the_largest() -> None:
    assert window_need(RATES) == 256
    assert window_need({**RATES, 256: 8999.0}) == 512


def test_k_is_judged_against_the_largest_window_even_when_a_smaller_one_is_faster() -> None:
    assert window_need({32: 500.0, 64: 12000.0, 2048: 10000.0}) == 64
    assert window_need({32: 500.0, 2048: 10000.0}) == 2048


def test_no_k_without_a_rate_at_the_largest_window() -> None:
    assert window_need({}) is None
    assert window_need({32: 100.0, 2048: 0.0}) is None
    assert window_line({}) is None


def test_the_window_line_gives_k_and_every_rate() -> None:
    line = window_line(RATES)
    assert line is not None
    assert line.startswith("window need K = 256:")
    assert "32: 2,000" in line
    assert "2048: 10,000" in line


def _line(lines: list[str], start: str) -> str:
    found = [line for line in lines if line.startswith(start)]
    assert len(found) == 1, lines
    return found[0]


@pytest.mark.parametrize(("duplicates", "word"), [(512.0, "met"), (513.0, "NOT met")])
def test_kill_duplicates_are_judged_against_twice_k(duplicates: float, word: str) -> None:
    lines = target_lines(Figures(window_rates=RATES, kill_duplicates=duplicates))
    line = _line(lines, "target kill mid-drain duplicates <= 2x K (512): ")
    assert line.endswith(f": {word} ({duplicates:.0f} vs 512)")


def test_kill_duplicates_without_k_cannot_be_judged() -> None:
    line = _line(target_lines(Figures(kill_duplicates=100.0)), "target kill mid-drain dup")
    assert ": cannot be judged (100 duplicates; K was not measured" in line


def test_recovery_and_steady_kill() -> None:
    lines = target_lines(Figures(kill_recovery_s=6.4, steady_duplicates=100.0))
    assert _line(lines, "target kill mid-drain recovery").endswith("NOT met (6.4 s vs 6 s)")
    assert _line(lines, "target steady kill").endswith(": met (100 vs 100)")


def test_hot_keys_against_raw_pika_with_as_many_unconfirmed() -> None:
    lines = target_lines(Figures(hot_1=900.0, hot_serial=1000.0, hot_4=2000.0, hot_serial_4=3000.0))
    one = _line(lines, "target one hot key >= 0.9x raw pika with one unconfirmed")
    assert one.endswith(": met (900 vs 1,000 msg/s: 0.90x)")
    four = _line(lines, "target four hot keys >= 0.9x raw pika with four unconfirmed")
    assert four.endswith(": NOT met (2,000 vs 3,000 msg/s: 0.67x)")


def test_a_hot_key_without_its_bound_cannot_be_judged() -> None:
    line = _line(target_lines(Figures(hot_4=2000.0)), "target four hot keys")
    assert "cannot be judged" in line


def test_the_default_drain_and_the_small_figures() -> None:
    lines = target_lines(
        Figures(
            ceiling=10000.0,
            drain=8500.0,
            small=9000.0,
            small_ceiling=15000.0,
            small_relay_us=40.0,
            small_ceiling_us=25.0,
            small_database_us=45.0,
            relay_us=100.0,
        )
    )
    assert _line(lines, "target relay >= 0.8x ceiling").endswith(
        ": met (in-process: 8,500 vs 10,000 msg/s: 0.85x)"
    )
    small = _line(lines, "target 80-byte drain >= 0.8x its ceiling")
    assert small.endswith(": NOT met (9,000 vs 15,000 msg/s: 0.60x)")
    cpu = _line(lines, "target relay CPU per 80-byte message <= 1.67x raw pika's")
    assert cpu.endswith(": met (40 vs 25 us: 1.60x)")
    assert _line(lines, "80-byte bodies: ") == (
        "80-byte bodies: database CPU 45 us/msg (1 KB bodies: relay 100 us)"
    )


def test_the_floor_relay_is_printed_as_the_bound_beside_its_target() -> None:
    lines = target_lines(
        Figures(
            small=9000.0,
            small_ceiling=15000.0,
            small_relay_us=40.0,
            small_ceiling_us=25.0,
            small_database_us=45.0,
            floor=10500.0,
            floor_us=30.0,
            floor_database_us=30.0,
        )
    )
    small = lines.index(_line(lines, "target 80-byte drain"))
    assert lines[small + 1] == (
        "  bound: the floor relay at the relay's window ceiling, 10,500 vs 15,000 msg/s: 0.70x"
    )
    cpu = lines.index(_line(lines, "target relay CPU"))
    assert lines[cpu + 1] == "  beside: the floor relay on pika's encoder, 30 us: 1.20x raw pika's"
    assert _line(lines, "80-byte bodies: ") == (
        "80-byte bodies: database CPU 45 us/msg; the floor relay's 30"
    )


def test_the_relays_cpu_without_raw_pikas_cannot_be_judged() -> None:
    line = _line(target_lines(Figures(small_relay_us=40.0)), "target relay CPU")
    assert "cannot be judged (40 us; raw pika's was not measured)" in line


def test_nothing_measured_judges_nothing() -> None:
    assert target_lines(Figures()) == []


@pytest.mark.parametrize(
    ("file_name", "function", "group"),
    [
        ("~", "<method 'poll' of 'select.epoll' objects>", "idle"),
        ("~", "<method 'get' of '_queue.SimpleQueue' objects>", "idle"),
        ("~", "<method 'send' of '_socket.socket' objects>", "C built-ins"),
        (
            "/v/lib/python3.11/site-packages/psycopg/connection.py",
            "wait",
            "waiting for the database",
        ),
        ("/v/lib/python3.11/site-packages/psycopg/cursor.py", "fetchall", "psycopg"),
        ("/v/lib/python3.11/site-packages/six.py", "b", "six"),
        (str(profiles.ROOT / "relay/amqp/publisher.py"), "_send", "relay.amqp"),
        (str(profiles.ROOT / "benchmarks/drain.py"), "run", "benchmarks"),
        (str(profiles.STDLIB / "json/decoder.py"), "decode", "stdlib json"),
    ],
)
def test_profile_time_is_grouped_by_where_the_code_lives(
    file_name: str, function: str, group: str
) -> None:
    assert profiles.where(file_name, function) == group


def test_one_hot_key_against_the_unkeyed_drain_is_a_figure_not_a_target() -> None:
    results: Results = {}
    for key, rate in (("hot-1", 1000.0), ("hot-unkeyed", 6000.0), ("hot-serial", 1200.0)):
        add(results, key, rate)
    lines = _comparisons(results)
    assert lines == ["one hot key: 0.17x the unkeyed drain; its bound, raw pika one confirm at a "
                     "time, 0.20x"]  # fmt: skip
    assert not [line for line in lines if line.startswith("target")]


@pytest.mark.parametrize(("beside", "word"), [(900.0, "met"), (899.0, "NOT met")])
def test_a_healthy_exchange_beside_a_broken_one_is_judged_against_itself_alone(
    beside: float, word: str
) -> None:
    lines = target_lines(Figures(neighbour=beside, neighbour_alone=3000.0))
    line = _line(lines, "target healthy exchange beside a broken one >= 0.3x alone: ")
    assert line.endswith(f": {word} ({beside:,.0f} vs 3,000 msg/s: {beside / 3000:.2f}x)")


def test_the_drain_beside_a_broken_one_without_the_drain_alone_cannot_be_judged() -> None:
    line = _line(target_lines(Figures(neighbour=900.0)), "target healthy exchange beside")
    assert "cannot be judged (900 msg/s; its bound was not measured)" in line


def test_the_neighbour_rows_reach_the_targets_and_the_table_as_a_ratio_to_alone() -> None:
    results: Results = {}
    add(results, "neighbour-alone", 3000.0)
    add(results, "neighbour", 2400.0)
    found = figures(results)
    assert (found.neighbour, found.neighbour_alone) == (2400.0, 3000.0)
    row = _line(_table(results), "healthy exchange beside a broken one ")
    assert row.endswith("2,400 msg/s  0.80x alone"), row


def test_the_broken_exchange_s_messages_held_whole_are_no_problem() -> None:
    held = Held(500, {"pending": 499, "in_flight": 1}, {"retry": 5, "deferred": 161})
    assert held.problem is None
    assert held.describe() == (
        "the broken exchange's 500 messages held: 5 attempts charged before its circuit opened, "
        "161 free (sent before it opened, or probes)"
    )


@pytest.mark.parametrize(
    ("states", "outcomes"),
    [
        ({"pending": 499}, {}),  # one lost
        ({"pending": 499, "published": 1}, {}),  # sent to an exchange that does not exist
        ({"pending": 499, "dead": 1}, {"dead": 1}),  # dead-lettered by the outage
    ],
)
def test_a_broken_exchange_s_message_lost_published_or_dead_is_a_problem(
    states: dict[str, int], outcomes: dict[str, int]
) -> None:
    assert Held(500, states, outcomes).problem is not None


def test_the_hot_key_floors_are_printed_as_the_bounds_beside_their_targets() -> None:
    lines = target_lines(
        Figures(
            hot_1=1800.0,
            hot_serial=2000.0,
            hot_4=3900.0,
            hot_serial_4=5000.0,
            hot_floor_1=1900.0,
            hot_floor_4=4000.0,
        )
    )
    one = lines.index(_line(lines, "target one hot key"))
    assert lines[one].endswith(": met (1,800 vs 2,000 msg/s: 0.90x)")
    assert lines[one + 1] == "  bound: the floor relay on one key, 1,900 vs 2,000 msg/s: 0.95x"
    four = lines.index(_line(lines, "target four hot keys"))
    assert lines[four].endswith(": NOT met (3,900 vs 5,000 msg/s: 0.78x)")
    assert lines[four + 1] == "  bound: the floor relay on four keys, 4,000 vs 5,000 msg/s: 0.80x"


@pytest.mark.parametrize(("ratio", "word"), [(0.9, "met"), (0.89, "NOT met")])
def test_one_enqueue_is_judged_against_a_plain_insert_of_its_columns(
    ratio: float, word: str
) -> None:
    lines = target_lines(Figures(enqueue_plain=ratio))
    line = _line(lines, "target one writer's commits with one enqueue >= 0.9x with a plain INSERT ")
    assert line.endswith(f": {word} ({ratio:.2f}x)")


@pytest.mark.parametrize(("ratio", "word"), [(5.0, "met"), (4.9, "NOT met")])
def test_enqueue_many_is_judged_against_as_many_enqueue_calls(ratio: float, word: str) -> None:
    lines = target_lines(Figures(enqueue_many=ratio))
    line = _line(lines, "target enqueue_many of 10,000 >= 5x 10,000 enqueue calls: ")
    assert line.endswith(f": {word} ({ratio:.1f}x)")


def test_the_enqueue_rows_reach_the_targets_and_stay_out_of_the_rate_table() -> None:
    results: Results = {}
    add(results, "enqueue", 0.7).extras.append("one writer: ...")
    add(results, "enqueue-plain", 0.93)
    add(results, "enqueue-many", 6.2).extras.append("10,000 messages in one transaction: ...")
    found = figures(results)
    assert (found.enqueue_plain, found.enqueue_many) == (0.93, 6.2)
    assert not [row for row in _table(results) if "enqueue" in row]
    assert [line.split(":")[0] for line in target_lines(found)] == [
        "target one writer's commits with one enqueue >= 0.9x with a plain INSERT of its columns "
        "(unindexed table)",
        "target enqueue_many of 10,000 >= 5x 10,000 enqueue calls",
    ]
