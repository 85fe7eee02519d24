"""`outbox-relay migrate` and `outbox-relay status`: the schema, and what is in it."""

from __future__ import annotations

import argparse
import json
import logging

import outbox
from relay.cli.circuits import format_circuits, not_closed
from relay.cli.messages import operator_engine, per_exchange, table
from relay.cli.options import Commands, Handler
from relay.core.urls import redact
from relay.runtime.config import RelayConfig
from relay.store import admin
from relay.store.sql_store import open_store

log = logging.getLogger("relay")


def add_parsers(sub: Commands) -> None:
    sub.add_parser("migrate", help="create or upgrade the outbox schema, then exit")
    status = sub.add_parser("status", help="counts by state and the age of the oldest ready one")
    status.add_argument("--json", action="store_true", help="print one JSON object")


def cmd_migrate(config: RelayConfig, args: argparse.Namespace) -> int:
    with operator_engine(config) as engine:
        version = admin.migrate(engine)
    log.info("schema.migrated", extra={"version": version, "db": redact(config.db_url)})
    return 0


def status_report(config: RelayConfig) -> dict[str, float | int | None]:
    store = open_store(config.db_url)
    try:
        counts = store.counts()
    finally:
        store.close()
    report: dict[str, float | int | None] = {
        state.value: counts.by_state.get(state.value, 0) for state in outbox.State
    }
    report["ready"] = counts.ready
    report["delayed"] = counts.delayed
    age = counts.oldest_ready_age_s
    report["oldest_pending_age_s"] = None if age is None else round(age, 3)
    return report


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
        rows = [
            [e["exchange"] or "(default)", str(e["pending"]), str(e["in_flight"]),
             str(e["published"]), str(e["dead"]), str(e["cancelled"]), str(e["discarded"]),
             "-" if e["oldest_ready_age_s"] is None else f"{e['oldest_ready_age_s']:.1f} s"]
            for e in exchanges
        ]  # fmt: skip
        header = ["exchange", "pending", "in_flight", "published", "dead", "cancelled",
                  "discarded", "oldest ready"]  # fmt: skip
        print(table(rows, header))
    return 0


def format_status(report: dict[str, float | int | None]) -> str:
    rows = [
        ("pending", f"{report['pending']} ({report['ready']} ready, {report['delayed']} delayed)"),
        ("in_flight", str(report["in_flight"])),
        ("published", str(report["published"])),
        ("dead", str(report["dead"])),
        ("cancelled", str(report["cancelled"])),
        ("discarded", str(report["discarded"])),
    ]
    age = report["oldest_pending_age_s"]
    rows.append(("oldest ready age", "-" if age is None else f"{age:.1f} s"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


COMMANDS: dict[str, Handler] = {
    "migrate": cmd_migrate,
    "status": cmd_status,
}
