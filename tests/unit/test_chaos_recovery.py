"""The chaos suite's recovery figures (tests/chaos/recovery.py): the calibration's keys, and the
steps read from the relay's log and the checker's arrivals."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos.checker import DeliveryChecker, Report
from tests.chaos.recovery import (
    Return,
    Speed,
    Timeline,
    calibration_keys,
    full_speed,
    note,
    timeline,
)
from tests.chaos.run import Row, table

COLD = [f"k{n}" for n in range(200)]


def test_the_calibration_has_the_runs_key_shape() -> None:
    uniform = calibration_keys(5000, COLD, [], 0.0)
    assert Counter(uniform) == dict.fromkeys(COLD, 25)
    hot = calibration_keys(1000, COLD, ["hot0", "hot1"], 0.8)
    on_hot = Counter(k for k in hot if k.startswith("hot"))
    assert on_hot == {"hot0": 400, "hot1": 400}


def _stamp(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_the_steps_count_from_the_faults_end(tmp_path: Path) -> None:
    wall, at = 1_800_000_000.0, 500.0
    log = tmp_path / "relay.log"
    log.write_text(
        f"{_stamp(wall - 30)} info broker.connected node=a\n"
        f"{_stamp(wall - 9)} warning broker.lost node=a retry_in=0.5 attempt=1\n"
        f"{_stamp(wall + 0.2)} warning broker.lost node=a retry_in=0.3 attempt=2\n"
        f"{_stamp(wall + 0.5)} info broker.connected node=a\n"
    )
    checker = DeliveryChecker()
    for n in range(3):
        checker.committed(f"m{n}", "k0")
    back = Return(at, wall, frozenset({"m0", "m1", "m2"}), backlog=2)
    # Arrivals at chosen moments (m0 before the fault's end), as received() would record them.
    checker.committed("w0", "k1")  # a writer's, committed after the fault's end
    checker._arrived_at.update({"m0": at - 1.0, "m1": at + 0.7, "w0": at + 1.0, "m2": at + 1.2})
    checker._arrived.update({"m0", "m1", "w0", "m2"})
    t = timeline(back, checker, Speed(4.0, 6.0), log, [at - 40, at + 0.9])
    assert t.relay_connected is not None
    assert abs(t.relay_connected - 0.5) < 0.002
    assert t.lost_after == 1
    assert (t.first_arrival, t.drained) == pytest.approx((0.7, 1.2))
    assert t.full_speed_s == 0.5  # the backlog at its own shape's speed, not at 6 msg/s
    assert t.rate_after == pytest.approx(4.0)  # every arrival, the writer's too
    assert t.consumer_connects == 2
    assert t.consumer_connected == pytest.approx(0.9)
    line = note("broker cut", t)
    assert "2 messages waited; relay reconnected +0.50 s (1 failed attempts after it)" in line
    assert "last +1.20 s (4 msg/s; 4 msg/s with the writers' messages)" in line
    assert "full speed 4 msg/s for a backlog of this shape (6 msg/s delivered in all)" in line
    assert "(drain 0.5 s)" in line


def test_the_full_speed_is_the_calibrations_own_and_every_message_beside_it() -> None:
    checker = DeliveryChecker()
    for name in ("c0", "c1", "w0", "w1", "w2", "w3"):
        checker.committed(name, "k0" if name.startswith("c") else "k1")
    arrivals = {"c0": 10.0, "w0": 10.5, "w1": 11.0, "w2": 11.5, "c1": 12.0, "w3": 13.0}
    checker._arrived_at.update(arrivals)
    checker._arrived.update(arrivals)
    # Its own two in 2 s: one after the first, 0.5 a second. Five arrivals in all from its first to
    # its last (w3 came after): 4 in 2 s.
    speed = full_speed(checker, {"c0", "c1"}, timeout=1.0)
    assert speed is not None
    assert (speed.backlog, speed.delivered) == pytest.approx((0.5, 2.0))


def test_a_calibration_that_never_drains_has_no_speed() -> None:
    checker = DeliveryChecker()
    checker.committed("c0", "k0")
    assert full_speed(checker, {"c0"}, timeout=0.05) is None


def test_the_table_gives_the_drain_and_the_recovery_beyond_it() -> None:
    def row(fault: str, speed: Speed | None) -> Row:
        t = Timeline(
            backlog=3000, speed=speed, relay_connected=0.2, lost_after=0, first_arrival=0.3,
            drained=4.4, consumer_connects=1, consumer_connected=None,
        )  # fmt: skip
        return Row(fault, Report(10, 10, 0, 0, 0, 0), 4.5, timeline=t)

    lines = table([row("broker cut", Speed(1000.0, 2000.0)), row("no calibration", None)])
    assert lines.splitlines()[0].split("  ")[-2:] == ["full-speed drain", "beyond it"]
    cut, bare = lines.splitlines()[2:]
    assert cut.split()[-4:] == ["3.0", "s", "+1.5", "s"]  # 3,000 at 1,000 msg/s; 4.5 s in all
    assert bare.split()[-2:] == ["-", "-"]
