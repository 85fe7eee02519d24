"""The console's pages: messages, one message, login (the overview is overview.py).
Server-rendered through html.render (the one escaping place); the script only refreshes them and
runs actions."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from relay.console import present
from relay.console.actions import ACTIONS
from relay.console.filters import Params, describe, link
from relay.console.html import Html, join, render
from relay.console.layout import Viewer, page, state
from relay.runtime.message_rows import message_cells, short, when
from relay.store.admin import Page

LIVE_MESSAGE = 2  # seconds between refreshes of a message's page (watching it go out)
_WIDTHS = {"last_error": 90}  # a listed message's columns shortened to one line


# --------------------------------------------------------------------------- messages


def messages(
    params: Params,
    result: Page,
    groups: Sequence[Mapping[str, Any]] | None,
    viewer: Viewer,
) -> Html:
    rows = [_row(message_cells(r, _WIDTHS)) for r in result.rows]
    table = (
        render(
            '<table id="messages"><tr><th><input type="checkbox" id="pick-all" '
            'aria-label="select all"></th><th>id</th><th>state</th><th class="num">att</th>'
            '<th>exchange</th><th>routing key</th><th>key</th><th class="num">prio</th>'
            "<th>created</th><th>due</th><th>last error</th></tr>$rows</table>",
            rows=join(rows),
        )
        if rows
        else render('<p class="note">No message matches.</p>')
    )
    nav = []
    if result.newer is not None:
        nav.append(
            render('<a href="$h">← newer</a>', h=link("/messages", params, after=result.newer))
        )
        nav.append(render('<a href="$h">newest</a>', h=link("/messages", params)))
    if result.older is not None:
        nav.append(
            render('<a href="$h">older →</a>', h=link("/messages", params, before=result.older))
        )
    body = render(
        '<h1>Messages</h1><p class="note">$described, newest first</p>$form$actions$table'
        '<div class="paging">$nav</div>$groups',
        described=describe(params),
        form=_filter_form(params),
        table=table,
        nav=join(nav),
        actions=_bulk_actions(params, viewer),
        groups=_groups(params, groups, viewer),
    )
    return page("Messages", body, viewer)


def _row(cells: Mapping[str, str]) -> Html:
    return render(
        '<tr><td><input type="checkbox" class="pick" value="$id" aria-label="select"></td>'
        '<td><a class="id" href="/messages/$id">$id</a></td><td>$state</td>'
        '<td class="num">$attempts</td><td>$exchange</td><td>$routing_key</td><td>$key</td>'
        '<td class="num">$priority</td><td>$created</td><td>$due</td>'
        '<td class="error">$last_error</td></tr>',
        **{**cells, "state": state(cells["state"])},  # the state as its badge
    )


def _filter_form(params: Params) -> Html:
    def value(name: str) -> str:
        return ",".join(params.get(name, ()))

    fields = [
        ("state", "state", "dead or pending,in_flight"),
        ("exchange", "exchange", ""),
        ("routing_key", "routing key", ""),
        ("key", "key", ""),
        ("error_contains", "error contains", ""),
        ("created_since", "created since", "2h or ISO time"),
        ("created_until", "created until", ""),
        ("failed_since", "failed since", ""),
        ("failed_until", "failed until", ""),
    ]
    inputs = [
        render(
            '<label>$label<input name="$name" value="$value" placeholder="$hint"></label>',
            label=label,
            name=name,
            value=value(name),
            hint=hint,
        )
        for name, label, hint in fields
    ]
    if params.get("error_group"):
        inputs.append(
            render(
                '<label>error group<input name="error_group" value="$v" size="40"></label>',
                v=value("error_group"),
            )
        )
    return render(
        '<form class="filters" method="get" action="/messages">$inputs'
        '<button>Filter</button> <a href="/messages">clear</a></form>',
        inputs=join(inputs),
    )


def _action_forms(url: str, target: str, names: Sequence[str], *, data: str = "") -> Html:
    """One form per action: the script sends it to `url` (dry run, confirmation, then for real)."""
    forms = []
    for name in names:
        extra: Html = render("")
        if name == "reschedule":
            extra = render(
                '<input name="in" placeholder="in: 10m" size="7" aria-label="in">'
                '<input name="at" type="datetime-local" aria-label="at">'
            )
        elif name == "priority":
            extra = render(
                '<input name="priority" type="number" size="5" placeholder="prio" '
                'aria-label="priority" required>'
            )
        forms.append(
            render(
                '<form data-url="$url" data-target="$target" data-filter="$data" '
                'data-action="$name">$extra<button>$verb</button></form>',
                url=url.replace("{action}", name),
                target=target,
                data=data,
                name=name,
                extra=extra,
                verb=ACTIONS[name].verb,
            )
        )
    return join(forms)


def _bulk_actions(params: Params, viewer: Viewer) -> Html:
    if not viewer.can_act:
        return render("")
    flt = json.dumps(
        {k: list(v) for k, v in params.items() if k not in ("limit", "before", "after")}
    )
    selected = _action_forms("/api/messages/{action}", "selection", list(ACTIONS))
    if flt == "{}":  # a group action needs a filter (see actions.group_filter)
        return render('<div class="actions"><b>Selected:</b>$selected</div>', selected=selected)
    everything = _action_forms("/api/messages/{action}", "group", list(ACTIONS), data=flt)
    return render(
        '<div class="actions"><b>Selected:</b>$selected</div>'
        '<div class="actions"><b>Every match of the filter:</b>$everything</div>',
        selected=selected,
        everything=everything,
    )


def _groups(params: Params, groups: Sequence[Mapping[str, Any]] | None, viewer: Viewer) -> Html:
    if groups is None:
        return render("")
    if not groups:
        return render('<h2>Dead messages by error</h2><p class="note">None.</p>')
    rows = []
    for g in groups:
        group_params = {"state": ["dead"], "exchange": [g["exchange"]]}
        if g["error"] is not None:
            group_params["error_group"] = [g["error"]]
        acts: Html = render("")
        if viewer.can_act:
            acts = _action_forms(
                "/api/messages/{action}",
                "group",
                ["replay", "discard"],
                data=json.dumps(group_params),
            )
        rows.append(
            render(
                '<tr><td>$exchange</td><td class="error">$error</td><td class="num">'
                '<a href="$href">$count</a></td><td>$first</td><td>$last</td>'
                '<td><div class="actions">$acts</div></td></tr>',
                exchange=g["exchange"],
                error=short(g["error"], 200),
                count=g["count"],
                href=link("/messages", group_params),
                first=when(g["first_failed_at"]),
                last=when(g["last_failed_at"]),
                acts=acts,
            )
        )
    return render(
        "<h2>Dead messages by error</h2><table><tr><th>exchange</th><th>error</th>"
        '<th class="num">messages</th><th>first failed</th><th>last failed</th><th></th></tr>'
        "$rows</table>",
        rows=join(rows),
    )


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


def message(found: Mapping[str, Any], viewer: Viewer, trace_url: str | None) -> Html:
    fields = []
    for name in FIELDS:
        value: object = found.get(name)
        if name == "state":
            value = state(str(value))
        elif isinstance(value, dt.datetime):
            value = when(value) + " UTC"
        fields.append(render("<dt>$name</dt><dd>$value</dd>", name=name, value=value))
    tid = present.trace_id(found.get("traceparent"))
    if tid is not None:
        trace: Html = render("<code>$tid</code>", tid=tid)
        if trace_url:
            href = trace_url.replace("{trace_id}", tid)
            trace = render('<a href="$href" rel="noopener noreferrer">$tid</a>', href=href, tid=tid)
        fields.append(render("<dt>trace</dt><dd>$trace</dd>", trace=trace))
    headers = found.get("headers")
    shown_headers = (
        json.dumps(headers, indent=2, ensure_ascii=False, default=str)
        if isinstance(headers, dict)
        else ("-" if headers is None else str(headers))
    )
    body = present.payload(found.get("payload"), found.get("content_type"))
    note = f"{body.kind}, {body.size:,} bytes" + (", first 64 KiB shown" if body.truncated else "")
    history = found.get("attempt_history") or []
    return page(
        f"Message {found['id']}",
        render(
            '<h1>Message <span class="id">$id</span> $state</h1>$actions'
            '<dl class="fields">$fields</dl><h2>Headers</h2><pre id="headers">$headers</pre>'
            '<h2>Payload <span class="muted">($note)</span></h2><pre id="payload">$payload</pre>'
            "<h2>Attempts</h2>$history",
            id=found["id"],
            state=state(str(found["state"])),
            fields=join(fields),
            actions=_message_actions(found, viewer),
            headers=shown_headers,
            note=note,
            payload=body.text,
            history=_history(history),
        ),
        viewer,
        live=LIVE_MESSAGE,
    )


def _message_actions(found: Mapping[str, Any], viewer: Viewer) -> Html:
    now = str(found["state"])
    names = [n for n, a in ACTIONS.items() if now in a.states]
    if not names:
        why = {"in_flight": "a relay is publishing it", "published": "it was published"}
        return render('<p class="note">No action: $why.</p>', why=why.get(now, now))
    if not viewer.can_act:
        return render(
            '<p class="note"><a href="/login">Log in</a> to $what it.</p>',
            what=" or ".join(ACTIONS[n].verb.lower() for n in names),
        )
    url = f"/api/messages/{found['id']}/{{action}}"
    return render('<div class="actions">$forms</div>', forms=_action_forms(url, "one", names))


def _history(history: Sequence[Mapping[str, Any]]) -> Html:
    if not history:
        return render(
            '<p class="note">No attempt recorded: it never failed, and no operator changed it.</p>'
        )
    rows = [
        render(
            '<tr><td class="num">$attempt</td><td>$at</td><td>$outcome</td><td>$cls</td>'
            '<td>$by</td><td>$next</td><td class="error">$error</td></tr>',
            attempt=h["attempt"],
            at=when(h["at"]),
            outcome=h["outcome"],
            cls=h["failure_class"],
            by=h["relay_id"],
            next=when(h["next_attempt_at"]),
            error=h["error"],
        )
        for h in history
    ]
    return render(
        '<table id="attempts"><tr><th class="num">attempt</th><th>at (UTC)</th><th>outcome</th>'
        "<th>class</th><th>by</th><th>next attempt</th><th>error</th></tr>$rows</table>",
        rows=join(rows),
    )


# --------------------------------------------------------------------------- login


def login(viewer: Viewer, problem: str | None = None) -> Html:
    text = render('<p class="problem">$p</p>', p=problem) if problem else ""
    if not viewer.actions_on:
        text = render(
            '<p class="problem">This console has no token (OUTBOX_CONSOLE_TOKEN): it '
            "only reads.</p>"
        )
    return page(
        "Log in",
        render(
            '<h1>Log in</h1>$text<form class="login" method="post" action="/login">'
            '<label>Your name, for the record of what you change <input name="name" '
            'autocomplete="username"></label>'
            '<label>Token <input name="token" type="password" autocomplete="current-password" '
            "required></label><button>Log in</button></form>",
            text=text,
        ),
        viewer,
    )
