"""What a run's recovery figure is made of: the moment the fault ended (the broker or the database
back, the last killed relay restarted), what was waiting then, and how long that backlog takes
to drain at the full speed of this very run.

The full speed is measured, not assumed: before the writers' traffic meets any fault, a
calibration backlog committed ahead of the relay's start drains while the writers already write
(the same relay, consumer and load as after a fault). The calibration has the shape of what a
fault holds back: the run's keys, hot and cold in the run's proportions, since a keyed backlog
drains as chains (one message per confirm for each key) and not at an unkeyed backlog's rate.
The rate at which the calibration's own messages arrive is the full speed of such a backlog, and
a fault's backlog of B messages takes B / rate at full speed.

That rate is lower than what the relay delivers in all meanwhile (`Speed.delivered`): a key's
chain that has caught up goes on with the messages the writers commit on it, beside the keys
still behind, so a backlog shares the relay with the writers' traffic after a fault just as the
calibration did. Dividing the backlog by everything the relay delivers would leave that share
out. Recovery beyond the drain is what the fault itself cost (a reconnect, a lease taken back).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

import outbox
from tests.chaos.checker import DeliveryChecker

CALIBRATION = 5_000  # messages drained at full speed before the faults
BATCH = 1_000  # per enqueue transaction while the calibration backlog is written
_LOG_LINE = re.compile(r"^(\S+Z) \w+ (broker\.connected|broker\.lost)\b")


def calibration_keys(messages: int, cold: list[str], hot: list[str], hot_share: float) -> list[str]:
    """The key of each calibration message: `hot_share` of them go round the hot keys, the rest
    round the cold ones, interleaved as the writers interleave them."""
    keys: list[str] = []
    for n in range(messages):
        on_hot = bool(hot) and int((n + 1) * hot_share) > int(n * hot_share)
        pool = hot if on_hot else cold
        keys.append(pool[n % len(pool)])
    return keys


def write_calibration(
    engine: Engine, exchange: str, checker: DeliveryChecker, keys: list[str]
) -> set[str]:
    """Commit one message for each of `keys`, in order (checked like the rest); their ids."""
    ids: set[str] = set()
    for start in range(0, len(keys), BATCH):
        written: list[tuple[str, str]] = []
        with engine.begin() as conn:
            for n, key in enumerate(keys[start : start + BATCH], start):
                enqueued = outbox.enqueue(
                    conn, exchange=exchange, routing_key="chaos", payload={"calibration": n},
                    key=key,
                )  # fmt: skip
                written.append((str(enqueued), key))
        for message_id, key in written:  # committed, in commit order
            checker.committed(message_id, key)
            ids.add(message_id)
    return ids


@dataclass(frozen=True)
class Speed:
    """The calibration's rates, in messages a second, from its first arrival to its last."""

    backlog: float  # its own messages: a backlog of the run's shape, at full speed
    delivered: float  # every message that arrived meanwhile, the writers' too


def full_speed(checker: DeliveryChecker, ids: set[str], timeout: float) -> Speed | None:
    """Wait until every calibration message arrived; the rates at which they, and all messages,
    arrived while they drained, or None if they did not all arrive within `timeout`."""
    deadline = time.monotonic() + timeout
    while not checker.all_received(ids):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    times = checker.arrival_times(ids)
    first, last = min(times), max(times)
    if last <= first:
        return None
    return Speed((len(times) - 1) / (last - first), _delivered(checker, first, last))


def _delivered(checker: DeliveryChecker, first: float, last: float) -> float:
    """Every message that arrived from `first` to `last` (monotonic clock), a second."""
    every = checker.arrival_times(checker.committed_ids())
    return (sum(1 for t in every if first <= t <= last) - 1) / (last - first)


@dataclass(frozen=True)
class Return:
    """The moment the fault ended, and what it left waiting."""

    at: float  # time.monotonic()
    wall: float  # time.time(), to place the relay's log lines
    held_back: frozenset[str]  # committed by then
    backlog: int  # of those, not arrived yet


def returned(checker: DeliveryChecker) -> Return:
    at, wall = time.monotonic(), time.time()
    held_back = frozenset(checker.committed_ids())
    return Return(at, wall, held_back, checker.waiting(held_back))


@dataclass(frozen=True)
class Timeline:
    """Seconds from the fault's end to each step of the recovery (None: did not happen). A step
    may come before it (negative): the broker can take connections again a moment before
    `rabbitmqctl await_startup` returns."""

    backlog: int
    speed: Speed | None  # the calibration's (None: not calibrated)
    relay_connected: float | None  # the relay's last broker.connected, if it ever lost one
    lost_after: int  # broker.lost lines after the return (failed reconnects)
    first_arrival: float | None  # of a held-back message, after the return
    drained: float | None  # the last held-back message arrived
    consumer_connects: int  # the harness consumer's connections during the run
    consumer_connected: float | None  # its last connection, if it had to connect again
    # Every message that arrived from the first held-back arrival to the last, a second: the
    # writers' go on arriving beside the backlog, as during the calibration (compare with rate).
    rate_after: float | None = None

    @property
    def full_speed_s(self) -> float | None:
        """The backlog's drain time at full speed."""
        return None if self.speed is None else self.backlog / self.speed.backlog


def timeline(
    back: Return,
    checker: DeliveryChecker,
    speed: Speed | None,
    relay_log: Path,
    consumer_connects: list[float],
) -> Timeline:
    """The steps, from the relay's log (its clock: UTC wall time) and the harness's own
    monotonic clock (`consumer_connects`: when the consumer connected)."""
    connected: float | None = None
    ever_lost = False
    lost = 0
    for line in relay_log.read_text(errors="replace").splitlines():
        match = _LOG_LINE.match(line)
        if match is None:
            continue
        stamp = dt.datetime.fromisoformat(match.group(1).replace("Z", "+00:00")).timestamp()
        if match.group(2) == "broker.lost":
            ever_lost = True
            if stamp >= back.wall:
                lost += 1
        elif ever_lost:
            connected = stamp - back.wall
    times = [t - back.at for t in checker.arrival_times(back.held_back) if t >= back.at]
    again = consumer_connects[-1] - back.at if len(consumer_connects) > 1 else None
    rate_after = None
    if len(times) > 1 and max(times) > min(times):
        rate_after = _delivered(checker, back.at + min(times), back.at + max(times))
    return Timeline(
        backlog=back.backlog,
        speed=speed,
        relay_connected=connected,
        lost_after=lost,
        first_arrival=min(times) if times else None,
        drained=max(times) if times else None,
        consumer_connects=len(consumer_connects),
        consumer_connected=again,
        rate_after=rate_after,
    )


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f} s"


def note(fault: str, t: Timeline) -> str:
    """The recovery's steps, for the notes under the table."""
    speed = "-"
    if t.speed is not None:
        speed = (f"{t.speed.backlog:,.0f} msg/s for a backlog of this shape "
                 f"({t.speed.delivered:,.0f} msg/s delivered in all)")  # fmt: skip
    full = "-" if t.full_speed_s is None else f"{t.full_speed_s:.1f} s"
    took = None if t.first_arrival is None or t.drained is None else t.drained - t.first_arrival
    drained = f" ({t.backlog / took:,.0f} msg/s" if took and t.backlog > 1 else ""
    if drained and t.rate_after is not None:
        drained += f"; {t.rate_after:,.0f} msg/s with the writers' messages"
    drained += ")" if drained else ""
    return (
        f"{fault}: at the fault's end {t.backlog:,} messages waited; relay reconnected "
        f"{_s(t.relay_connected)} ({t.lost_after} failed attempts after it), first arrival "
        f"{_s(t.first_arrival)}, last {_s(t.drained)}{drained}; full speed {speed} (drain "
        f"{full}); the harness consumer connected {t.consumer_connects}x"
        + (f", last {_s(t.consumer_connected)}" if t.consumer_connected is not None else "")
    )
