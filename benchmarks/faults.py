"""What a SIGKILL costs: the chaos suite's own scenarios (tests/chaos), run once each, their
duplicates and recovery read as figures.

kill         a relay with default settings drains a committed backlog and is killed at 40% of
             it; another starts at once (tests.chaos.mid_drain)
steady-kill  writers commit a steady 1,000 msg/s for STEADY_S seconds; the relay (the chaos
             suite's flags: short leases, so its rows come back within seconds) is killed once
             and restarted at once (tests.chaos.run with kill_relay(1))

Both run on a schema (MariaDB: a database), exchange and queue of their own, against the chaos
suite's servers (OUTBOX_TEST_PG_URL, OUTBOX_TEST_MYSQL_URL, OUTBOX_TEST_AMQP_URL; the same local
ones as the benchmark's by default), all removed afterwards.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.chaos import mid_drain, run

KILL_BACKLOG = 20_000  # messages in the kill phase's backlog, at most
KILL_AT = 0.4  # share of the backlog arrived when the relay is killed
STEADY_S = 15  # seconds of writes in the steady-kill phase
# When the steady-kill phase's kill lands, seconds after the writers start: past the relay's
# start, well inside the traffic.
STEADY_KILL_AFTER = (4.0, 6.0)


@dataclass(frozen=True, slots=True)
class KillResult:
    messages: int
    duplicates: int
    recovery_s: float
    held: int | None  # rows the killed relay held in flight (kill mid-drain only)
    problems: str | None  # lost, unexpected or out-of-order messages: a failed run

    def describe(self) -> str:
        held = f", the killed relay held {self.held:,} in flight" if self.held is not None else ""
        return (
            f"{self.messages:,} messages{held}; {self.duplicates} duplicates, "
            f"recovery {self.recovery_s:.1f} s" + (f"; {self.problems}" if self.problems else "")
        )


def _result(row: run.Row) -> KillResult:
    r = row.report
    problems = None
    if not row.ok:
        problems = (
            f"FAILED: lost {r.lost}, unexpected {r.unexpected}, out of order {r.out_of_order}"
            + (f", innocent dead {row.innocent_dead}" if row.innocent_dead else "")
        )
    return KillResult(r.committed, r.duplicated, row.recovery_s, row.held_at_kill, problems)


def _in_workdir(scenario: Callable[[Path], run.Row]) -> KillResult:
    """Run the scenario with its relay logs in a directory of its own, kept only if it fails."""
    workdir = Path(tempfile.mkdtemp(prefix="outbox-bench-kill-"))
    result = _result(scenario(workdir))
    if result.problems is None:
        shutil.rmtree(workdir, ignore_errors=True)
        return result
    return dataclasses.replace(result, problems=f"{result.problems} (relay logs in {workdir})")


def kill_mid_drain(messages: int, database: str) -> KillResult:
    return _in_workdir(
        lambda workdir: mid_drain.run_kill_mid_drain(
            messages=messages, kill_after=KILL_AT, workdir=workdir, database=database
        )
    )


def steady_kill(database: str) -> KillResult:
    return _in_workdir(
        lambda workdir: run.run(
            "steady kill",
            run.kill_relay(1, between=STEADY_KILL_AFTER),
            messages=round(STEADY_S * run.RATE),
            rate=run.RATE,
            workdir=workdir,
            database=database,
        )
    )
