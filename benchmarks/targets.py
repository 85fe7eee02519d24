"""The targets the benchmark judges, as pure functions of its figures: K, the window the broker
needs to publish at full speed, and one line per target saying whether it was met."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Unconfirmed messages at most, for the raw pika ceiling of the window-need phase.
WINDOWS = (32, 64, 128, 256, 512, 1024, 2048)
# A window is enough once its rate is this share of the largest window's (the broker's full
# speed): beyond it a larger window buys little rate and costs duplicates after a crash.
FULL_SPEED = 0.9
DRAIN = 0.8  # the default drain over the ceiling, at least
KILL_PER_K = 2  # duplicates after a SIGKILL mid-drain, at most, per message of K
KILL_RECOVERY_S = 6.0  # a SIGKILL mid-drain's restart to the last message, at most
STEADY_KILL = 100  # duplicates after a SIGKILL at a steady 1,000 msg/s, at most
# Hot keys' drain over raw pika with as many messages unconfirmed as keys (one key: one confirm at
# a time), at least: strict per-key order allows no more in flight per key.
HOT_BOUND = 0.9
SMALL_DRAIN = 0.8  # the 80-byte drain over raw pika's ceiling on the same messages, at least
# The relay process's CPU per 80-byte message over raw pika's for the same messages, at most
# (20 us of the relay's against 12 of raw pika's).
SMALL_CPU = 20 / 12
# A healthy exchange's drain beside a broken one over the same drain alone, at least. A broken
# neighbour costs the healthy flow the failures before its circuit opens and the claims passing
# its rows by; a large factor means the circuit does not isolate it (claims stuck behind its rows,
# each of them failing again). Loose on purpose: the share of rows that are broken (one in six)
# and the machine's load move the ratio, and a miss has to mean the isolation, not the noise.
BESIDE_BROKEN = 0.3
# One writer's transaction with one enqueue over the same transaction with a plain INSERT of the
# same columns into an unindexed table, at least (benchmarks/insert_cost.py).
ENQUEUE_PLAIN = 0.9
MANY_MESSAGES = 10_000  # messages in the one transaction of the enqueue_many comparison
MANY_SPEEDUP = 5.0  # their enqueue calls' time over one enqueue_many's, at least
# Logical capture (benchmarks/logical.py), on 80-byte bodies: the drain from the log over raw
# pika's ceiling on the same messages, at least; the database's CPU per message relayed from the
# log (the walsender included) over the table mode's for the same backlog, at most; one writer's
# transaction with a message emitted into the log over the same without it, at least; and the
# log's commit-to-consumer p50 over the broker's own floor, at most this many ms more.
LOGICAL_DRAIN = 0.8
LOGICAL_DATABASE = 1 / 3
LOGICAL_ENQUEUE = 0.95
LOGICAL_LATENCY_MS = 1.0


def window_need(rates: Mapping[int, float]) -> int | None:
    """K: the smallest window whose rate is at least FULL_SPEED of the largest window's rate,
    or None without a rate at the largest window."""
    if not rates:
        return None
    full = rates[max(rates)]
    if full <= 0:
        return None
    return min(w for w, rate in rates.items() if rate >= FULL_SPEED * full)


def window_line(rates: Mapping[int, float]) -> str | None:
    """K and every window's rate, in one line; None if no window was measured."""
    k = window_need(rates)
    if k is None:
        return None
    each = ", ".join(f"{w}: {rates[w]:,.0f}" for w in sorted(rates))
    return (
        f"window need K = {k}: the smallest window at >= {FULL_SPEED:.1f}x the rate at "
        f"{max(rates)} (raw pika msg/s by window: {each})"
    )


def verdict(target: str, met: bool | None, detail: str) -> str:
    """One target's line: met, NOT met, or cannot be judged (None)."""
    word = "cannot be judged" if met is None else ("met" if met else "NOT met")
    return f"target {target}: {word} ({detail})"


@dataclass(frozen=True, slots=True)
class LogicalFigures:
    """The logical phase's medians; None where it did not run or failed."""

    drain: float | None = None  # from the log, msg/s
    ceiling: float | None = None  # raw pika on the same 80-byte bodies
    table: float | None = None  # the same backlog from the table
    single: float | None = None  # diagnostic: a backlog of one message a transaction, from the log
    single_database_us: float | None = None  # its database CPU per message
    relay_us: float | None = None  # the relay process's CPU per message, from the log
    table_relay_us: float | None = None  # and from the table
    ceiling_us: float | None = None  # raw pika's
    database_us: float | None = None  # the database's CPU per message, from the log
    table_database_us: float | None = None  # and from the table
    enqueue: float | None = None  # commits/s with a message in the log over none (a ratio)
    enqueue_bare: float | None = None  # with the same emit sent bare, over none
    enqueue_nothing: float | None = None  # with a statement that writes nothing, over none
    enqueue_table: float | None = None  # with a message in the table, over none
    p50_ms: float | None = None  # commit-to-consumer from the log
    p99_ms: float | None = None
    floor_p50_ms: float | None = None  # raw pika's publish-to-consumer
    floor_p99_ms: float | None = None
    table_p50_ms: float | None = None  # commit-to-consumer from the table
    table_p99_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Figures:
    """The medians the targets are judged on; None where a phase did not run or failed."""

    ceiling: float | None = None
    drain: float | None = None
    drain_name: str = "in-process"
    window_rates: Mapping[int, float] = field(default_factory=dict)
    kill_duplicates: float | None = None
    kill_recovery_s: float | None = None
    steady_duplicates: float | None = None
    hot_1: float | None = None
    hot_serial: float | None = None  # raw pika, one confirm at a time
    hot_4: float | None = None
    hot_serial_4: float | None = None  # raw pika, four unconfirmed
    hot_floor_1: float | None = None  # the floor relay on one key (benchmarks/floor.py)
    hot_floor_4: float | None = None  # and on four
    neighbour: float | None = None  # the healthy exchange beside a broken one
    neighbour_alone: float | None = None  # the same drain with nothing broken beside it
    small: float | None = None
    small_ceiling: float | None = None
    small_relay_us: float | None = None
    small_ceiling_us: float | None = None  # raw pika's CPU per 80-byte message
    small_database_us: float | None = None
    floor: float | None = None  # the floor relay's 80-byte drain (benchmarks/floor.py)
    floor_us: float | None = None  # its CPU per message
    floor_database_us: float | None = None
    relay_us: float | None = None  # the relay's CPU per message of the 1 KB in-process drain
    enqueue_plain: float | None = None  # enqueue's commits/s over a plain INSERT's (a ratio)
    enqueue_many: float | None = None  # enqueue calls' seconds over enqueue_many's (a ratio)
    logical: LogicalFigures = field(default_factory=LogicalFigures)


def _rate_pair(figure: float, bound: float) -> str:
    return f"{figure:,.0f} vs {bound:,.0f} msg/s: {figure / bound:.2f}x"


def _at_least(
    target: str, figure: float | None, bound: float | None, share: float, name: str = ""
) -> list[str]:
    """The line of a rate target (`name` leads the detail), or none if the rate is unknown."""
    if figure is None:
        return []
    if not bound:
        return [verdict(target, None, f"{name}{figure:,.0f} msg/s; its bound was not measured")]
    return [verdict(target, figure >= share * bound, name + _rate_pair(figure, bound))]


def target_lines(f: Figures) -> list[str]:
    """A line per target whose figure was measured, then the 80-byte figures (no target)."""
    name = f"{f.drain_name}: "
    lines = _at_least(f"relay >= {DRAIN:.1f}x ceiling", f.drain, f.ceiling, DRAIN, name)
    if f.kill_duplicates is not None:
        k = window_need(f.window_rates)
        target = f"kill mid-drain duplicates <= {KILL_PER_K}x K"
        if k is None:
            why = "K was not measured: run the window-need phase with it"
            lines.append(verdict(target, None, f"{f.kill_duplicates:.0f} duplicates; {why}"))
        else:
            bound = KILL_PER_K * k
            met = f.kill_duplicates <= bound
            lines.append(verdict(f"{target} ({bound})", met, f"{f.kill_duplicates:.0f} vs {bound}"))
    if f.kill_recovery_s is not None:
        met = f.kill_recovery_s <= KILL_RECOVERY_S
        detail = f"{f.kill_recovery_s:.1f} s vs {KILL_RECOVERY_S:.0f} s"
        lines.append(verdict(f"kill mid-drain recovery <= {KILL_RECOVERY_S:.0f} s", met, detail))
    if f.steady_duplicates is not None:
        met = f.steady_duplicates <= STEADY_KILL
        detail = f"{f.steady_duplicates:.0f} vs {STEADY_KILL}"
        lines.append(verdict(f"steady kill duplicates <= {STEADY_KILL}", met, detail))
    raw = f"{HOT_BOUND:.1f}x raw pika with"
    lines += _at_least(f"one hot key >= {raw} one unconfirmed", f.hot_1, f.hot_serial, HOT_BOUND)
    if f.hot_floor_1 is not None and f.hot_serial:
        pair = _rate_pair(f.hot_floor_1, f.hot_serial)
        lines.append(f"  bound: the floor relay on one key, {pair}")
    lines += _at_least(
        f"four hot keys >= {raw} four unconfirmed", f.hot_4, f.hot_serial_4, HOT_BOUND
    )
    if f.hot_floor_4 is not None and f.hot_serial_4:
        pair = _rate_pair(f.hot_floor_4, f.hot_serial_4)
        lines.append(f"  bound: the floor relay on four keys, {pair}")
    lines += _at_least(
        f"healthy exchange beside a broken one >= {BESIDE_BROKEN:.1f}x alone",
        f.neighbour,
        f.neighbour_alone,
        BESIDE_BROKEN,
    )
    lines += _at_least(
        f"80-byte drain >= {SMALL_DRAIN:.1f}x its ceiling", f.small, f.small_ceiling, SMALL_DRAIN
    )
    if f.floor is not None and f.small_ceiling:
        pair = _rate_pair(f.floor, f.small_ceiling)
        lines.append(f"  bound: the floor relay at the relay's window ceiling, {pair}")
    if f.small_relay_us is not None:
        target = f"relay CPU per 80-byte message <= {SMALL_CPU:.2f}x raw pika's"
        if not f.small_ceiling_us:
            detail = f"{f.small_relay_us:.0f} us; raw pika's was not measured"
            lines.append(verdict(target, None, detail))
        else:
            ratio = f.small_relay_us / f.small_ceiling_us
            detail = f"{f.small_relay_us:.0f} vs {f.small_ceiling_us:.0f} us: {ratio:.2f}x"
            lines.append(verdict(target, ratio <= SMALL_CPU, detail))
        if f.floor_us is not None and f.small_ceiling_us:
            ratio = f.floor_us / f.small_ceiling_us
            lines.append(
                f"  beside: the floor relay on pika's encoder, {f.floor_us:.0f} us: "
                f"{ratio:.2f}x raw pika's"
            )
    if f.small_database_us is not None:
        beside = f" (1 KB bodies: relay {f.relay_us:.0f} us)" if f.relay_us is not None else ""
        floor = (
            f"; the floor relay's {f.floor_database_us:.0f}"
            if f.floor_database_us is not None
            else ""
        )
        lines.append(
            f"80-byte bodies: database CPU {f.small_database_us:.0f} us/msg{floor}{beside}"
        )
    return lines + _enqueue_lines(f) + logical_lines(f.logical)


def _enqueue_lines(f: Figures) -> list[str]:
    """The enqueue phase's targets: ratios already (medians of interleaved rounds' ratios)."""
    lines = []
    if f.enqueue_plain is not None:
        target = (
            f"one writer's commits with one enqueue >= {ENQUEUE_PLAIN:.1f}x with a plain INSERT "
            "of its columns (unindexed table)"
        )
        met = f.enqueue_plain >= ENQUEUE_PLAIN
        lines.append(verdict(target, met, f"{f.enqueue_plain:.2f}x"))
    if f.enqueue_many is not None:
        target = (
            f"enqueue_many of {MANY_MESSAGES:,} >= {MANY_SPEEDUP:.0f}x {MANY_MESSAGES:,} "
            "enqueue calls"
        )
        met = f.enqueue_many >= MANY_SPEEDUP
        lines.append(verdict(target, met, f"{f.enqueue_many:.1f}x"))
    return lines


def logical_lines(f: LogicalFigures) -> list[str]:
    """The logical phase's targets, each followed by what the table mode (and the broker) did
    on the same messages in the same run."""
    lines = _at_least(
        f"drain from the log >= {LOGICAL_DRAIN:.1f}x its ceiling (80-byte bodies)",
        f.drain,
        f.ceiling,
        LOGICAL_DRAIN,
        "log: ",
    )
    if lines and f.ceiling:
        if f.table is not None:
            pair = _rate_pair(f.table, f.ceiling)
            lines.append(f"  beside: the table's drain of the same backlog, {pair}")
        if f.single is not None:
            pair = _rate_pair(f.single, f.ceiling)
            lines.append(f"  beside: from the log, one message a transaction, {pair}")
    if f.database_us is not None:
        target = (
            f"database CPU per message from the log <= {LOGICAL_DATABASE:.2f}x the table's "
            "(walsender included)"
        )
        if not f.table_database_us:
            detail = f"{f.database_us:.1f} us; the table's was not measured"
            lines.append(verdict(target, None, detail))
        else:
            ratio = f.database_us / f.table_database_us
            detail = f"{f.database_us:.1f} vs {f.table_database_us:.1f} us: {ratio:.2f}x"
            lines.append(verdict(target, ratio <= LOGICAL_DATABASE, detail))
            if f.single_database_us is not None:
                ratio = f.single_database_us / f.table_database_us
                lines.append(
                    f"  beside: one message a transaction, {f.single_database_us:.1f} us: "
                    f"{ratio:.2f}x the table's"
                )
    if f.relay_us is not None:
        each = [f"from the log {f.relay_us:.0f} us"]
        if f.table_relay_us is not None:
            each.append(f"from the table {f.table_relay_us:.0f} us")
        if f.ceiling_us:
            each.append(f"raw pika {f.ceiling_us:.0f} us")
            ratios = [f"{f.relay_us / f.ceiling_us:.2f}x"]
            if f.table_relay_us is not None:
                ratios.append(f"{f.table_relay_us / f.ceiling_us:.2f}x")
            each[-1] += f" ({' and '.join(ratios)} raw pika's)"
        lines.append(f"  beside: the relay's CPU per message, {', '.join(each)}")
    if f.enqueue is not None:
        target = (
            f"one writer's commits with a message in the log >= {LOGICAL_ENQUEUE:.2f}x without it"
        )
        lines.append(verdict(target, f.enqueue >= LOGICAL_ENQUEUE, f"{f.enqueue:.2f}x"))
        beside = []
        if f.enqueue_bare is not None:
            beside.append(f"the same emit bare (no library) {f.enqueue_bare:.2f}x")
        if f.enqueue_nothing is not None:
            beside.append(f"a statement that writes nothing (SELECT 1) {f.enqueue_nothing:.2f}x")
        if f.enqueue_table is not None:
            beside.append(f"a message in the table (outbox.enqueue) {f.enqueue_table:.2f}x")
        if beside:
            lines.append(f"  beside: {'; '.join(beside)}")
    if f.p50_ms is not None:
        target = (
            f"commit-to-consumer p50 from the log <= the broker's floor + "
            f"{LOGICAL_LATENCY_MS:.0f} ms"
        )
        if f.floor_p50_ms is None:
            detail = f"{f.p50_ms:.2f} ms; the floor was not measured"
            lines.append(verdict(target, None, detail))
        else:
            over = f.p50_ms - f.floor_p50_ms
            detail = f"{f.p50_ms:.2f} vs {f.floor_p50_ms:.2f} ms: {over:+.2f} ms"
            lines.append(verdict(target, over <= LOGICAL_LATENCY_MS, detail))
        beside = []
        if f.p99_ms is not None and f.floor_p99_ms is not None:
            beside.append(
                f"p99 from the log {f.p99_ms:.2f} ms, the floor's {f.floor_p99_ms:.2f} ms"
            )
        if f.table_p50_ms is not None and f.table_p99_ms is not None:
            beside.append(
                f"from the table p50 {f.table_p50_ms:.2f} ms, p99 {f.table_p99_ms:.2f} ms"
            )
        if beside:
            lines.append(f"  beside: {'; '.join(beside)}")
    return lines
