"""`outbox-relay circuits`: the shared circuit breakers and rate-limit buckets, per resource.

    outbox-relay circuits [--json]                 every resource: state, failures, open until,
                                                   last error, prober, rate tokens
    outbox-relay circuits reset RESOURCE [--json]  close one by hand; RESOURCE is the full name
                                                   or its last part(s) when they name just one

A resource that never failed and is not rate limited has no row: it is closed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from relay.cli.messages import table, utc_now
from relay.cli.options import Commands, Handler
from relay.core import circuit
from relay.core.circuit import Circuit, CircuitState
from relay.errors import ConfigError
from relay.loop.circuits import log_transition
from relay.ports import ResourceRow
from relay.runtime.config import RelayConfig
from relay.store.sql_store import SqlStore, open_store


def add_parser(sub: Commands) -> None:
    p = sub.add_parser(
        "circuits", help="circuit breakers and rate limits per broker resource; reset one"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    actions = p.add_subparsers(dest="circuits_action", metavar="ACTION")
    reset = actions.add_parser("reset", help="close one resource's circuit by hand")
    reset.add_argument("resource", metavar="RESOURCE", help="the resource, as `circuits` lists it")
    # SUPPRESS: `circuits --json reset X` keeps the --json given before the action.
    reset.add_argument("--json", action="store_true", default=argparse.SUPPRESS)


def describe(c: Circuit, tokens: float | None, now: dt.datetime) -> dict[str, Any]:
    """One resource as JSON-ready values (times ISO 8601 UTC, waits in seconds)."""

    def iso(t: dt.datetime | None) -> str | None:
        return None if t is None else t.astimezone(dt.UTC).isoformat()

    def left(t: dt.datetime | None) -> float | None:
        return None if t is None else round(max(0.0, (t - now).total_seconds()), 3)

    return {
        "resource": c.resource,
        "state": c.state.value,
        "failures": c.failures,
        "opens": c.opens,
        "open_until": iso(c.open_until),
        "opens_in_s": left(c.open_until) if c.state is CircuitState.OPEN else None,
        "probe_owner": c.probe_owner,
        "probe_until": iso(c.probe_until),
        "last_error": c.last_error,
        "changed_at": iso(c.changed_at),
        "rate_tokens": None if tokens is None else round(tokens, 3),
    }


def not_closed(config: RelayConfig) -> list[dict[str, Any]]:
    """The resources whose circuit is open or probing (for `status`)."""
    store = open_store(config.db_url)
    try:
        now = utc_now()
        return [
            describe(r.circuit, r.bucket.tokens, now)
            for r in store.resources()
            if r.circuit.state is not CircuitState.CLOSED
        ]
    finally:
        store.close()


def cmd_circuits(config: RelayConfig, args: argparse.Namespace) -> int:
    store = open_store(config.db_url)
    try:
        if args.circuits_action == "reset":
            return _reset(store, args.resource, as_json=args.json)
        now = utc_now()
        rows = [describe(r.circuit, r.bucket.tokens, now) for r in store.resources()]
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print("no resource has failed or is rate limited: every circuit is closed")
        return 0
    print(format_circuits(rows))
    return 0


def format_circuits(rows: list[dict[str, Any]]) -> str:
    def until(r: dict[str, Any]) -> str:
        if r["state"] == "open":
            return f"in {r['opens_in_s']:.0f} s"
        if r["state"] == "half_open":
            return f"probing: {r['probe_owner']}"
        return "-"

    def error(r: dict[str, Any]) -> str:
        text = (r["last_error"] or "-").replace("\n", " ")
        return text if len(text) <= 60 else text[:57] + "..."

    body = [
        [r["resource"], r["state"], str(r["failures"]), until(r),
         "-" if r["rate_tokens"] is None else f"{r['rate_tokens']:.1f}", error(r)]
        for r in rows
    ]  # fmt: skip
    return table(body, ["resource", "state", "failures", "probe", "tokens", "last error"])


def match(names: list[str], wanted: str) -> str:
    """The one resource `wanted` names: the full name, or a suffix after a '/'."""
    if wanted in names:
        return wanted
    found = [n for n in names if n.endswith("/" + wanted)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ConfigError(f"no resource named {wanted!r} (see `outbox-relay circuits`)")
    raise ConfigError(
        f"{wanted!r} names {len(found)} resources ({', '.join(sorted(found))}); give the full name"
    )


def _reset(store: SqlStore, wanted: str, *, as_json: bool) -> int:
    name = match([r.circuit.resource for r in store.resources()], wanted)
    before: list[Circuit] = []

    def change(row: ResourceRow, now: dt.datetime) -> tuple[ResourceRow, circuit.Transition | None]:
        before.append(row.circuit)
        closed, t = circuit.reset(row.circuit, now, "operator")
        return ResourceRow(closed, row.bucket), t

    transition = store.change_resource(name, change)
    if transition is not None:
        log_transition(transition)
    was = before[0]
    if as_json:
        print(json.dumps({"resource": name, "was": was.state.value, "failures": was.failures}))
    elif transition is None:
        print(f"{name} was already closed")
    else:
        print(f"closed {name} (was {was.state.value}, {was.failures} failures)")
    return 0


COMMANDS: dict[str, Handler] = {"circuits": cmd_circuits}
