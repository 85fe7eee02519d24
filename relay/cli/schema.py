"""`outbox-relay migrate [--check]` and `outbox-relay status`: the schema, and what is in it."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

import outbox
from outbox.migrate import SchemaConflict, inspect_schema
from outbox.schema import SCHEMA_VERSION
from outbox.shape import Shape
from relay.cli.circuits import format_circuits, not_closed
from relay.cli.messages import operator_engine, per_exchange, table
from relay.cli.options import Commands, Handler, add_command_options
from relay.core.urls import redact
from relay.errors import RelayError
from relay.runtime.config import RelayConfig
from relay.runtime.logs import printable
from relay.store import admin
from relay.store.sql_store import open_store

log = logging.getLogger("relay")


def add_parsers(sub: Commands) -> None:
    migrate = sub.add_parser(
        "migrate", help="create, upgrade or complete the outbox schema, then exit"
    )
    migrate.add_argument(
        "--check",
        action="store_true",
        help="change nothing: exit 0 when the schema is up to date, 1 listing what is missing "
        "or different",
    )
    status = sub.add_parser("status", help="counts by state and the age of the oldest ready one")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    add_command_options(status, "status")


def cmd_migrate(config: RelayConfig, args: argparse.Namespace) -> int:
    with operator_engine(config) as engine:
        with engine.connect() as conn:
            before = inspect_schema(conn)  # only to say what changed: migrate looks again
        if args.check:
            return report_check(before)
        try:
            version = admin.migrate(engine)
        except SchemaConflict as exc:
            raise RelayError(str(exc)) from None
    if version > SCHEMA_VERSION:
        # A newer outbox-relay migrated this database, and outbox/migrate.py left it as it is:
        # what this release calls obsolete or different may be what that one needs. Exit 0, as
        # this release's relays run on it (runner.check_schema trusts a recorded version at least
        # their own), so an older deploy's migrate step does not stop a rollback.
        print(
            f"outbox-relay migrate: the outbox schema is at version {version}, newer than this "
            f"outbox-relay's {SCHEMA_VERSION}; nothing to do"
        )
        return 0
    fixed = "; ".join(str(gap) for gap in before.gaps) or "nothing"
    log.info(
        "schema.migrated",
        extra={
            "version": version,
            "previous_version": before.version,
            "fixed": fixed,
            "db": redact(config.db_url),
        },
    )
    return 0


def report_check(shape: Shape) -> int:
    """`migrate --check`: what `migrate` would change, one item a line on stdout; exit 1 (with
    one line on stderr) when that is anything."""
    if shape.version > SCHEMA_VERSION:
        print(f"outbox schema is version {shape.version}, newer than this outbox-relay's "
              f"{SCHEMA_VERSION}: nothing to do")  # fmt: skip
        return 0
    if shape.complete:
        recorded = (
            "recorded" if shape.version == SCHEMA_VERSION
            else "not recorded: `outbox-relay migrate` would record it, changing nothing else"
        )  # fmt: skip
        print(f"outbox schema is up to date (version {SCHEMA_VERSION}, {recorded})")
        return 0
    for gap in shape.gaps:
        print(printable(str(gap)))
    recorded = f"version {shape.version}" if shape.version else "no recorded version"
    print(
        f"outbox-relay: migrate --check: the outbox schema ({recorded}) differs from version "
        f"{SCHEMA_VERSION} in {len(shape.gaps)} way(s), listed on stdout; nothing was changed: "
        "run `outbox-relay migrate` to bring it up to date",
        file=sys.stderr,
    )
    return 1


def status_report(config: RelayConfig) -> dict[str, Any]:
    store = open_store(config.db_url)
    try:
        counts = store.counts()
    finally:
        store.close()
    report: dict[str, Any] = {
        state.value: counts.by_state.get(state.value, 0) for state in outbox.State
    }
    report["ready"] = counts.ready
    report["delayed"] = counts.delayed
    age = counts.oldest_ready_age_s
    report["oldest_pending_age_s"] = None if age is None else round(age, 3)
    report["estimated"] = sorted(counts.estimated)  # the states whose figures are estimates
    log = log_report(config)
    if log is not None:
        report["log"] = log
        # What waits in the slot is pending too: never 0 while the log holds messages.
        report["pending"] += log["pending"] or 0
    return report


def log_report(config: RelayConfig) -> dict[str, Any] | None:
    """With logical capture (a slot --capture-slot names, on PostgreSQL): the messages that wait
    in the slot, its lag in bytes and its wal_status; None otherwise."""
    if not config.db_url.startswith("postgresql"):
        return None
    from relay.capture import admin as capture  # psycopg: PostgreSQL's users only

    slot = config.capture_slot
    with operator_engine(config) as engine:
        state = capture.status(engine, slot=slot, publication=slot)
    if not state.exists:
        return None
    return {
        "slot": slot,
        "pending": state.pending,
        "lag_bytes": state.lag_bytes,
        "wal_status": state.wal_status,
        "active": state.active,
    }


def cmd_status(config: RelayConfig, args: argparse.Namespace) -> int:
    report = status_report(config)
    exchanges = per_exchange(config)
    circuits = not_closed(config)
    if args.json:
        print(json.dumps({**report, "exchanges": exchanges, "open_circuits": circuits}))
        return 0
    print(format_status(report))
    if circuits:
        print(f"\n{len(circuits)} circuit(s) not closed: their messages wait, burning no attempts")
        print(format_circuits(circuits))
    if exchanges:
        print()
        print(format_exchanges(exchanges))
    notes = estimate_notes(report, exchanges)
    if notes:
        print()
        print("\n".join(notes))
    return 0


STATES = [state.value for state in outbox.State]


def figure(value: int | None, estimated: bool) -> str:
    """A count as status prints it: "~" before an estimate, "?" where there is not even one."""
    if value is None:
        return "?"
    return f"~{value}" if estimated else str(value)


def estimate_notes(report: dict[str, Any], exchanges: list[dict[str, Any]]) -> list[str]:
    """What the marks `figure` put in the output mean, for those that are there."""
    notes = []
    if report.get("estimated") or any(e.get("estimated") for e in exchanges):
        notes.append(
            "~ estimated from the database's statistics: beside a table this large, counting "
            "published and cancelled messages exactly would read all of it"
        )
    if any(e.get(state, 0) is None for e in exchanges for state in STATES):
        notes.append(
            "? not estimated per exchange until the table is analyzed (autovacuum does it, or "
            "ANALYZE outbox_message)"
        )
    return notes


def format_status(report: dict[str, Any]) -> str:
    def of(state: str) -> str:
        return figure(report[state], state in report.get("estimated", ()))

    rows = [
        ("pending", f"{report['pending']} ({report['ready']} ready, {report['delayed']} delayed)"),
        *((state, of(state)) for state in STATES if state != "pending"),
    ]
    age = report["oldest_pending_age_s"]
    rows.append(("oldest ready age", "-" if age is None else f"{age:.1f} s"))
    log = report.get("log")
    if log is not None:
        waiting = "?" if log["pending"] is None else str(log["pending"])
        rows.append(
            (
                "in the log",
                f"{waiting} pending (slot {log['slot']}, {log['lag_bytes']} bytes behind, "
                f"wal_status {log['wal_status']})",
            )
        )
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def format_exchanges(exchanges: list[dict[str, Any]]) -> str:
    rows = [
        [
            e["exchange"] or "(default)",
            *(figure(e[state], state in e.get("estimated", ())) for state in STATES),
            "-" if e["oldest_ready_age_s"] is None else f"{e['oldest_ready_age_s']:.1f} s",
        ]
        for e in exchanges
    ]
    return table(rows, ["exchange", *STATES, "oldest ready"])


COMMANDS: dict[str, Handler] = {
    "migrate": cmd_migrate,
    "status": cmd_status,
}
