"""The JSON API (the page's script uses it for every action):

    GET  /api/overview                      counts, exchanges, circuits, relays, per-minute activity
    GET  /api/messages?state=dead&...       a page of messages, newest first; `older`/`newer` are
                                            the `before`/`after` of the neighbouring pages
    GET  /api/messages/{id}                 one message: fields, headers, payload, attempts, trace
    GET  /api/groups?state=dead&...         dead messages grouped by exchange and error
    POST /api/messages/{id}/{action}        replay, discard, cancel, reschedule, priority
    POST /api/messages/{action}             the same for {"ids": [...]} or {"filter": {...}}
    POST /api/circuits/reset                {"resource": "..."}: close a circuit by hand

A POST body is a JSON object: `{"dry_run": true}` says what would change and changes nothing;
reschedule takes `{"at": "2026-11-23T08:00Z"}` or `{"in": "10m"}`, priority `{"priority": 5}`.
Every answer has a `summary` (or an `error`) in words.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine

from relay.console import actions, present
from relay.console.filters import PAGING, BadRequest, Params, message_filter, only, paging
from relay.console.monitor import Snapshot
from relay.core import circuit
from relay.loop.circuits import log_transition
from relay.ports import ResourceRow
from relay.runtime.message_filter import FILTERS, TIME_FILTERS
from relay.runtime.message_rows import jsonable
from relay.store import admin
from relay.store.sql_store import SqlStore

log = logging.getLogger("relay")

GROUPS = 50  # failure groups shown at most
GROUPED = ("dead",)  # the states grouped by error
# Filters no index serves: with neither a state nor a time to narrow them, they read the whole
# table, so they run on the console's scan engine (a short statement timeout, a pool of its own).
UNINDEXED = ("exchange", "routing_key", "error_contains", "error_group", "no_error")
BOUNDS = ("state", *TIME_FILTERS)


def unbounded_scan(params: Params) -> str | None:
    """The first filter of `params` no index serves, when no state or time bounds it."""
    if any(params.get(name) for name in BOUNDS):
        return None
    return next((name for name in UNINDEXED if name in params), None)


def scan_too_long(name: str, seconds: float) -> BadRequest:
    return BadRequest(
        f"{name}: no index serves this filter, and reading every message for it took over "
        f"{seconds:g} s; narrow it with a state (state=dead) or a time (created_since=1h)"
    )


def messages(engine: Engine, params: Params, now: dt.datetime) -> dict[str, Any]:
    page = page_of(engine, params, now)
    rows = [{k: v for k, v in r.items() if k != "seq"} for r in page.rows]
    return {"messages": jsonable(rows), "older": page.older, "newer": page.newer}


def page_of(engine: Engine, params: Params, now: dt.datetime) -> admin.Page:
    only(params, (*FILTERS, *PAGING))
    p = paging(params)
    return admin.page_messages(
        engine, message_filter(params, now), p.limit, before=p.before, after=p.after
    )


def groups(engine: Engine, params: Params, now: dt.datetime) -> list[dict[str, Any]] | None:
    """The failure groups of the filter's dead messages (None when it excludes dead ones)."""
    flt = message_filter(params, now)
    wanted = [s for s in (flt.states or GROUPED) if s in GROUPED]
    if not wanted:
        return None
    return admin.failure_groups(engine, replace(flt, states=wanted), GROUPS)


def one(engine: Engine, raw_id: str, trace_url: str | None) -> dict[str, Any] | None:
    found = admin.get_message(engine, message_id(raw_id))
    return None if found is None else present.message(found, trace_url)


def message_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise BadRequest(f"{raw!r} is not a message id (a UUID)") from None


def act(
    engine: Engine,
    name: str,
    raw_id: str | None,
    body: Mapping[str, Any],
    now: dt.datetime,
    who: str,
) -> tuple[int, dict[str, Any]]:
    """An action on one message (`raw_id`), or on the `ids` or the `filter` of the body."""
    if raw_id is not None:
        o = actions.order(name, body, now, target=())
        status, result = actions.run_one(engine, o, message_id(raw_id), now, who)
        target = raw_id
    else:
        o = actions.order(name, body, now, target=("ids", "filter", "bound"))
        if ("ids" in body) == ("filter" in body):
            raise BadRequest('give "ids" (a list of message ids) or "filter" (an object), not both')
        if "bound" in body and ("filter" not in body or o.dry_run):
            raise BadRequest("bound: only a filter's confirmation carries one")
        if "ids" in body:
            ids = actions.ids_of(body["ids"])
            status, result = 200, actions.run_selection(engine, o, ids, now, who)
            target = f"{len(ids)} selected"
        else:
            bound = actions.bound_of(body["bound"]) if "bound" in body else None
            # Relative times (created_since=10m) read as the dry run read them.
            flt, described = actions.group_filter(body["filter"], bound.at if bound else now)
            status, result = actions.run_group(engine, o, flt, described, now, who, bound)
            target = described
    if not o.dry_run:
        log.info(
            "console.action", extra={"action": name, "target": target, "by": who, "status": status}
        )
    return status, {"action": name, **result}


def reset_circuit(store: SqlStore, body: Mapping[str, Any], who: str) -> tuple[int, dict[str, Any]]:
    only(body, ("resource", "dry_run"))
    name, dry_run = body.get("resource"), body.get("dry_run", False)
    if not isinstance(name, str) or not isinstance(dry_run, bool):
        raise BadRequest('give {"resource": "<its full name>"} (and "dry_run": true or false)')
    rows = {r.circuit.resource: r.circuit for r in store.resources()}
    current = rows.get(name)
    if current is None:
        return 404, {"error": f"no resource named {name!r}"}
    was = f"now {current.state.value}, {current.failures} failures"
    if dry_run:
        if current.state is circuit.CircuitState.CLOSED:
            return 200, {
                "dry_run": True,
                "would_change": 0,
                "summary": f"Nothing would change: {name} is closed.",
            }
        return 200, {
            "dry_run": True,
            "would_change": 1,
            "summary": f"Close the circuit of {name} ({was}): relays send its "
            "messages again at once.",
        }

    def change(row: ResourceRow, at: dt.datetime) -> tuple[ResourceRow, circuit.Transition | None]:
        closed, t = circuit.reset(row.circuit, at, who)
        return ResourceRow(closed, row.bucket), t

    transition = store.change_resource(name, change)
    if transition is not None:
        log_transition(transition)
    log.info("console.action", extra={"action": "circuit_reset", "target": name, "by": who})
    said = f"Closed {name} ({was})." if transition else f"{name} was already closed."
    return 200, {"resource": name, "was": current.state.value, "summary": said}


def overview(snap: Snapshot) -> dict[str, Any]:
    c = snap.counts
    result: dict[str, Any] = jsonable(
        {
            "taken_at": snap.taken_at,
            "counts": {**c.by_state, "ready": c.ready, "delayed": c.delayed},
            "oldest_ready_age_s": c.oldest_ready_age_s,
            "estimated": sorted(c.estimated),  # states whose counts are estimates
            "exchanges": snap.exchanges,
            "circuits": [present.resource(r, snap.taken_at) for r in snap.resources],
            "relays": None  # the console's role may not read them
            if snap.relays is None
            else [
                {"relay_id": r, "started_at": s, "last_seen": seen} for r, s, seen in snap.relays
            ],
            "minutes": [
                {"start": m.start, "published": m.published, "failed": m.failed, "dead": m.dead}
                for m in snap.minutes
            ],
        }
    )
    return result
