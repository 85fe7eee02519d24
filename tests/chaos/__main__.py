"""`make chaos`: every fault at full length, then the table. Exit 1 if anything was lost,
unexpected or out of order, an innocent message ended dead, or the poison-rows fault cost the
relay its broker connection.

    python -m tests.chaos [--messages 50000] [--only NAME,...]
                          [--databases postgresql,mariadb,logical]

--only takes name prefixes: `--only "hot keys"` runs the hot-key faults (3 keys with 80% of the
traffic), `--only relay` only "relay SIGKILL x10", `--only partitions` the partitioned consumers
(4 partitions, 6 consumer processes with the inbox, 20,000 messages on 200 keys; PostgreSQL),
`--only "postgresql failover"` the primary SIGKILLed mid-drain and its streaming standby promoted,
with synchronous and asynchronous replication, the writers writing or idle at the crash (a pair of
clusters of their own: tests/chaos/failover.py), `--only cluster` the three-node RabbitMQ cluster's
node kills, pause and rolling restart, and a classic queue beside them (tests/chaos/cluster.py),
`--only "many databases"` one relay serving 20 databases (SQLite, PostgreSQL databases and
schemas), one of them cut off, one 50,000 messages behind, the relay SIGKILLed x3
(tests/chaos/tenants.py).

Every fault runs on each database in turn (PostgreSQL, then MariaDB), the relay and the writers
on a schema or database of their own; then the faults that matter to logical capture (`run
--capture logical`, the writers emitting into the log) on a PostgreSQL database of their own:
`--databases logical` runs those alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tests.chaos import cluster, failover, mid_drain, partitions, recovery, run, tenants

BROKER, DB, HOT = {"broker": True}, {"db": True}, {"hot": True}
# The faults also run with logical capture (database "logical"), and those that need PostgreSQL.
LOGICAL, PG_ONLY = {"logical": True}, {"pg_only": True}
PARTITIONS = "partitions: 6 consumers SIGKILLed x16, relay SIGKILL, broker cut"


def scenarios() -> list[tuple[str, run.Fault, dict[str, bool]]]:
    return [
        # 50,000 messages at 1,000/s: about 50 s of traffic that every fault falls inside.
        ("relay SIGKILL x10", run.kill_relay(10, between=(1.0, 6.0)), LOGICAL),
        ("broker connection cut x4", run.cut("broker", 4, down=4.0, up=6.0), BROKER | LOGICAL),
        ("database connection cut x3", run.cut("db", 3, down=5.0, up=8.0), DB | LOGICAL),
        ("postgresql restart x2", run.restart_postgres(2), PG_ONLY | LOGICAL),
        ("slow broker (+20 ms/chunk)", run.slow_broker(0.02, 20.0), BROKER),
        ("broker restart x2", run.restart_broker(2), {}),
        ("memory alarm 5 s", run.memory_alarm(5.0), {}),
        ("poison rows x80", run.poison_rows(80, every=0.4), {"steady": True}),
        ("unroutable 5 s, then bound", run.unroutable(5.0), LOGICAL),
        # Hot keys (run.HOT): 3 keys carry 80% of the messages, at run.HOT_RATE (the same 50 s
        # of traffic: --messages scaled down). Each fault leaves hundreds to thousands waiting
        # behind each of them, which the relay drains as runs (128 a claim, going on under their
        # lease; one message per confirm), killed or cut in the middle of them.
        ("hot keys: relay SIGKILL mid-run x6", run.kill_mid_run(6, between=(0.0, 1.5)),
         HOT | LOGICAL),
        ("hot keys: broker cut x3", run.cut("broker", 3, down=4.0, up=6.0), HOT | BROKER),
        ("hot keys: database cut x3", run.cut("db", 3, down=5.0, up=8.0), HOT | DB),
        # A chain sends one message per confirm round trip: each is slowed, not just the batch.
        ("hot keys: slow broker (+20 ms/chunk)", run.slow_broker(0.02, 20.0), HOT | BROKER),
        # A failure in the middle of each hot key's chain: the rest of it waits behind.
        ("hot keys: unroutable 5 s, then bound", run.unroutable(5.0), HOT | LOGICAL),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument(
        "--backlog", type=int, default=20_000, help="kill mid-drain: messages in the backlog"
    )
    parser.add_argument("--only", default="", help="comma-separated name prefixes")
    parser.add_argument(
        "--databases",
        default=",".join(run.DATABASES),
        help=f"comma-separated subset of {','.join(run.DATABASES)} (all)",
    )
    args = parser.parse_args()
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    if not databases or set(databases) - set(run.DATABASES):
        parser.error(f"--databases takes {', '.join(run.DATABASES)}")
    rows = []
    notes = []
    for database in databases:
        if wanted and not any(mid_drain.NAME.startswith(w) for w in wanted):
            break
        started = time.monotonic()
        print(f"chaos: {mid_drain.NAME} on {database}, {args.backlog:,} messages ...", flush=True)
        row = mid_drain.run_kill_mid_drain(messages=args.backlog, database=database)
        rows.append(row)
        notes.append(mid_drain.note(row))
        print(f"chaos: {row.fault}: {'ok' if row.ok else 'FAILED'} "
              f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    for database, (name, fault, options) in ((d, s) for d in databases for s in scenarios()):
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        if (database == "logical" and not options.get("logical")) or (
            database == "mariadb" and options.get("pg_only")
        ):
            continue
        hot = options.get("hot", False)
        rate = run.HOT_RATE if hot else run.RATE
        messages = round(args.messages * rate / run.RATE)  # the same length of traffic
        started = time.monotonic()
        print(f"chaos: {name} on {database}, {messages:,} messages ...", flush=True)
        row = run.run(
            name,
            fault,
            messages=messages,
            rate=rate,
            settle_timeout=300,
            proxy_broker=options.get("broker", False),
            proxy_db=options.get("db", False),
            steady_connection=options.get("steady", False),
            database=database,
            keys=run.HOT if hot else run.UNIFORM,
            calibrate=recovery.CALIBRATION,
        )
        rows.append(row)
        note = run.hot_note(row)
        if note is not None:
            notes.append(note)
        if row.timeline is not None:
            notes.append(recovery.note(row.fault, row.timeline))
        print(f"chaos: {row.fault}: {'ok' if row.ok else 'FAILED'} "
              f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
        if not row.ok:
            print(f"  lost ids {row.report.lost_ids}, keys out of order "
                  f"{row.report.disordered_keys}")  # fmt: skip
    for database in databases:
        # The consumers' side of order: PostgreSQL only (the relay's faults run on each database
        # above; the consumers' inbox and the partitions do not depend on which one).
        if database != "postgresql" or (
            wanted and not any(PARTITIONS.startswith(w) for w in wanted)
        ):
            continue
        started = time.monotonic()
        print(f"chaos: {PARTITIONS}, 20,000 messages ...", flush=True)
        row, kills = partitions.run_partitions(
            PARTITIONS, messages=20_000, keys=200, partitions=4, consumers=6, rate=500.0,
            workdir=Path(os.environ.get("TMPDIR", "/tmp")),
            faults=partitions.Faults(consumer_kills=16, between=(1.0, 3.0), relay_kills=1,
                                     broker_cuts=1),
        )  # fmt: skip
        rows.append(row)
        notes.append(partitions.note(row, kills))
        print(f"chaos: {row.fault}: {'ok' if row.ok else 'FAILED'} "
              f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    for synchronous, idle in failover.NAMES:
        # Clusters of its own, not the databases above: once, whatever --databases says.
        name = failover.NAMES[synchronous, idle]
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        started = time.monotonic()
        print(f"chaos: {name}, 40,000 messages ...", flush=True)
        row, seen = failover.run_failover(synchronous=synchronous, idle=idle)
        rows.append(row)
        notes.append(failover.note(row, seen))
        print(f"chaos: {row.fault}: {'ok' if row.ok else 'FAILED'} "
              f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    # 20 databases of its own, one relay serving them all: once, whatever --databases says.
    if not wanted or any(tenants.NAME.startswith(w) for w in wanted):
        started = time.monotonic()
        print(f"chaos: {tenants.NAME} ...", flush=True)
        many = tenants.run_tenants(Path(os.environ.get("TMPDIR", "/tmp")))
        rows.append(many)
        notes.append(tenants.note(many))
        print(f"chaos: {many.fault}: {'ok' if many.ok else 'FAILED'} "
              f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    # A three-node RabbitMQ cluster of its own (tests/chaos/cluster.py), PostgreSQL only.
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    for row, note in cluster.run_all(wanted, cluster.MESSAGES, tmp):
        rows.append(row)
        notes.append(note)
    print()
    print(run.table(rows))
    for line in notes:
        print(line)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
