"""The overview page: counts by state, the ready backlog and its age, relays alive, the charts of
the last hours, circuits and rate limits, and the per-exchange table, all from the Monitor's
latest snapshot (never a query per request); the page refreshes itself."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from outbox.states import State
from relay.console.charts import Series, line_chart
from relay.console.filters import link
from relay.console.html import Html, join, render
from relay.console.layout import Viewer, ago, page, state
from relay.console.monitor import WINDOW, Snapshot
from relay.console.present import resource
from relay.runtime.message_rows import short, when

LIVE = 5  # seconds between refreshes of the page
MINUTE = dt.timedelta(minutes=1)
STATES = [s.value for s in State]


def render_page(snap: Snapshot | None, error: str | None, viewer: Viewer) -> Html:
    if snap is None:
        body = render(
            '<h1>Overview</h1><p class="problem">$text</p>',
            text=f"cannot read the outbox: {error}" if error else "reading the outbox…",
        )
        return page("Overview", body, viewer, live=LIVE)
    c = snap.counts
    by = c.by_state
    cards = [
        _card("ready", c.ready, "/messages?state=pending"),
        _card("delayed", c.delayed, "/messages?state=pending"),
        *(
            _card(s, by.get(s, 0), f"/messages?state={s}", estimated=s in c.estimated)
            for s in STATES
        ),
        _card(
            "oldest ready",
            "-" if c.oldest_ready_age_s is None else f"{c.oldest_ready_age_s:.1f} s",
            "/messages?state=pending",
        ),
    ]
    stale = render('<p class="problem">$e (showing older figures)</p>', e=error) if error else ""
    if c.estimated:
        stale = render(
            '$stale<p class="note">~ marks an estimate: beside a large table, $states are '
            "estimated from the database's statistics rather than counted.</p>",
            stale=stale,
            states=" and ".join(sorted(c.estimated)),
        )
    body = render(
        "<h1>Overview</h1>$stale"
        '<p class="note">as of $at UTC (read in $took s; refreshed every few seconds)</p>'
        '<div class="cards">$cards</div>'
        "<h2>Relays alive</h2>$relays<h2>Activity</h2>$charts"
        "<h2>Circuits and rate limits</h2>$circuits<h2>Exchanges</h2>$exchanges",
        stale=stale,
        at=when(snap.taken_at),
        took=f"{snap.took_s:.2f}",
        cards=join(cards),
        relays=_relays(snap),
        charts=_charts(snap),
        circuits=_circuits(snap, viewer),
        exchanges=_exchanges(snap.exchanges),
    )
    return page("Overview", body, viewer, live=LIVE)


def _card(label: str, value: object, href: str, *, estimated: bool = False) -> Html:
    if isinstance(value, int):
        value = f"~{value:,}" if estimated else f"{value:,}"
    return render(
        '<a class="card" href="$href"><div class="n">$value</div>'
        '<div class="label">$label</div></a>',
        href=href,
        value=value,
        label=label,
    )


def _relays(snap: Snapshot) -> Html:
    if snap.relays is None:
        return render(
            '<p class="note">This console\'s database role may not read outbox_relay '
            "(SELECT), so it cannot say which relays are alive.</p>"
        )
    if not snap.relays:
        return render(
            '<p class="problem">No relay has sent a heartbeat in the last 30 s: nothing is being '
            "published.</p>"
        )
    rows = [
        render(
            "<tr><td>$id</td><td>$started</td><td>$seen</td></tr>",
            id=relay_id,
            started=when(started),
            seen=ago(seen, snap.taken_at),
        )
        for relay_id, started, seen in snap.relays
    ]
    return render(
        "<table><tr><th>relay</th><th>started</th><th>last heartbeat</th></tr>$rows</table>",
        rows=join(rows),
    )


def _charts(snap: Snapshot) -> Html:
    end = snap.taken_at
    start = end - WINDOW
    minutes = [m for m in snap.minutes if m.start + MINUTE <= end]  # the current one is partial

    def series(name: str, css: str, values: Sequence[tuple[dt.datetime, float]]) -> Series:
        return Series(name, css, values, f"{sum(v for _, v in values):,.0f}")

    # Failures on a scale of their own: beside thousands published, a few dead would be a flat
    # line at zero.
    published = line_chart(
        "Published per minute, last 3 hours",
        [series("published", "s-published", [(m.start, m.published) for m in minutes])],
        start,
        end,
        "nothing published",
    )
    failed = line_chart(
        "Failed and dead per minute",
        [
            series("failed", "s-failed", [(m.start, m.failed) for m in minutes]),
            series("dead", "s-dead", [(m.start, m.dead) for m in minutes]),
        ],
        start,
        end,
        "no failure",
    )
    samples = snap.backlog if len(snap.backlog) > 1 else []
    sampled_from = max(snap.since, start)  # the console samples only while it runs
    backlog = line_chart(
        f"Backlog since {when(sampled_from)}",
        [
            Series("ready", "s-ready", [(s.at, s.ready) for s in samples]),
            Series("pending", "s-pending", [(s.at, s.pending) for s in samples]),
            Series("in flight", "s-in_flight", [(s.at, s.in_flight) for s in samples]),
        ],
        sampled_from,
        end,
        "sampling: one point per refresh while this page is open",
    )
    return render(
        '<div class="charts">$published$failed$backlog</div><p class="note">Times in UTC, '
        "complete minutes. Published counts the messages enqueued up to an hour before they "
        "went out; the relays' own counter (outbox_messages_published_total) counts every one. "
        "Failed: attempts to be retried.</p>",
        published=published,
        failed=failed,
        backlog=backlog,
    )


def _circuits(snap: Snapshot, viewer: Viewer) -> Html:
    if not snap.resources:
        return render('<p class="note">No destination has failed or is rate limited.</p>')
    rows = []
    for r in snap.resources:
        d = resource(r, snap.taken_at)
        reset: Html = render("")
        if viewer.can_act and d["state"] != "closed":
            reset = render(
                '<form data-url="/api/circuits/reset"><input type="hidden" name="resource" '
                'value="$name"><button class="danger">Reset</button></form>',
                name=d["resource"],
            )
        rows.append(
            render(
                '<tr><td>$name</td><td>$state</td><td class="num">$failures</td>'
                '<td>$until</td><td class="num">$tokens</td><td class="error">$error</td>'
                "<td>$reset</td></tr>",
                name=d["resource"],
                state=state(d["state"]),
                failures=d["failures"],
                until=_until(d["opens_in_s"]),
                tokens="-" if d["rate_tokens"] is None else d["rate_tokens"],
                error=short(d["last_error"]),
                reset=reset,
            )
        )
    return render(
        '<table><tr><th>resource</th><th>circuit</th><th class="num">failures</th>'
        '<th>open</th><th class="num">rate tokens</th><th>last error</th><th></th></tr>'
        "$rows</table>",
        rows=join(rows),
    )


def _until(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    # Past its cooldown an open circuit waits for the next message to probe with.
    return f"half-open in {seconds:.0f} s" if seconds >= 1 else "probe due"


def _exchanges(exchanges: Sequence[Mapping[str, Any]]) -> Html:
    if not exchanges:
        return render('<p class="note">The outbox is empty.</p>')
    head = join(render('<th class="num">$s</th>', s=s) for s in STATES)
    rows = []
    for e in exchanges:
        name = e["exchange"]
        cells = join(
            render(
                '<td class="num"><a href="$href">$n</a></td>',
                href=link("/messages", {"exchange": [name], "state": [s]}),
                n=f"~{e[s]}" if s in e.get("estimated", ()) else e[s],
            )
            for s in STATES
        )
        age = e["oldest_ready_age_s"]
        rows.append(
            render(
                '<tr><td><a href="$href">$name</a></td>$cells<td class="num">$age</td></tr>',
                href=link("/messages", {"exchange": [name]}),
                name=name or "(default)",
                cells=cells,
                age="-" if age is None else f"{age:.1f} s",
            )
        )
    return render(
        '<table><tr><th>exchange</th>$head<th class="num">oldest ready</th></tr>$rows</table>',
        head=head,
        rows=join(rows),
    )
