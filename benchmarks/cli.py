"""`python -m benchmarks`: the confirmed-publish ceiling, the relay's drain rate, and their ratio.

Phases, in order (choose with --phases):
  ceiling      raw pika SelectConnection with confirms: the bound
  in-process   relay.Relay + relay.Publisher + the SQL store, in this process
  subprocess   `outbox-relay --db URL run`, as operators run it (also its peak RSS and CPU)
  one-at-a-time  for comparison: what most outbox libraries do, each message published and its
               confirm awaited before it is marked (BlockingConnection; 20,000 messages)
  prepared     the in-process drain twice, without server-side prepared statements (the relay's
               default, which PgBouncer's transaction mode needs) and with them (psycopg's
               default, `?prepare_threshold=5`): what turning them off costs on a direct
               connection
  signed       the in-process drain twice, unsigned and signed (OUTBOX_SIGNING_KEYS, one
               secret): what signing costs (target: the signed drain within 5%)
  store        diagnostic: the store's claim + mark_published alone, nothing published
  publisher    diagnostic: relay.Publisher alone, fed pre-built messages, no database
  enqueue      what outbox.enqueue costs a one-row transaction (commits/s with and without it)
  wakeup       commit-to-confirm with polling alone (no LISTEN, as on MySQL): single messages
               into an idle relay, and a steady 100 msg/s
  hot-key      a backlog on one key, and on four, beside the same backlog unkeyed (in-process,
               HOT_KEY messages each), and raw pika publishing the same messages one confirm at
               a time: the bound for any relay that keeps a key's order whatever the broker does

--db names the server: PostgreSQL (the default), or MySQL/MariaDB, e.g.
`--db mariadb://root@127.0.0.1:3306/test` (every phase but `prepared`, which is psycopg's).
The queue is purged after every phase; the database and the queue are removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
from sqlalchemy.engine import make_url

from benchmarks.ceiling import CeilingResult, measure_ceiling, measure_serial
from benchmarks.drain import (
    DrainResult,
    drain_in_process,
    drain_one_at_a_time,
    drain_store_only,
    drain_subprocess,
    publish_only,
)
from benchmarks.fixtures import (
    ROUTING_KEY,
    BenchBroker,
    BenchDatabase,
    encode,
    make_payload,
    message_properties,
    names,
)
from benchmarks.insert_cost import measure_insert_cost
from benchmarks.wakeup import measure_wakeup
from outbox.signing import new_secret
from relay.core.signing import keys_text
from relay.loop import chains
from relay.ports import Outgoing

PHASES = (
    "ceiling",
    "in-process",
    "subprocess",
    "one-at-a-time",
    "prepared",
    "signed",
    "store",
    "publisher",
    "enqueue",
    "wakeup",
    "hot-key",
)
POSTGRESQL_ONLY = ("prepared",)
# psycopg's own default: a statement is prepared on the server at its fifth run.
PREPARED_ON = "5"
ONE_AT_A_TIME = 20_000  # messages the slow comparison drains (its rate is what counts)
HOT_KEY = 20_000  # messages each hot-key drain takes (a key drains at a few thousand a second)
HOT_TARGET, HOT_GOAL = 0.2, 0.5  # one key's drain rate over the unkeyed drain's: required, wanted
DEFAULT_DB = os.environ.get("BENCH_DB_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
DEFAULT_AMQP = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
TARGET = 0.8
SIGNED_TARGET = 0.95  # signing may cost at most 5% of the drain rate
NOISE = 0.2  # cores used by other processes during a phase above which its figure is suspect


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Raw pika confirmed-publish ceiling versus the relay's drain rate.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument("--messages", type=int, default=100_000, help="messages per phase (100000)")
    p.add_argument("--payload-bytes", type=int, default=1024, help="JSON body size (1024)")
    p.add_argument("--quick", action="store_true", help="smoke run: 5000 messages")
    p.add_argument(
        "--window", type=int, default=1000, help="ceiling: unconfirmed messages at most (1000)"
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="runs of each phase; the median is reported (1)"
    )
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (all)",
    )
    p.add_argument("--db", default=DEFAULT_DB, help="admin database URL (env BENCH_DB_URL)")
    p.add_argument("--amqp", default=DEFAULT_AMQP, help="AMQP URL (env BENCH_AMQP_URL)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per phase at most (600)")
    p.add_argument("--json", type=Path, help="also write the results to this file as JSON")
    p.add_argument(
        "--markdown",
        type=Path,
        metavar="FILE",
        help="also write the report to FILE as Markdown, dated (the docs' performance page)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="cProfile both threads of the in-process relay into DIR/*.prof (slows it down)",
    )
    return p


@dataclass
class Row:
    figure: str
    rates: list[float] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)  # one per run, beside rates
    others: list[float] = field(default_factory=list)  # cores used by other processes, per run
    work_us: list[float] = field(default_factory=list)  # relay + database CPU us/msg, per run
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


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _fmt_rate(rate: float) -> str:
    return f"{rate:,.0f} msg/s"


def _spread(rates: Sequence[float]) -> str:
    if len(rates) < 2:
        return ""
    return f" (min {min(rates):,.0f}, max {max(rates):,.0f})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.messages = 5000
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown or args.messages < 1 or args.payload_bytes < 1 or args.repeat < 1:
        _say(f"error: bad arguments (unknown phases: {unknown})" if unknown else "bad arguments")
        return 2
    exe = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
    command = shlex.join([exe, "-m", "benchmarks", *sys.argv[1:]])
    base = names()
    db = BenchDatabase(args.db, base)
    if db.mysql:
        refused = [p for p in phases if p in POSTGRESQL_ONLY]
        if refused and args.phases != ",".join(PHASES):
            _say(f"error: {', '.join(refused)}: PostgreSQL only")
            return 2
        phases = [p for p in phases if p not in POSTGRESQL_ONLY]
    broker = BenchBroker(args.amqp, exchange=base.replace("_", "-"), queue=base.replace("_", "-"))
    results: dict[str, Row] = {}
    info: dict[str, str] = {}
    busy = _busy_cores()
    if busy is not None:
        info["busy_before"] = f"{busy:.2f}"
        if busy > 0.2:
            _say(f"warning: {busy:.1f} cores were busy before the run: figures will be low")
    try:
        info["rabbitmq"] = broker.declare()
        info["database"] = f"{db.product} {db.server_version()}"
        _run(args, phases, db, broker, results)
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except Exception as exc:
        _say(f"error: {exc!r}")
        return 1
    finally:
        _cleanup(db, broker)
    _report(args, command, info, results)
    return 1 if any(row.error for row in results.values()) else 0


def _run(
    args: argparse.Namespace,
    phases: list[str],
    db: BenchDatabase,
    broker: BenchBroker,
    results: dict[str, Row],
) -> None:
    n = args.messages
    payloads = [encode(make_payload(i, args.payload_bytes)) for i in range(n)]
    now = time.time()

    needs_backlog = {
        "in-process", "subprocess", "one-at-a-time", "prepared", "signed", "store", "hot-key"
    }  # fmt: skip
    if (needs_backlog | {"enqueue", "wakeup"}) & set(phases):
        db.create()
        _say(f"loading {n} messages through outbox.enqueue ...")
        seconds = db.load(n, args.payload_bytes, broker.exchange)
        _say(f"  loaded in {seconds:.1f} s ({n / seconds:,.0f} rows/s, not part of any figure)")

    for round_ in range(args.repeat):
        tag = f" [{round_ + 1}/{args.repeat}]" if args.repeat > 1 else ""
        for phase in phases:
            _quiesce()
            try:
                _phase(phase, tag, args, db, broker, payloads, now, results)
            except Exception as exc:
                # One broken phase (the relay code changes under this harness) must not hide
                # the others: record it, clean the queue, go on.
                _say(f"  FAILED: {exc}")
                row = results.setdefault(phase, Row(FIGURES[phase], diagnostic=phase in DIAG))
                row.error = str(exc).splitlines()[0][:200]
                with contextlib.suppress(Exception):
                    broker.purge()


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
    "wakeup": "commit-to-confirm, polling alone",
    "hot-key": "hot keys",
    "hot-unkeyed": "hot-key baseline: the same backlog unkeyed",
    "hot-1": "one hot key",
    "hot-4": "four hot keys",
    "hot-serial": "raw pika, one confirm at a time",
    "hot-publisher": "relay Publisher alone, one key's chain",
}
# The hot-key figures, and what each is a ratio to (the table's last column says which).
HOT_BASE = {
    "hot-1": "hot-unkeyed",
    "hot-4": "hot-unkeyed",
    "hot-serial": "hot-unkeyed",
    "hot-publisher": "hot-unkeyed",
}
DIAG = ("store", "publisher")


def _phase(
    phase: str,
    tag: str,
    args: argparse.Namespace,
    db: BenchDatabase,
    broker: BenchBroker,
    payloads: list[bytes],
    now: float,
    results: dict[str, Row],
) -> None:
    n = len(payloads)

    def purge_after(fn: Callable[[], Any]) -> Any:
        return _purged(broker, fn, n, phase)

    if phase == "ceiling":
        _say(f"ceiling: raw pika, confirms, window {args.window}{tag} ...")
        props = [message_properties(uuid.uuid4(), now) for _ in range(n)]
        c: CeilingResult = purge_after(
            lambda: measure_ceiling(
                args.amqp,
                broker.exchange,
                ROUTING_KEY,
                payloads,
                props,
                window=args.window,
                timeout=args.timeout,
            )
        )
        if c.nacked or c.returned:
            raise RuntimeError(f"ceiling: {c.nacked} nacked, {c.returned} returned")
        row = _add(results, phase, c.rate)
        extra = f"{c.seconds:.2f} s" + (f"; {c.cpu.describe(c.messages)}" if c.cpu else "")
        row.extras.append(extra)
        if c.cpu is not None:
            row.others.append(c.cpu.cores("other"))
        _say(f"  {_fmt_rate(c.rate)} ({extra})")
    elif phase == "in-process":
        db.restore()
        _quiesce()
        _say(f"relay drain, in-process{tag} ...")
        r: DrainResult = purge_after(
            lambda: drain_in_process(db, args.amqp, timeout=args.timeout, profile_dir=args.profile)
        )
        _add_drain(results, phase, r)
    elif phase == "subprocess":
        db.restore()
        _quiesce()
        _say(f"relay drain, subprocess (outbox-relay run){tag} ...")
        r = purge_after(lambda: drain_subprocess(db, args.amqp, timeout=args.timeout))
        _add_drain(results, phase, r)
    elif phase == "one-at-a-time":
        db.restore()
        _quiesce()
        limit = min(n, ONE_AT_A_TIME)
        _say(f"comparison: publish and confirm one message at a time, {limit} messages{tag} ...")
        try:
            r = drain_one_at_a_time(db, args.amqp, limit=limit, timeout=args.timeout)
        finally:
            arrived = broker.purge()
        if arrived != limit:
            raise RuntimeError(f"{phase}: {arrived} messages in the queue, expected {limit}")
        _add_drain(results, phase, r)
    elif phase == "prepared":
        # Off, then on, each from the same restored backlog; with --repeat, medians of each.
        on_url = make_url(db.url).update_query_dict({"prepare_threshold": PREPARED_ON})
        for key, url in (("prepared", db.url), ("prepared-on", on_url.render_as_string(False))):
            db.restore()
            _quiesce()
            _say(f"{FIGURES[key]}{tag} ...")
            drain = functools.partial(
                drain_in_process, db, args.amqp, timeout=args.timeout, db_url=url
            )
            _add_drain(results, key, purge_after(drain))
    elif phase == "signed":
        # Unsigned, then signed, each from the same restored backlog; with --repeat, medians.
        ring = keys_text(new_secret())
        for key, signing in (("unsigned", None), ("signed", ring)):
            db.restore()
            _quiesce()
            _say(f"{FIGURES[key]}{tag} ...")
            drain = functools.partial(
                drain_in_process, db, args.amqp, timeout=args.timeout, signing=signing
            )
            _add_drain(results, key, purge_after(drain))
        # The broker's own share: raw pika with the three headers a signed message carries
        # (signed before the clock starts), against the ceiling of the same run.
        signer = ring.for_exchange(broker.exchange)
        assert signer is not None
        props = []
        for body in payloads:
            message_id = uuid.uuid4()
            plain = message_properties(message_id, now)
            plain.headers = signer.headers(str(message_id), body)
            props.append(plain)
        _quiesce()
        _say(f"{FIGURES['signed-ceiling']}{tag} ...")
        c = purge_after(
            lambda: measure_ceiling(
                args.amqp,
                broker.exchange,
                ROUTING_KEY,
                payloads,
                props,
                window=args.window,
                timeout=args.timeout,
            )
        )
        _add(results, "signed-ceiling", c.rate)
    elif phase == "store":
        db.restore()
        _quiesce()
        _say(f"diagnostic: store only (claim + mark_published, 500 a batch){tag} ...")
        _add_drain(results, phase, drain_store_only(db))
    elif phase == "enqueue":
        assert db.engine is not None
        _say(f"enqueue cost: one writer, a business row with and without an outbox row{tag} ...")
        cost = measure_insert_cost(db.engine, broker.exchange)
        row = results.setdefault(phase, Row(FIGURES[phase]))
        row.rates.append(cost.ratio)
        row.extras.append(cost.describe())
        _say(f"  {cost.describe()}")
    elif phase == "wakeup":
        _say(f"wake-up: commit-to-confirm with polling alone{tag} ...")
        found = measure_wakeup(db, args.amqp, broker.exchange)
        broker.purge()
        row = results.setdefault(phase, Row(FIGURES[phase]))
        row.rates.append(found[0].p50_ms)
        row.extras.append("; ".join(f.describe() for f in found))
        _say(f"  {row.extras[-1]}")
    elif phase == "hot-key":
        _hot_key(tag, args, db, broker, payloads, now, results)
    elif phase == "publisher":
        _say(f"diagnostic: relay.Publisher only, pre-built messages{tag} ...")
        items = _outgoing(broker, payloads[:n], now)
        r = purge_after(lambda: publish_only(args.amqp, items, timeout=args.timeout))
        _add_drain(results, phase, r)


def _outgoing(broker: BenchBroker, payloads: Sequence[bytes], now: float) -> list[Outgoing]:
    """The messages as the relay would hand them to its publisher, built before any clock runs."""
    return [
        Outgoing(
            i,
            str(uuid.uuid4()),
            broker.exchange,
            ROUTING_KEY,
            body,
            message_properties(uuid.uuid4(), now),
        )
        for i, body in enumerate(payloads)
    ]


def _purged(broker: BenchBroker, fn: Callable[[], Any], expected: int, what: str) -> Any:
    """`fn()`, then the queue purged, which counts what arrived: every confirmed message was
    routed to it, so anything but `expected` is a failure of the phase."""
    try:
        value = fn()
    finally:
        arrived = broker.purge()
    if arrived != expected:
        raise RuntimeError(f"{what}: {arrived} messages in the queue, expected {expected}")
    return value


def _hot_key(
    tag: str,
    args: argparse.Namespace,
    db: BenchDatabase,
    broker: BenchBroker,
    payloads: list[bytes],
    now: float,
    results: dict[str, Row],
) -> None:
    """The same first HOT_KEY messages drained unkeyed, on one key and on four (in-process),
    then a quarter of them published by raw pika one confirm at a time, and by the relay's
    Publisher alone as one key's chain."""
    limit = min(HOT_KEY, len(payloads))

    for key, keys in (("hot-unkeyed", 0), ("hot-1", 1), ("hot-4", 4)):
        db.restore(limit=limit, keys=keys)
        _quiesce()
        _say(f"{FIGURES[key]}, {limit} messages, in-process{tag} ...")
        drain = functools.partial(drain_in_process, db, args.amqp, timeout=args.timeout)
        _add_drain(results, key, _purged(broker, drain, limit, key))
    _quiesce()
    _say(f"{FIGURES['hot-serial']}, {limit // 4} messages{tag} ...")
    props = [message_properties(uuid.uuid4(), now) for _ in range(limit // 4)]
    serial: CeilingResult = _purged(
        broker,
        lambda: measure_serial(
            args.amqp, broker.exchange, ROUTING_KEY, payloads[: limit // 4], props
        ),
        limit // 4,
        "hot-serial",
    )
    row = _add(results, "hot-serial", serial.rate)
    row.extras.append(f"{serial.seconds:.2f} s")
    _say(f"  {_fmt_rate(serial.rate)} ({serial.seconds:.2f} s)")
    # The relay's own publishing path on the same bound: what the relay would reach with nothing
    # of its loop (claims, marks) beside the chain.
    _quiesce()
    _say(f"{FIGURES['hot-publisher']}, {limit // 4} messages{tag} ...")
    items = _outgoing(broker, payloads[: limit // 4], now)
    chained = _purged(
        broker,
        lambda: publish_only(
            args.amqp, items, batch_size=chains.PIECE, chain=True, timeout=args.timeout
        ),
        limit // 4,
        "hot-publisher",
    )
    _add_drain(results, "hot-publisher", chained)


def _add(results: dict[str, Row], key: str, rate: float) -> Row:
    row = results.setdefault(key, Row(FIGURES[key], diagnostic=key in DIAG))
    row.rates.append(rate)
    return row


def _add_drain(results: dict[str, Row], key: str, r: DrainResult) -> None:
    row = _add(results, key, r.rate)
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
        row.others.append(r.cpu.cores("other"))
        if r.messages:
            work = r.cpu.used.get("relay", 0.0) + r.cpu.used.get("database", 0.0)
            row.work_us.append(work / r.messages * 1e6)
    extra = "; ".join(parts)
    row.extras.append(extra)
    _say(f"  {_fmt_rate(r.rate)} ({extra})")


def _busy_cores(seconds: float = 1.0) -> float | None:
    """How many cores something else kept busy over `seconds` (Linux /proc/stat), or None."""

    def sample() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 == total0:
        return None
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / (total1 - total0))


def _quiesce(limit: float = 15.0, busy: float = 0.25) -> None:
    """Wait (at most `limit` s) until the machine is nearly idle: the broker and the database
    finish what the previous phase left them (fsyncs, vacuum, queue deletion) before the next."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        used = _busy_cores(0.5)
        if used is None or used < busy:
            return
    _say(f"warning: the machine stayed busy (over {busy} cores) for {limit:.0f} s")


def _cleanup(db: BenchDatabase, broker: BenchBroker) -> None:
    for what, fn in (("queue and exchange", broker.delete), ("database", db.drop)):
        try:
            fn()
        except Exception as exc:
            _say(f"warning: could not remove the benchmark {what}: {exc!r}")


def _report(
    args: argparse.Namespace, command: str, info: dict[str, str], results: dict[str, Row]
) -> None:
    ceiling = results.get("ceiling")
    base = ceiling.rate if ceiling else None
    lines: list[tuple[str, str, str]] = []
    for key, row in results.items():
        if key in ("enqueue", "wakeup"):  # not rates: below the table
            continue
        if key.endswith("-rss"):
            lines.append((row.figure, f"{max(row.rates):,.0f} MiB", "-"))
            continue
        if row.error and not row.rates:
            lines.append((row.figure, "FAILED", "-"))
            continue
        ratio = f"{row.rate / base:.2f}x" if base else "-"
        if key in HOT_BASE:  # a ratio to the unkeyed drain of the same run, not the ceiling
            other = results.get(HOT_BASE[key])
            ratio = f"{row.rate / other.rate:.2f}x unkeyed" if other and other.rates else "-"
        lines.append((row.figure, _fmt_rate(row.rate) + _spread(row.rates), ratio))
    w1 = max([len("figure"), *(len(a) for a, _, _ in lines)])
    w2 = max([len("value"), *(len(b) for _, b, _ in lines)])
    out = [
        "",
        "outbox-relay benchmark",
        f"command : {command}",
        f"machine : {os.cpu_count()} cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, pika {pika.__version__}, "
        f"{info.get('database', '?')}, RabbitMQ {info.get('rabbitmq', '?')}"
        + (f"; {info['busy_before']} cores busy before start" if "busy_before" in info else ""),
        f"messages: {args.messages:,} per phase, {args.payload_bytes}-byte JSON body, persistent, "
        "mandatory, topic exchange -> durable queue"
        + (f"; median of {args.repeat} runs" if args.repeat > 1 else ""),
        "",
        f"{'figure':<{w1}}  {'value':>{w2}}  ratio to ceiling",
        f"{'-' * w1}  {'-' * w2}  ----------------",
    ]
    out += [f"{a:<{w1}}  {b:>{w2}}  {c}" for a, b, c in lines]
    out.append("")
    for key, row in results.items():
        if row.extra and not key.endswith("-rss"):
            out.append(f"{key}: {row.extra}")
        if row.error:
            out.append(f"{key}: FAILED: {row.error}")
    noisy = [
        f"{k} ({max(r.others):.2f})" for k, r in results.items() if max(r.others, default=0) > 0.2
    ]
    if noisy:
        out.append(
            "warning: other processes kept cores busy during "
            + ", ".join(noisy)
            + ": those figures are low; rerun on an idle machine"
        )
    off, on = results.get("prepared"), results.get("prepared-on")
    if off and on and off.rates and on.rates:
        # CPU per message is the steadier figure on a shared machine: others' load lowers
        # rates, not the work each message costs.
        cpu = ""
        if off.work_us and on.work_us:
            a, b = statistics.median(off.work_us), statistics.median(on.work_us)
            cpu = f"; relay + PostgreSQL CPU per message {a:.0f} us / {b:.0f} us = {a / b:.2f}x"
        out.append(
            f"no prepared statements / prepared statements: rate {off.rate / on.rate:.2f}x{cpu} "
            f"(median of {len(off.rates)} run(s) each)"
        )
    plain, signed = results.get("unsigned"), results.get("signed")
    if plain and signed and plain.rates and signed.rates:
        cost = signed.rate / plain.rate
        cpu = ""
        if plain.work_us and signed.work_us:
            a, b = statistics.median(signed.work_us), statistics.median(plain.work_us)
            cpu = f"; relay + database CPU per message {a:.0f} us / {b:.0f} us"
        out.append(
            f"target signed drain >= {SIGNED_TARGET:.2f}x unsigned: "
            f"{'met' if cost >= SIGNED_TARGET else 'NOT met'} ({cost:.3f}x{cpu}; median of "
            f"{len(signed.rates)} run(s) each)"
        )
        bound, ceiling = results.get("signed-ceiling"), results.get("ceiling")
        if bound and ceiling and bound.rates and ceiling.rates:
            out.append(
                f"the broker's bound for signed messages: raw pika with their headers "
                f"{bound.rate / ceiling.rate:.3f}x the ceiling (the relay's signed drain "
                f"{signed.rate / bound.rate:.2f}x that bound, unsigned "
                f"{plain.rate / ceiling.rate:.2f}x the ceiling)"
            )
    one, unkeyed = results.get("hot-1"), results.get("hot-unkeyed")
    if one and unkeyed and one.rates and unkeyed.rates:
        hot = one.rate / unkeyed.rate
        out.append(
            f"target one hot key >= {HOT_TARGET:.1f}x the unkeyed drain: "
            f"{'met' if hot >= HOT_TARGET else 'NOT met'} ({hot:.2f}x; goal {HOT_GOAL:.1f}x "
            f"{'met' if hot >= HOT_GOAL else 'not met'})"
        )
    relay = results.get("in-process") or results.get("subprocess")
    if base and relay and relay.rates:
        verdict = "met" if relay.rate >= TARGET * base else "NOT met"
        out.append(
            f"target relay >= {TARGET:.1f}x ceiling ({_fmt_rate(TARGET * base)}): {verdict} "
            f"({relay.figure.split(', ')[-1]}: {relay.rate / base:.2f}x)"
        )
    print("\n".join(out), flush=True)
    if args.markdown is not None:
        _write_markdown(args.markdown, out)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "command": command,
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                    "messages": args.messages,
                    "payload_bytes": args.payload_bytes,
                    **info,
                    "results": {
                        k: {"figure": r.figure, "median": r.rate, "runs": r.rates, "extra": r.extra}
                        for k, r in results.items()
                    },
                },
                indent=2,
            )
            + "\n"
        )


def _write_markdown(path: Path, report: list[str]) -> None:
    """The report as a Markdown fragment the performance page includes: when, where and how it was
    measured on one line each, then the table as the command printed it."""
    command = next(line for line in report if line.startswith("command : "))
    machine = next(line for line in report if line.startswith("machine : "))
    body = [line for line in report if not line.startswith(("command : ", "machine : "))]
    while body and body[0] in ("", "outbox-relay benchmark"):
        body.pop(0)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    text = [
        f"Measured {day} on {machine.removeprefix('machine : ')}.",
        "",
        "```sh",
        command.removeprefix("command : "),
        "```",
        "",
        "```text",
        *body,
        "```",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text), encoding="utf-8")
