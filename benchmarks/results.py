"""What the phases found: a row per figure, one value per run (the report shows the median), and
how a drain's result fills its row."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from benchmarks import machine
from benchmarks.drain import DrainResult
from benchmarks.targets import WINDOWS

FIGURES = {
    "ceiling": "raw pika async-confirm ceiling",
    "in-process": "relay drain, in-process",
    "subprocess": "relay drain, subprocess `outbox-relay run`",
    "one-at-a-time": "one confirm at a time (the usual outbox)",
    "prepared": "relay drain, in-process, no prepared statements",
    "prepared-on": "relay drain, in-process, prepared statements",
    "unsigned": "relay drain, in-process, unsigned (beside signed)",
    "signed": "relay drain, in-process, signed (Standard Webhooks, one secret)",
    "signed-ceiling": "raw pika ceiling, the signed messages' headers",
    "store": "diagnostic: store only, claim+mark, no broker",
    "publisher": "diagnostic: relay.Publisher only, no DB",
    "enqueue": "outbox.enqueue in a one-row transaction",
    "enqueue-plain": "outbox.enqueue beside a plain INSERT of its columns",
    "enqueue-many": "outbox.enqueue_many beside as many enqueue calls",
    "wakeup": "commit-to-confirm, polling alone",
    "hot-key": "hot keys",
    "hot-unkeyed": "hot-key baseline: the same backlog unkeyed",
    "hot-1": "one hot key",
    "hot-4": "four hot keys",
    "hot-serial": "raw pika, one confirm at a time",
    "hot-serial-4": "raw pika, four unconfirmed",
    "hot-floor-1": "floor relay (bound), one hot key",
    "hot-floor-4": "floor relay (bound), four hot keys",
    "hot-publisher": "diagnostic: relay Publisher alone, one key's chain",
    "hot-publisher-4": "diagnostic: relay Publisher alone, four keys' chains",
    "neighbour-alone": "healthy exchange alone (beside nothing broken)",
    "neighbour": "healthy exchange beside a broken one",
    "many-one": "relay drain, subprocess `--db URL`, one database (many phase)",
    "many": "relay drain, subprocess `--db-file`, the same over many databases",
    "many-alone": "relay drain, `--db-file`, one database's backlog, the others idle",
    "many-beside": "relay drain, `--db-file`, one database's backlog, a trickle into the others",
    "many-trickle-idle": "the trickle's commit-to-consumer p50 ms, every database idle",
    "many-trickle": "the trickle's commit-to-consumer p50 ms, beside one database's backlog",
    **{f"window-{w}": f"raw pika ceiling, window {w}" for w in WINDOWS},
    "window-need": "the window the broker needs",
    "kill": "SIGKILL mid-drain, duplicates",
    "kill-recovery": "SIGKILL mid-drain, recovery seconds",
    "steady-kill": "SIGKILL at 1,000 msg/s, duplicates",
    "small": "relay drain, in-process, 80-byte bodies",
    "small-ceiling": "raw pika async-confirm ceiling, 80-byte bodies",
    "small-floor": "floor relay (bound), 80-byte bodies",
    "logical-ceiling": "raw pika async-confirm ceiling, 80-byte bodies (logical phase)",
    "logical-table": "relay drain from the table, in-process, 80-byte bodies (logical phase)",
    "logical": "relay drain from the log (--capture logical), in-process, 80-byte bodies",
    "logical-single": "diagnostic: the same from the log, one message a transaction",
    "logical-enqueue": "one writer: a message emitted into the log, over no message",
    "logical-enqueue-bare": "one writer: the same emit bare (no library), over no message",
    "logical-enqueue-nothing": "one writer: a statement writing nothing (SELECT 1), over none",
    "logical-enqueue-table": "one writer: a message in the table (outbox.enqueue), over none",
    "logical-latency": "commit-to-consumer p50 ms from the log",
    "logical-latency-p99": "commit-to-consumer p99 ms from the log",
    "logical-latency-table": "commit-to-consumer p50 ms from the table",
    "logical-latency-table-p99": "commit-to-consumer p99 ms from the table",
    "logical-floor": "the broker's floor p50 ms (raw pika publish to consumer)",
    "logical-floor-p99": "the broker's floor p99 ms (raw pika publish to consumer)",
}
# Figures shown as a ratio to another figure of the same run rather than to the ceiling:
# (that figure, its name in the table's last column).
BASES = {
    "hot-1": ("hot-unkeyed", "unkeyed"),
    "hot-4": ("hot-unkeyed", "unkeyed"),
    "hot-serial": ("hot-unkeyed", "unkeyed"),
    "hot-serial-4": ("hot-unkeyed", "unkeyed"),
    "hot-floor-1": ("hot-unkeyed", "unkeyed"),
    "hot-floor-4": ("hot-unkeyed", "unkeyed"),
    "hot-publisher": ("hot-unkeyed", "unkeyed"),
    "hot-publisher-4": ("hot-unkeyed", "unkeyed"),
    "neighbour": ("neighbour-alone", "alone"),
    "small": ("small-ceiling", "80-byte ceiling"),
    "small-floor": ("small-ceiling", "80-byte ceiling"),
    "logical-table": ("logical-ceiling", "80-byte ceiling"),
    "logical": ("logical-ceiling", "80-byte ceiling"),
    "logical-single": ("logical-ceiling", "80-byte ceiling"),
}
# Rows whose values are not rates: left out of the table, reported below it.
NOT_RATES = (
    "enqueue",
    "enqueue-plain",
    "enqueue-many",
    "wakeup",
    "window-need",
    "kill",
    "kill-recovery",
    "steady-kill",
    "logical-enqueue",
    "logical-enqueue-bare",
    "logical-enqueue-nothing",
    "logical-enqueue-table",
    "logical-latency",
    "logical-latency-p99",
    "logical-latency-table",
    "logical-latency-table-p99",
    "logical-floor",
    "logical-floor-p99",
    "many-trickle-idle",
    "many-trickle",
)
DIAG = ("store", "publisher", "hot-publisher", "hot-publisher-4", "logical-single")


@dataclass
class Row:
    figure: str
    rates: list[float] = field(default_factory=list)  # or what NOT_RATES rows hold, per run
    extras: list[str] = field(default_factory=list)  # one per run, beside rates
    others: list[float] = field(default_factory=list)  # cores used by other processes, per run
    work_us: list[float] = field(default_factory=list)  # relay + database CPU us/msg, per run
    relay_us: list[float] = field(default_factory=list)  # relay CPU us/msg, per run
    database_us: list[float] = field(default_factory=list)  # database CPU us/msg, per run
    diagnostic: bool = False
    error: str | None = None

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def extra(self) -> str:
        """The details of the median run (the lower middle one of an even count)."""
        if not self.extras:
            return ""
        order = sorted(range(len(self.rates)), key=lambda i: self.rates[i])
        return self.extras[order[(len(order) - 1) // 2]]


Results = dict[str, Row]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def settle() -> None:
    """Let the machine go quiet before a phase (machine.quiesce); warn if it does not."""
    if not machine.quiesce():
        say(f"warning: the machine stayed busy (over {machine.QUIET} cores) for 15 s")


def fmt_rate(rate: float) -> str:
    return f"{rate:,.0f} msg/s"


def spread(rates: Sequence[float]) -> str:
    if len(rates) < 2:
        return ""
    return f" (min {min(rates):,.0f}, max {max(rates):,.0f})"


def row_of(results: Results, key: str) -> Row:
    return results.setdefault(key, Row(FIGURES[key], diagnostic=key in DIAG))


def add(results: Results, key: str, rate: float) -> Row:
    found = row_of(results, key)
    found.rates.append(rate)
    return found


def add_drain(results: Results, key: str, r: DrainResult) -> None:
    found = add(results, key, r.rate)
    parts = [f"{r.seconds:.2f} s"]
    if r.startup_seconds is not None:
        parts.append(f"startup {r.startup_seconds:.2f} s")
    if r.peak_rss_bytes is not None:
        parts.append(f"peak RSS {r.peak_rss_bytes / 2**20:.0f} MiB")
        rss = results.setdefault(f"{key}-rss", Row("  peak RSS of the relay process"))
        rss.rates.append(r.peak_rss_bytes / 2**20)
    parts.extend(r.notes)
    if r.cpu is not None:
        parts.append(r.cpu.describe(r.messages))
        found.others.append(r.cpu.cores("other"))
        if r.messages:
            relay = r.cpu.used.get("relay", 0.0)
            found.relay_us.append(relay / r.messages * 1e6)
            database = r.cpu.used.get("database", 0.0)
            found.work_us.append((relay + database) / r.messages * 1e6)
            found.database_us.append(database / r.messages * 1e6)
    extra = "; ".join(parts)
    found.extras.append(extra)
    say(f"  {fmt_rate(r.rate)} ({extra})")


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
