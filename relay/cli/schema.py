"""`outbox-relay migrate [--check]` and `outbox-relay status`: the schema, and what is in it.

Given several databases (relay/cli/each.py), each is migrated, checked or reported in turn under
its name, and one that fails stops none of the others (exit 1).
"""

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
from relay.cli import each
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
    found = each.targets(config)
    if len(found) > 1:
        return check_each(found, args) if args.check else migrate_each(found, args)
    config = found[0].config
    if args.check:
        return report_check(shape_of(config))
    before, version = migrate(config)
    if version > SCHEMA_VERSION:
        print(f"outbox-relay migrate: {newer(version)}")
        return 0
    log_migrated(config, before, version)
    return 0


def shape_of(config: RelayConfig) -> Shape:
    """What the outbox schema of `config`'s database has, against what this version needs."""
    with operator_engine(config) as engine, engine.connect() as conn:
        return inspect_schema(conn)


def migrate(config: RelayConfig) -> tuple[Shape, int]:
    """Migrate `config`'s database: its shape before, and the version it is at now."""
    with operator_engine(config) as engine:
        with engine.connect() as conn:
            before = inspect_schema(conn)  # only to say what changed: migrate looks again
        try:
            return before, admin.migrate(engine)
        except SchemaConflict as exc:
            raise RelayError(str(exc)) from None


def newer(version: int) -> str:
    # A newer outbox-relay migrated this database, and outbox/migrate.py left it as it is: what
    # this release calls obsolete or different may be what that one needs. Not a failure, as
    # this release's relays run on it (runner.check_schema trusts a recorded version at least
    # their own), so an older deploy's migrate step does not stop a rollback.
    return (
        f"the outbox schema is at version {version}, newer than this outbox-relay's "
        f"{SCHEMA_VERSION}; nothing to do"
    )


def log_migrated(config: RelayConfig, before: Shape, version: int, name: str = "") -> None:
    fixed = "; ".join(str(gap) for gap in before.gaps) or "nothing"
    where = {"database": name} if name else {}  # unnamed: the one database, as always
    log.info(
        "schema.migrated",
        extra={
            "version": version,
            "previous_version": before.version,
            "fixed": fixed,
            "db": redact(config.db_url),
            **where,
        },
    )


def migrate_each(found: list[each.Target], args: argparse.Namespace) -> int:
    """`migrate` with several databases: each in turn, logged by name; a failure on stderr
    stops none of the others."""
    answers: list[each.Answer[tuple[Shape, int]]] = []
    for answer in each.each_database(found, args, migrate):
        answers.append(answer)
        if isinstance(answer.value, each.Failed):
            print(each.failure_line("migrate", answer.name, answer.value), file=sys.stderr)
            continue
        before, version = answer.value
        if version > SCHEMA_VERSION:
            print(f"{answer.name}: {newer(version)}")
        else:
            log_migrated(answer.target.config, before, version, answer.name)
    return each.exit_code(answers)


def check_lines(shape: Shape) -> list[str]:
    """What `migrate --check` prints on stdout: that nothing would change, or each change."""
    if shape.version > SCHEMA_VERSION:
        return [f"outbox schema is version {shape.version}, newer than this outbox-relay's "
                f"{SCHEMA_VERSION}: nothing to do"]  # fmt: skip
    if shape.complete:
        recorded = (
            "recorded" if shape.version == SCHEMA_VERSION
            else "not recorded: `outbox-relay migrate` would record it, changing nothing else"
        )  # fmt: skip
        return [f"outbox schema is up to date (version {SCHEMA_VERSION}, {recorded})"]
    return [printable(str(gap)) for gap in shape.gaps]


def differs(shape: Shape) -> bool:
    """Whether `migrate` would change the schema."""
    return shape.version <= SCHEMA_VERSION and not shape.complete


def complaint(shape: Shape, name: str = "") -> str:
    """`migrate --check`'s line on stderr when the schema differs."""
    recorded = f"version {shape.version}" if shape.version else "no recorded version"
    of = f" of {name}" if name else ""
    return (
        f"outbox-relay: migrate --check: the outbox schema{of} ({recorded}) differs from version "
        f"{SCHEMA_VERSION} in {len(shape.gaps)} way(s), listed on stdout; nothing was changed: "
        "run `outbox-relay migrate` to bring it up to date"
    )


def report_check(shape: Shape) -> int:
    """`migrate --check`: what `migrate` would change, one item a line on stdout; exit 1 (with
    one line on stderr) when that is anything."""
    for line in check_lines(shape):
        print(line)
    if not differs(shape):
        return 0
    print(complaint(shape), file=sys.stderr)
    return 1


def check_each(found: list[each.Target], args: argparse.Namespace) -> int:
    """`migrate --check` with several databases: each one's lines, prefixed with its name; exit
    1 when any differs or failed."""
    answers: list[each.Answer[Shape]] = []
    code = 0
    for answer in each.each_database(found, args, shape_of):
        answers.append(answer)
        if isinstance(answer.value, each.Failed):
            print(each.failure_line("migrate --check", answer.name, answer.value), file=sys.stderr)
            continue
        for line in check_lines(answer.value):
            print(f"{answer.name}: {line}")
        if differs(answer.value):
            print(complaint(answer.value, answer.name), file=sys.stderr)
            code = 1
    return max(code, each.exit_code(answers))


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
    found = each.targets(config)
    if len(found) > 1:
        return status_each(found, args)
    full = status_of(found[0].config)
    if args.json:
        print(json.dumps(full))
    else:
        print_status(full)
    return 0


def status_of(config: RelayConfig) -> dict[str, Any]:
    """One database's status, as `status --json` prints it."""
    report = status_report(config)
    return {**report, "exchanges": per_exchange(config), "open_circuits": not_closed(config)}


def print_status(full: dict[str, Any]) -> None:
    circuits, exchanges = full["open_circuits"], full["exchanges"]
    print(format_status(full))
    if circuits:
        print(f"\n{len(circuits)} circuit(s) not closed: their messages wait, burning no attempts")
        print(format_circuits(circuits))
    if exchanges:
        print()
        print(format_exchanges(exchanges))
    notes = estimate_notes(full, exchanges)
    if notes:
        print()
        print("\n".join(notes))


def status_each(found: list[each.Target], args: argparse.Namespace) -> int:
    """`status` with several databases: a report each, keyed (--json) or headed by its name; a
    database that failed has its error there instead, and the exit code is 1."""
    answers = each.each_database(found, args, status_of)
    if args.json:
        keyed = list(answers)
        print(json.dumps({a.name: _entry(a.value) for a in keyed}))
        return each.exit_code(keyed)
    done: list[each.Answer[dict[str, Any]]] = []
    for answer in answers:  # printed as each comes: a slow database holds back only its own
        print(f"\n== {answer.name} ==" if done else f"== {answer.name} ==")
        done.append(answer)
        if isinstance(answer.value, each.Failed):
            print(f"error: {answer.value.error}")
        else:
            print_status(answer.value)
    return each.exit_code(done)


def _entry(value: dict[str, Any] | each.Failed) -> dict[str, Any]:
    return {"error": value.error} if isinstance(value, each.Failed) else value


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
