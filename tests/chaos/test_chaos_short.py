"""Short versions of the chaos scenarios, in `make test` (`make chaos` runs them at full length,
plus a broker restart and a memory alarm, which touch the whole broker). The faults that reach
the database (a killed relay mid-lease, a cut database connection, spoiled rows) run on MariaDB
too; the broker's faults do not involve the database and run on PostgreSQL only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import run


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
    if row.poisoned:
        assert row.poison_dead == row.poisoned, row
