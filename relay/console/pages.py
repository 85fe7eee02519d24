"""The console's pages: messages, one message, login (the overview is overview.py): the values
each template shows (relay/console/templates/), worked out here; the templates only lay them out,
and the script only refreshes them and runs actions."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from relay.console import present
from relay.console.actions import ACTIONS
from relay.console.filters import Params, describe, link
from relay.console.layout import Viewer, render
from relay.runtime.message_filter import NO_ERROR
from relay.runtime.message_rows import message_cells, short, when
from relay.store.admin import Page

LIVE_MESSAGE = 2  # seconds between refreshes of a message's page (watching it go out)
_WIDTHS = {"last_error": 90}  # a listed message's columns shortened to one line
# The filter form's fields: name, label, placeholder.
_FIELDS = (
    ("state", "state", "dead or pending,in_flight"),
    ("exchange", "exchange", ""),
    ("routing_key", "routing key", ""),
    ("key", "key", ""),
    ("error_contains", "error contains", ""),
    ("created_since", "created since", "2h or ISO time"),
    ("created_until", "created until", ""),
    ("failed_since", "failed since", ""),
    ("failed_until", "failed until", ""),
)


# --------------------------------------------------------------------------- messages


def messages(
    params: Params,
    result: Page,
    groups: Sequence[Mapping[str, Any]] | None,
    viewer: Viewer,
) -> str:
    nav: list[tuple[str, str]] = []
    if result.newer is not None:
        nav.append((link("/messages", params, after=result.newer), "← newer"))
        nav.append((link("/messages", params), "newest"))
    if result.older is not None:
        nav.append((link("/messages", params, before=result.older), "older →"))
    flt = {k: list(v) for k, v in params.items() if k not in ("limit", "before", "after")}
    return render(
        "messages.html",
        viewer,
        title="Messages",
        live=0,
        described=describe(params),
        fields=_fields(params),
        rows=[message_cells(r, _WIDTHS) for r in result.rows],
        nav=nav,
        actions=list(ACTIONS),
        # A group action needs a filter (see actions.group_filter).
        group_filter=json.dumps(flt) if flt else "",
        groups=None if groups is None else [_group(g) for g in groups],
    )


def _fields(params: Params) -> list[dict[str, str]]:
    def value(name: str) -> str:
        return ",".join(params.get(name, ()))

    fields = [
        {"name": n, "label": label, "hint": hint, "value": value(n), "size": ""}
        for n, label, hint in _FIELDS
    ]
    if params.get("error_group"):
        fields.append(
            {"name": "error_group", "label": "error group", "hint": "",
             "value": value("error_group"), "size": "40"}
        )  # fmt: skip
    return fields


def _group(g: Mapping[str, Any]) -> dict[str, Any]:
    # The row's link and buttons select exactly what it counts: its exchange even when it is
    # the default one (""), and its error, or no error at all.
    group_params = {"state": ["dead"], "exchange": [g["exchange"]]}
    if g["error"] is None:
        group_params[NO_ERROR] = ["true"]
    else:
        group_params["error_group"] = [g["error"]]
    return {
        "exchange": g["exchange"] or "(default)",
        "error": short(g["error"], 200),
        "count": g["count"],
        "href": link("/messages", group_params),
        "first": when(g["first_failed_at"]),
        "last": when(g["last_failed_at"]),
        "filter": json.dumps(group_params),
    }


# --------------------------------------------------------------------------- one message

FIELDS = (
    "id",
    "state",
    "exchange",
    "routing_key",
    "key",
    "priority",
    "attempts",
    "max_attempts",
    "content_type",
    "created_at",
    "available_at",
    "published_at",
    "last_failed_at",
    "last_error",
    "replay_count",
    "replayed_at",
    "idempotency_key",
    "traceparent",
    "tracestate",
    "lease_owner",
    "lease_expires_at",
)
_NO_ACTION = {"in_flight": "a relay is publishing it", "published": "it was published"}


def message(found: Mapping[str, Any], viewer: Viewer, trace_url: str | None) -> str:
    fields: list[tuple[str, object]] = []
    for name in FIELDS:
        value: object = found.get(name)
        if isinstance(value, dt.datetime):
            value = when(value) + " UTC"
        fields.append((name, value))
    tid = present.trace_id(found.get("traceparent"))
    headers = found.get("headers")
    shown_headers = (
        json.dumps(headers, indent=2, ensure_ascii=False, default=str)
        if isinstance(headers, dict)
        else ("-" if headers is None else str(headers))
    )
    body = present.payload(found.get("payload"), found.get("content_type"))
    note = f"{body.kind}, {body.size:,} bytes" + (", first 64 KiB shown" if body.truncated else "")
    current = str(found["state"])
    names = [n for n, a in ACTIONS.items() if current in a.states]
    history = [
        {**h, "at": when(h["at"]), "next": when(h["next_attempt_at"])}
        for h in found.get("attempt_history") or []
    ]
    return render(
        "message.html",
        viewer,
        title=f"Message {found['id']}",
        live=LIVE_MESSAGE,
        id=found["id"],
        current=current,
        fields=fields,
        actions=names,
        why=_NO_ACTION.get(current, current),
        what=" or ".join(ACTIONS[n].verb.lower() for n in names),
        action_url=f"/api/messages/{found['id']}/{{action}}",
        trace_id=tid,
        trace_href=trace_url.replace("{trace_id}", tid) if trace_url and tid else None,
        headers=shown_headers,
        note=note,
        payload=body.text,
        history=history,
    )


# --------------------------------------------------------------------------- login


def login(viewer: Viewer, problem: str | None = None) -> str:
    return render("login.html", viewer, title="Log in", live=0, problem=problem)


def signed_in(viewer: Viewer, session: str) -> str:
    """The answer to a good login: the session, for the page's script to keep (auth.py)."""
    return render("signed_in.html", viewer, title="Signed in", live=0, session=session)


def needs_session(viewer: Viewer) -> str:
    """A page asked for without credentials: the frame; the script brings the session."""
    return render("needs_session.html", viewer, title="Log in", live=0)
