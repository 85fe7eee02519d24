"""Retention's pure parts: the cutoff id, state and argument checks, the policy, the SQL text."""

from __future__ import annotations

import argparse
import datetime as dt
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox import databases
from outbox.ids import new_id
from relay.cli import retention as retention_cli
from relay.cli.main import _Parser
from relay.core.retention import DAY, FAILED_STATES, RetentionPolicy
from relay.errors import ConfigError
from relay.runtime.config import RelayConfig
from relay.store import admin, retention
from relay.store.databases import dialect_for

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MAX_MS = (1 << 48) - 1
LAST_MS = (dt.datetime.max.replace(tzinfo=dt.UTC) - EPOCH) // dt.timedelta(milliseconds=1)


def v7(ms: int, rand: int) -> uuid.UUID:
    """A UUIDv7 laid out as outbox.ids.new_id lays it out, at `ms` with random bits `rand`."""
    value = ms << 80 | 0x7 << 76 | ((rand >> 62) & 0xFFF) << 64 | 0b10 << 62
    return uuid.UUID(int=value | (rand & 0x3FFF_FFFF_FFFF_FFFF))


def at_ms(ms: int) -> dt.datetime:
    return EPOCH + dt.timedelta(milliseconds=ms)


# --------------------------------------------------------------------------- cutoff id


def test_cutoff_id_is_a_uuid7_of_the_millisecond_with_zero_random_bits() -> None:
    moment = dt.datetime(2026, 3, 1, 12, 0, 0, 123_999, tzinfo=dt.UTC)
    cut = retention.cutoff_id(moment)
    assert cut.version == 7
    assert cut.variant == uuid.RFC_4122
    assert cut.int >> 80 == (moment - EPOCH) // dt.timedelta(milliseconds=1)
    assert cut.int & ((1 << 76) - 1) == 0b10 << 62  # only the variant below the version


def test_cutoff_id_ignores_the_time_zone_of_the_moment() -> None:
    utc = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    paris = utc.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert retention.cutoff_id(utc) == retention.cutoff_id(paris)


@given(
    st.integers(0, MAX_MS), st.integers(1, LAST_MS), st.integers(0, (1 << 80) - 1)
)  # fmt: skip
def test_ids_made_before_the_cutoff_sort_below_it_and_later_ones_do_not(
    earlier: int, cut_ms: int, rand: int
) -> None:
    cut = retention.cutoff_id(at_ms(cut_ms))
    before = v7(min(earlier, cut_ms - 1), rand)
    later = v7(max(earlier, cut_ms), rand)
    assert before < cut <= later
    # SQLite stores ids as 32 lowercase hex digits: text order must be the same.
    assert before.hex < cut.hex <= later.hex


def test_a_fresh_id_is_above_a_cutoff_in_the_past_and_below_one_in_the_future() -> None:
    now = dt.datetime.now(dt.UTC)
    fresh = new_id()
    assert retention.cutoff_id(now - dt.timedelta(seconds=5)) < fresh
    assert fresh < retention.cutoff_id(now + dt.timedelta(seconds=5))


def test_cutoff_id_covers_every_datetime() -> None:
    assert retention.cutoff_id(dt.datetime(1900, 1, 1, tzinfo=dt.UTC)).int >> 80 == 0
    latest = dt.datetime.max.replace(tzinfo=dt.UTC)
    assert retention.cutoff_id(latest).int >> 80 == (latest - EPOCH) // dt.timedelta(milliseconds=1)
    assert retention.cutoff_id(latest).int >> 80 < MAX_MS


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        retention.cutoff_id(dt.datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        retention.cutoff_time(dt.datetime(2026, 1, 1), 10)


def test_cutoff_time_is_utc_and_ages_must_be_finite_and_not_negative() -> None:
    now = dt.datetime(2026, 3, 1, 13, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert retention.cutoff_time(now, 3600) == dt.datetime(2026, 3, 1, 11, 0, tzinfo=dt.UTC)
    assert retention.cutoff_time(now, 0).tzinfo == dt.UTC
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="age"):
            retention.cutoff_time(now, bad)


# --------------------------------------------------------------------------- states


def test_terminal_states_are_accepted_in_order_without_repeats() -> None:
    assert retention.check_states(["dead", "published", "dead"]) == ("dead", "published")
    assert set(retention.check_states(retention.TERMINAL_STATES)) == {
        "published",
        "dead",
        "discarded",
        "cancelled",
    }


@pytest.mark.parametrize(
    ("states", "words"),
    [
        (["pending"], "pending messages are never purged"),
        (["published", "in_flight"], "in_flight messages are never purged"),
        (["pending", "in_flight"], "pending, in_flight messages are never purged"),
        (["publishd"], "unknown state publishd"),
        ([], "no state given"),
    ],
)
def test_live_unknown_and_missing_states_are_refused_in_one_line(
    states: list[str], words: str
) -> None:
    with pytest.raises(ValueError, match=words) as caught:
        retention.check_states(states)
    assert "\n" not in str(caught.value)
    assert "purgeable: published, dead, discarded, cancelled" in str(caught.value)


def test_batch_functions_check_their_arguments_before_touching_the_database() -> None:
    engine: object = None  # never reached: the checks come first
    now = dt.datetime.now(dt.UTC)
    kwargs = {"older_than_seconds": 60.0, "now": now}
    with pytest.raises(ValueError, match="never purged"):
        retention.purge_batch(engine, states=["pending"], batch_size=10, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        retention.purge_batch(engine, states=["published"], batch_size=0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_batches"):
        retention.purge(engine, states=["published"], max_batches=0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="never purged"):
        retention.count_eligible(engine, states=["in_flight"], **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- SQL text


POSTGRES = dialect_for("postgresql").texts()
SQLITE = dialect_for("sqlite").texts()
MYSQL = dialect_for("mysql").texts()


@pytest.mark.parametrize(
    "sql",
    [
        POSTGRES["purge_batch"],
        POSTGRES["count_eligible"],
        SQLITE["doomed"],  # a batch; then purge_messages deletes exactly these rows
        SQLITE["count_eligible"],
        MYSQL["doomed"],
        MYSQL["count_eligible"],
    ],
)
def test_statements_bound_by_id_and_never_name_a_live_state(sql: str) -> None:
    assert "id < :cutoff_id" in sql
    assert "id > :after_id" in sql
    assert "'pending'" not in sql
    assert "'in_flight'" not in sql
    assert "{" not in sql  # every template placeholder was filled


def test_batches_are_ordered_by_id_and_limited() -> None:
    for sql in (POSTGRES["purge_batch"], SQLITE["doomed"], MYSQL["doomed"]):
        assert "ORDER BY id LIMIT :batch_size" in " ".join(sql.split())
    assert "FOR UPDATE SKIP LOCKED" in POSTGRES["purge_batch"]
    assert "FOR UPDATE SKIP LOCKED" in MYSQL["doomed"]


def test_storage_settings_render_the_documented_statements() -> None:
    assert databases.STORAGE_SETTINGS_SQL[0] == (
        "ALTER TABLE outbox_message SET (autovacuum_vacuum_scale_factor = 0.01, "
        "autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.02, "
        "autovacuum_vacuum_cost_delay = 1)"
    )
    assert databases.STORAGE_SETTINGS_SQL[1].startswith("ALTER TABLE outbox_attempt SET (")
    assert all("fillfactor" not in s for s in databases.STORAGE_SETTINGS_SQL)


# --------------------------------------------------------------------------- CLI arguments


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="outbox-relay")
    sub = top.add_subparsers(dest="command", parser_class=_Parser)
    retention_cli.add_parser(sub)
    return top


def test_purge_arguments_and_their_defaults() -> None:
    args = parser().parse_args(["purge", "--older-than", "7d"])
    assert args.older_than == 7 * DAY
    assert args.state == []  # cmd_purge reads "none given" as published
    assert args.batch_size == retention_cli.DEFAULT_BATCH_SIZE
    assert not args.dry_run
    assert not args.json
    args = parser().parse_args(
        ["purge", "--older-than", "36h", "--state", "dead,discarded", "--state", "cancelled",
         "--batch-size", "50", "--dry-run", "--json"]
    )  # fmt: skip
    assert args.older_than == 36 * 3600
    assert args.state == ["dead", "discarded", "cancelled"]
    assert args.batch_size == 50
    assert args.dry_run
    assert args.json


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--older-than", "7d", "--state", "pending"], "pending messages are never purged"),
        (["--older-than", "7d", "--state", "published,in_flight"], "in_flight"),
        (["--older-than", "7d", "--state", "bogus"], "unknown state bogus"),
        (["--older-than", "soon"], "is not a duration"),
        (["--older-than", "0"], "longer than zero"),
        (["--older-than", "7d", "--batch-size", "0"], "between 1 and 10000"),
        (["--older-than", "7d", "--batch-size", "100000"], "between 1 and 10000"),
        (["--older-than", "7d", "--batch-size", "lots"], "not an integer"),
        ([], "--older-than"),
    ],
)
def test_bad_purge_usage_exits_2_with_one_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["purge", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert words in err


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"state": ["pending"]}, "never purged"),
        ({"older_than": 0.0}, "--older-than"),
        ({"batch_size": 0}, "--batch-size"),
    ],
)
def test_cmd_purge_checks_a_namespace_it_did_not_parse(
    overrides: dict[str, object], words: str
) -> None:
    args = argparse.Namespace(
        older_than=60.0, state=[], batch_size=100, dry_run=False, json=False
    )  # fmt: skip
    vars(args).update(overrides)
    # An unreachable database: the check must fail before anything connects.
    config = RelayConfig(db_url="postgresql+psycopg://root@127.0.0.1:1/x")
    with pytest.raises(ConfigError, match=words):
        retention_cli.cmd_purge(config, args)


# --------------------------------------------------------------------------- policy


def test_the_policy_the_purge_and_the_operator_share_one_definition_of_failed() -> None:
    assert FAILED_STATES == ("dead", "discarded", "cancelled")
    assert (FAILED_STATES, 30 * DAY) in RetentionPolicy().groups()
    assert ("published", *FAILED_STATES) == retention.TERMINAL_STATES
    assert admin.REPLAYABLE is FAILED_STATES


def test_policy_defaults_and_groups() -> None:
    policy = RetentionPolicy()
    assert policy.published_after == 3 * DAY
    assert policy.failed_after == 30 * DAY
    assert policy.batch_size == 500
    assert policy.interval == 60
    assert policy.groups() == [
        (("published",), 3 * DAY),
        (("dead", "discarded", "cancelled"), 30 * DAY),
    ]
    assert RetentionPolicy(failed_after=None).groups() == [(("published",), 3 * DAY)]


def test_the_next_pass_comes_soon_only_after_a_pass_that_used_its_budget() -> None:
    policy = RetentionPolicy(batch_size=10, max_batches=3, interval=60, backlog_interval=0.5)
    assert policy.budget == 30
    assert policy.next_run_in(0) == 60
    assert policy.next_run_in(29) == 60
    assert policy.next_run_in(30) == 0.5


@pytest.mark.parametrize(
    "overrides",
    [
        {"published_after": 0},
        {"failed_after": -1},
        {"published_after": float("nan")},
        {"batch_size": 0},
        {"max_batches": 0},
        {"interval": 0},
        {"backlog_interval": -1},
    ],
)
def test_policy_refuses_nonsense(overrides: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="retention"):
        RetentionPolicy(**overrides)  # type: ignore[arg-type]
