"""`python -m benchmarks`: the confirmed-publish ceiling, the relay's drain rate, and their ratio;
what a SIGKILL costs; and a line per target (benchmarks/targets.py) saying whether it was met.

Phases, in order (choose with --phases):
  ceiling      raw pika SelectConnection with confirms: the bound
  window-need  the same at windows of 32 to 2,048 unconfirmed messages (20,000 messages each, or
               --messages if fewer): K, the smallest window at 0.9x the largest one's rate
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
  enqueue      what outbox.enqueue costs a one-row transaction (commits/s with and without it;
               on PostgreSQL also beside a plain INSERT of its columns into an unindexed table:
               target at least 0.9x); and 10,000 messages in one transaction written by
               outbox.enqueue_many and by 10,000 enqueue calls (target: at least 5x faster)
  wakeup       commit-to-confirm with polling alone (no LISTEN, as on MySQL): single messages
               into an idle relay, and a steady 100 msg/s
  hot-key      a backlog on one key, and on four, beside the same backlog unkeyed (in-process,
               HOT_KEY messages each); raw pika publishing the same messages one confirm at a
               time, and with four unconfirmed: the bounds for any relay that keeps one key's,
               or four keys', order whatever the broker does, which the relay's drains are
               judged against; on PostgreSQL, the floor relay (benchmarks/floor.py) draining
               the one key's and the four keys' backlogs, its database work on a thread of its
               own: the bounds of the hot-key figures with the database's work beside the
               broker's; and
               relay.Publisher alone sending one key's chain, and four keys' chains side by
               side (diagnostics: the relay's publishing path alone)
  neighbour    a healthy exchange's messages drained in-process beside a missing exchange's:
               one row in six of the backlog (24,000 rows, or --messages if fewer), interleaved,
               goes there and its circuit opens; and the same drain with those rows removed
               (target: beside at least 0.3x alone)
  many         PostgreSQL only: one relay serving --many-databases databases (schemas of the
               bench database, `outbox-relay run --db-file`) draining the backlog (50,000, or
               --messages if fewer) split evenly over them, against `outbox-relay --db URL run`
               draining it from one (benchmarks/many.py); then, the same relay running, the
               one database left out of a trickle (50 msg/s into the others) draining the same
               backlog alone and beside the trickle, and the trickle's commit-to-consumer p50
               beside that drain over its p50 with nothing to drain
  small        a backlog of --messages 80-byte bodies (a database of its own): the raw pika
               ceiling on them and the in-process drain, the relay's CPU per message against
               raw pika's on the same messages, and the database's; then, on PostgreSQL, the
               floor relay (benchmarks/floor.py: claim, publish, mark and nothing else, its
               window fixed at the relay's ceiling) on the same backlog: the bound of the
               80-byte figures
  logical      PostgreSQL only: logical capture (`run --capture logical`) beside the table mode,
               in a database with a replication slot of its own (benchmarks/logical.py): a
               backlog of --messages 80-byte bodies emitted into the log by outbox.enqueue
               (5,000 a transaction, committed before the relay starts) drained in-process,
               against raw pika's ceiling on them (target: at least 0.8x) and beside the same
               backlog drained from the table; the relay's CPU per message and the database's,
               the walsender streaming the slot included (target: the log's at most a third of
               the table's); one writer's transaction with a message emitted against the same
               without it (target: at least 0.95x) and with a row in the table; commit-to-
               consumer latency at 200 msg/s from the log and from the table against the
               broker's floor (target: the log's p50 within 1 ms of the floor's)
  kill         a relay subprocess with default settings drains a committed backlog (20,000, or
               --messages if fewer), is SIGKILLed at 40% and restarted at once: duplicates
               (target: at most 2x K) and recovery (target: at most 6 s)
  steady-kill  writers commit 1,000 msg/s for 15 s; the relay is SIGKILLed once and restarted
               at once: duplicates (target: at most 100)

--db names the server: PostgreSQL (the default), or MySQL/MariaDB, e.g.
`--db mariadb://root@127.0.0.1:3306/test` (every phase but `prepared`, which is psycopg's).
The kill phases run the chaos suite's scenarios (tests/chaos) on that kind of server, on a schema
or database, exchange and queue of their own. The queue is purged after every phase; the
databases and the queue are removed at the end. With --profile, a summary of the profile
(own time, by where the code lives) follows the report.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from benchmarks import bounds, faults, logical, machine
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
from benchmarks.floor import drain_floor_keys
from benchmarks.insert_cost import measure_insert_cost, measure_many, measure_statement_cost
from benchmarks.many import DATABASES
from benchmarks.many import measure as measure_many_databases
from benchmarks.neighbour import measure as measure_neighbour
from benchmarks.profiles import print_summary
from benchmarks.report import report
from benchmarks.results import (
    FIGURES,
    Results,
    add,
    add_drain,
    fmt_rate,
    row_of,
    say,
    settle,
)
from benchmarks.targets import MANY_MESSAGES
from benchmarks.wakeup import measure_wakeup
from outbox.signing import new_secret
from relay.amqp.wire import with_properties
from relay.core.signing import keys_text
from relay.loop import chains
from relay.ports import Outgoing

PHASES = (
    "ceiling",
    "window-need",
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
    "neighbour",
    "many",
    "small",
    "logical",
    "kill",
    "steady-kill",
)
POSTGRESQL_ONLY = ("prepared", "logical", "many")
# psycopg's own default: a statement is prepared on the server at its fifth run.
PREPARED_ON = "5"
ONE_AT_A_TIME = 20_000  # messages the slow comparison drains (its rate is what counts)
HOT_KEY = 20_000  # messages each hot-key drain takes (a key drains at a few thousand a second)
DEFAULT_DB = os.environ.get("BENCH_DB_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
DEFAULT_AMQP = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


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
    p.add_argument(
        "--many-databases",
        type=int,
        default=DATABASES,
        metavar="N",
        help=f"many: databases one relay serves ({DATABASES})",
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
        help="cProfile the in-process relay's thread into DIR/relay-loop.prof (slows it down)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.messages = 5000
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if (
        unknown
        or args.messages < 1
        or args.payload_bytes < 1
        or args.repeat < 1
        or args.many_databases < 1
    ):
        say(f"error: bad arguments (unknown phases: {unknown})" if unknown else "bad arguments")
        return 2
    exe = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
    command = shlex.join([exe, "-m", "benchmarks", *sys.argv[1:]])
    base = names()
    db = BenchDatabase(args.db, base)
    if db.mysql:
        refused = [p for p in phases if p in POSTGRESQL_ONLY]
        if refused and args.phases != ",".join(PHASES):
            say(f"error: {', '.join(refused)}: PostgreSQL only")
            return 2
        phases = [p for p in phases if p not in POSTGRESQL_ONLY]
    broker = BenchBroker(args.amqp, exchange=base.replace("_", "-"), queue=base.replace("_", "-"))
    small = BenchDatabase(args.db, f"{base}_small") if "small" in phases else None
    captured = logical.Captured(args.db, f"{base}_logical") if "logical" in phases else None
    results: Results = {}
    info: dict[str, str] = {}
    started = time.time()
    busy = machine.busy_cores()
    if busy is not None:
        info["busy_before"] = f"{busy:.2f}"
        if busy > 0.2:
            say(f"warning: {busy:.1f} cores were busy before the run: figures will be low")
    try:
        info["rabbitmq"] = broker.declare()
        info["database"] = f"{db.product} {db.server_version()}"
        _run(args, phases, db, small, captured, broker, results)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except Exception as exc:
        say(f"error: {exc!r}")
        return 1
    finally:
        _cleanup(
            ("queue and exchange", broker.delete),
            ("database", db.drop),
            *([("80-byte database", small.drop)] if small is not None else []),
            *(
                [("logical capture's slot, publication and database", captured.drop)]
                if captured is not None
                else []
            ),
        )
    report(args, command, info, results)
    if args.profile is not None:
        print_summary(args.profile, started)
    return 1 if any(row.error for row in results.values()) else 0


def _run(
    args: argparse.Namespace,
    phases: list[str],
    db: BenchDatabase,
    small: BenchDatabase | None,
    captured: logical.Captured | None,
    broker: BenchBroker,
    results: Results,
) -> None:
    n = args.messages
    payloads = [encode(make_payload(i, args.payload_bytes)) for i in range(n)]
    now = time.time()

    needs_backlog = {
        "in-process", "subprocess", "one-at-a-time", "prepared", "signed", "store", "hot-key",
        "neighbour", "many",
    }  # fmt: skip
    if (needs_backlog | {"enqueue", "wakeup"}) & set(phases):
        db.create()
        say(f"loading {n} messages through outbox.enqueue ...")
        seconds = db.load(n, args.payload_bytes, broker.exchange)
        say(f"  loaded in {seconds:.1f} s ({n / seconds:,.0f} rows/s, not part of any figure)")
    if small is not None:
        small.create()
        say(f"loading {n} messages of {bounds.SMALL_BYTES} bytes through outbox.enqueue ...")
        small.load(n, bounds.SMALL_BYTES, broker.exchange)
    if captured is not None:
        say(
            f"logical capture: a database with a slot of its own, {n} messages of "
            f"{bounds.SMALL_BYTES} bytes through outbox.enqueue ..."
        )
        captured.create(n, broker.exchange)
        broker.bind(logical.LATENCY_KEY)

    for round_ in range(args.repeat):
        tag = f" [{round_ + 1}/{args.repeat}]" if args.repeat > 1 else ""
        for phase in phases:
            settle()
            try:
                _phase(phase, tag, args, db, small, captured, broker, payloads, now, results)
            except Exception as exc:
                # One broken phase (the relay code changes under this harness) must not hide
                # the others: record it, clean the queue, go on.
                say(f"  FAILED: {exc}")
                row_of(results, phase).error = str(exc).splitlines()[0][:200]
                with contextlib.suppress(Exception):
                    broker.purge()


def _phase(
    phase: str,
    tag: str,
    args: argparse.Namespace,
    db: BenchDatabase,
    small: BenchDatabase | None,
    captured: logical.Captured | None,
    broker: BenchBroker,
    payloads: list[bytes],
    now: float,
    results: Results,
) -> None:
    n = len(payloads)

    def purge_after(fn: Callable[[], Any]) -> Any:
        return broker.purged(fn, n, phase)

    if phase == "ceiling":
        say(f"ceiling: raw pika, confirms, window {args.window}{tag} ...")
        bounds.ceiling(args, broker, payloads, now, args.window, results, phase)
    elif phase == "in-process":
        db.restore()
        settle()
        say(f"relay drain, in-process{tag} ...")
        r: DrainResult = purge_after(
            lambda: drain_in_process(db, args.amqp, timeout=args.timeout, profile_dir=args.profile)
        )
        add_drain(results, phase, r)
    elif phase == "subprocess":
        db.restore()
        settle()
        say(f"relay drain, subprocess (outbox-relay run){tag} ...")
        r = purge_after(lambda: drain_subprocess(db, args.amqp, timeout=args.timeout))
        add_drain(results, phase, r)
    elif phase == "one-at-a-time":
        db.restore()
        settle()
        limit = min(n, ONE_AT_A_TIME)
        say(f"comparison: publish and confirm one message at a time, {limit} messages{tag} ...")
        try:
            r = drain_one_at_a_time(db, args.amqp, limit=limit, timeout=args.timeout)
        finally:
            arrived = broker.purge()
        if arrived != limit:
            raise RuntimeError(f"{phase}: {arrived} messages in the queue, expected {limit}")
        add_drain(results, phase, r)
    elif phase == "prepared":
        # Off, then on, each from the same restored backlog; with --repeat, medians of each.
        on_url = make_url(db.url).update_query_dict({"prepare_threshold": PREPARED_ON})
        for key, url in (("prepared", db.url), ("prepared-on", on_url.render_as_string(False))):
            db.restore()
            settle()
            say(f"{FIGURES[key]}{tag} ...")
            drain = functools.partial(
                drain_in_process, db, args.amqp, timeout=args.timeout, db_url=url
            )
            add_drain(results, key, purge_after(drain))
    elif phase == "signed":
        # Unsigned, then signed, each from the same restored backlog; with --repeat, medians.
        ring = keys_text(new_secret())
        for key, signing in (("unsigned", None), ("signed", ring)):
            db.restore()
            settle()
            say(f"{FIGURES[key]}{tag} ...")
            drain = functools.partial(
                drain_in_process, db, args.amqp, timeout=args.timeout, signing=signing
            )
            add_drain(results, key, purge_after(drain))
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
        settle()
        say(f"{FIGURES['signed-ceiling']}{tag} ...")
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
        add(results, "signed-ceiling", c.rate)
    elif phase == "store":
        db.restore()
        settle()
        say(f"diagnostic: store only (claim + mark_published, 500 a batch){tag} ...")
        add_drain(results, phase, drain_store_only(db))
    elif phase == "enqueue":
        assert db.engine is not None
        say(f"enqueue cost: one writer, a business row with and without an outbox row{tag} ...")
        cost = measure_insert_cost(db.engine, broker.exchange)
        add(results, phase, cost.ratio).extras.append(cost.describe())
        say(f"  {cost.describe()}")
        if cost.plain_ratio is not None:
            add(results, "enqueue-plain", cost.plain_ratio)
            say(f"enqueue cost: per statement, inside one transaction{tag} ...")
            statements = measure_statement_cost(db.engine, broker.exchange)
            results["enqueue"].extras[-1] += f"; {statements.describe()}"
            say(f"  {statements.describe()}")
        say(
            f"enqueue_many: {MANY_MESSAGES:,} messages in one transaction, and as many "
            f"calls{tag} ..."
        )
        many = measure_many(db.engine, broker.exchange, messages=MANY_MESSAGES)
        add(results, "enqueue-many", many.ratio).extras.append(many.describe())
        say(f"  {many.describe()}")
    elif phase == "wakeup":
        say(f"wake-up: commit-to-confirm with polling alone{tag} ...")
        found = measure_wakeup(db, args.amqp, broker.exchange)
        broker.purge()
        row = add(results, phase, found[0].p50_ms)
        row.extras.append("; ".join(f.describe() for f in found))
        say(f"  {row.extras[-1]}")
    elif phase == "hot-key":
        _hot_key(tag, args, db, broker, payloads, now, results)
    elif phase == "neighbour":
        measure_neighbour(tag, args, db, broker, results)
    elif phase == "many":
        measure_many_databases(tag, args, db, broker, payloads, now, results)
    elif phase == "window-need":
        bounds.window_need(tag, args, broker, payloads, now, results)
    elif phase == "small":
        assert small is not None
        bounds.small(tag, args, small, broker, now, results)
    elif phase == "logical":
        assert captured is not None
        logical.measure(tag, args, captured, broker, now, results)
    elif phase == "kill":
        backlog = min(n, faults.KILL_BACKLOG)
        say(f"SIGKILL mid-drain: a relay with default settings, {backlog} messages{tag} ...")
        _add_kill(results, phase, faults.kill_mid_drain(backlog, _chaos_database(db)))
    elif phase == "steady-kill":
        say(f"SIGKILL at a steady 1,000 msg/s, {faults.STEADY_S} s of writes{tag} ...")
        _add_kill(results, phase, faults.steady_kill(_chaos_database(db)))
    elif phase == "publisher":
        say(f"diagnostic: relay.Publisher only, pre-built messages{tag} ...")
        items = _outgoing(broker, payloads[:n], now)
        r = purge_after(lambda: publish_only(args.amqp, items, timeout=args.timeout))
        add_drain(results, phase, r)


def _outgoing(broker: BenchBroker, payloads: Sequence[bytes], now: float) -> list[Outgoing]:
    """The messages as the relay would hand them to its publisher, built before any clock runs."""
    return [
        with_properties(
            i, broker.exchange, ROUTING_KEY, body, message_properties(uuid.uuid4(), now)
        )
        for i, body in enumerate(payloads)
    ]


def _hot_key(
    tag: str,
    args: argparse.Namespace,
    db: BenchDatabase,
    broker: BenchBroker,
    payloads: list[bytes],
    now: float,
    results: Results,
) -> None:
    """The same first HOT_KEY messages drained unkeyed, on one key and on four (in-process),
    then a quarter of them published by raw pika one confirm at a time and by the relay's
    Publisher alone as one key's chain, and all of them by the Publisher as four keys' chains."""
    limit = min(HOT_KEY, len(payloads))

    for key, keys in (("hot-unkeyed", 0), ("hot-1", 1), ("hot-4", 4)):
        db.restore(limit=limit, keys=keys)
        settle()
        say(f"{FIGURES[key]}, {limit} messages, in-process{tag} ...")
        drain = functools.partial(drain_in_process, db, args.amqp, timeout=args.timeout)
        add_drain(results, key, broker.purged(drain, limit, key))
    for key, keys in (("hot-floor-1", 1), ("hot-floor-4", 4)):
        if db.mysql:
            break  # the floor relay is psycopg's
        db.restore(limit=limit, keys=keys)
        settle()
        say(f"{FIGURES[key]}, {limit} messages{tag} ...")
        floor = functools.partial(drain_floor_keys, db.url, args.amqp, limit, timeout=args.timeout)
        add_drain(results, key, broker.purged(floor, limit, key))
    settle()
    say(f"{FIGURES['hot-serial']}, {limit // 4} messages{tag} ...")
    props = [message_properties(uuid.uuid4(), now) for _ in range(limit // 4)]
    serial: CeilingResult = broker.purged(
        lambda: measure_serial(
            args.amqp, broker.exchange, ROUTING_KEY, payloads[: limit // 4], props
        ),
        limit // 4,
        "hot-serial",
    )
    row = add(results, "hot-serial", serial.rate)
    row.extras.append(f"{serial.seconds:.2f} s")
    say(f"  {fmt_rate(serial.rate)} ({serial.seconds:.2f} s)")
    # Four keys' bound: the broker with four messages unconfirmed at any moment.
    settle()
    say(f"{FIGURES['hot-serial-4']}, {limit} messages{tag} ...")
    bounds.ceiling(args, broker, payloads[:limit], now, 4, results, "hot-serial-4")
    # The relay's own publishing path on the same bounds: what the relay would reach with
    # nothing of its loop (claims, marks) beside the chains.
    for key, count, lanes in (("hot-publisher", limit // 4, 1), ("hot-publisher-4", limit, 4)):
        settle()
        say(f"{FIGURES[key]}, {count} messages{tag} ...")
        items = _outgoing(broker, payloads[:count], now)
        chained = broker.purged(
            functools.partial(
                publish_only,
                args.amqp,
                items,
                batch_size=chains.CHUNK,
                chains=lanes,
                timeout=args.timeout,
            ),
            count,
            key,
        )
        add_drain(results, key, chained)


def _chaos_database(db: BenchDatabase) -> str:
    """The chaos suite's name for the server --db names."""
    return "mariadb" if db.mysql else "postgresql"


def _add_kill(results: Results, key: str, found: faults.KillResult) -> None:
    """A kill's duplicates under `key`; the mid-drain kill's recovery too. A run that lost
    messages or broke a key's order keeps its figures and fails the benchmark."""
    row = add(results, key, found.duplicates)
    row.extras.append(found.describe())
    if found.problems is not None:
        row.error = found.problems
    if key == "kill":
        add(results, "kill-recovery", found.recovery_s)
    say(f"  {found.describe()}")


def _cleanup(*removals: tuple[str, Callable[[], None]]) -> None:
    for what, fn in removals:
        try:
            fn()
        except Exception as exc:
            say(f"warning: could not remove the benchmark {what}: {exc!r}")
