"""Short versions of the chaos scenarios, in `make test` (`make chaos` runs them at full length,
plus a broker restart and a memory alarm, which touch the whole broker). The faults that reach
the database (a killed relay mid-lease, a cut database connection, spoiled rows) run on MariaDB
too; the broker's faults do not involve the database and run on PostgreSQL only. A relay killed
mid-drain runs on PostgreSQL with every setting at its default. Hot keys (most of the traffic on 3
keys, drained as runs) go through kills and both cuts in one test, on each database."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.loop.chains import RUN
from tests.chaos import mid_drain, run

# Full-speed relays under faults: one at a time, on a worker of their own (--dist loadgroup). The
# other full-speed drains ("heavy") have another: at most one of each runs at once.
pytestmark = pytest.mark.xdist_group("chaos")


@pytest.mark.parametrize(
    ("name", "fault", "proxies", "database"),
    [
        ("relay SIGKILL x3", run.kill_relay(3, between=(0.5, 1.2)), {}, "postgresql"),
        (
            "broker connection cut x2",
            run.cut("broker", 2, down=1.0, up=1.0),
            {"broker": True},
            "postgresql",
        ),
        ("database connection cut x1", run.cut("db", 1, down=2.0, up=1.5), {"db": True},
         "postgresql"),
        ("slow broker", run.slow_broker(0.01, 3.0), {"broker": True}, "postgresql"),
        ("poison rows x16", run.poison_rows(16, every=0.25), {"steady": True}, "postgresql"),
        ("relay SIGKILL x3", run.kill_relay(3, between=(0.5, 1.2)), {}, "mariadb"),
        ("database connection cut x1", run.cut("db", 1, down=2.0, up=1.5), {"db": True},
         "mariadb"),
        ("poison rows x16", run.poison_rows(16, every=0.25), {"steady": True}, "mariadb"),
    ],
    ids=["kill", "broker-cut", "db-cut", "slow-broker", "poison-rows", "kill-mariadb",
         "db-cut-mariadb", "poison-rows-mariadb"],
)  # fmt: skip
def test_nothing_is_lost_unexpected_or_out_of_order(
    name: str, fault: run.Fault, proxies: dict[str, bool], database: str, amqp_url: str,
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    if database == "mariadb":
        request.getfixturevalue("mysql_admin")  # one line, not a traceback, if it is down
    row = run.run(
        name,
        fault,
        messages=2000,
        rate=400.0,  # five seconds of traffic, through the faults
        settle_timeout=90,
        workdir=tmp_path,
        proxy_broker=proxies.get("broker", False),
        proxy_db=proxies.get("db", False),
        steady_connection=proxies.get("steady", False),
        database=database,
    )
    with capsys.disabled():
        print(f"\n{run.table([row])}")
    report = row.report
    logs = "".join(p.read_text()[-3000:] for p in tmp_path.glob("chaos-*.log"))
    assert report.committed > 1800
    assert row.ok, (row, logs)
    if name.startswith("broker connection cut"):
        assert row.connections_lost >= 1, (row, logs)  # the cut reached the relay
    if row.poisoned:
        assert row.poison_dead == row.poisoned, row


def test_a_relay_killed_mid_drain_is_taken_over_by_its_heartbeat_not_its_lease(
    amqp_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Default settings (a 30 s lease): the next relay takes the killed one's rows back when its
    heartbeat stops, and publishes again at most what the broker had not confirmed to it."""
    row = mid_drain.run_kill_mid_drain(messages=4000, workdir=tmp_path, settle_timeout=90)
    with capsys.disabled():
        print(f"\n{run.table([row])}\n{mid_drain.note(row)}")
    logs = "".join(p.read_text() for p in tmp_path.glob("chaos-*.log"))
    assert row.ok, (row, logs[-3000:])
    assert row.report.committed == 4000
    assert "relay.dead_relays_reclaimed" in logs
    assert "relay.leases_reclaimed" not in logs  # what an expired lease would have said
    # What was sent again is at most what the killed relay held: never the whole backlog.
    assert row.held_at_kill is not None
    assert row.report.duplicated <= row.held_at_kill


@pytest.mark.parametrize(
    "database", ["postgresql", "mariadb"], ids=["hot-keys", "hot-keys-mariadb"]
)
def test_hot_keys_keep_their_order_through_kills_and_cuts(
    database: str, amqp_url: str, request: pytest.FixtureRequest, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """3 keys with 80% of the traffic: each fault leaves several runs waiting behind each, and
    the relay is killed (its runs in flight) and cut off in the middle of publishing them."""
    if database == "mariadb":
        request.getfixturevalue("mysql_admin")
    messages = 10_800  # 18 s of traffic at run.HOT_RATE, through the faults
    fault = run.one_after_another(
        run.kill_mid_run(3, between=(0.0, 1.0)),
        run.cut("broker", 1, down=2.0, up=1.5),
        run.cut("db", 1, down=2.0, up=1.5),
    )
    row = run.run(
        "hot keys: relay SIGKILL mid-run x3, broker cut, database cut",
        fault,
        messages=messages,
        rate=run.HOT_RATE,
        keys=run.HOT,
        settle_timeout=60,
        workdir=tmp_path,
        proxy_broker=True,
        proxy_db=True,
        database=database,
    )
    with capsys.disabled():
        print(f"\n{run.table([row])}\n{run.hot_note(row)}")
    logs = "".join(p.read_text()[-3000:] for p in tmp_path.glob("chaos-*.log"))
    assert row.report.committed > 0.9 * messages
    assert row.ok, (row, logs)
    assert row.hot_backlog > RUN, row  # the faults held the hot keys back by more than a run
