"""The overview page: counts by state, the ready backlog and its age, relays alive, the charts of
the last hours, circuits and rate limits, and the per-exchange table, all from the Monitor's
latest snapshot (never a query per request); the page refreshes itself. The values are worked out
here; templates/overview.html lays them out."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from outbox.states import State
from relay.console.charts import Chart, Series, line_chart
from relay.console.filters import link
from relay.console.layout import Viewer, ago, render
from relay.console.monitor import WINDOW, Snapshot
from relay.console.present import resource
from relay.runtime.message_rows import short, when

LIVE = 5  # seconds between refreshes of the page
MINUTE = dt.timedelta(minutes=1)
STATES = [s.value for s in State]


def render_page(snap: Snapshot | None, error: str | None, viewer: Viewer) -> str:
    frame: dict[str, Any] = {"title": "Overview", "live": LIVE, "states": STATES}
    if snap is None:
        problem = f"cannot read the outbox: {error}" if error else "reading the outbox…"
        return render("overview.html", viewer, **frame, snap=None, problem=problem)
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
    relays = (
        None
        if snap.relays is None
        else [
            {"id": relay_id, "started": when(started), "seen": ago(seen, snap.taken_at)}
            for relay_id, started, seen in snap.relays
        ]
    )
    return render(
        "overview.html",
        viewer,
        **frame,
        snap=snap,
        error=error,
        estimated=" and ".join(sorted(c.estimated)),
        at=when(snap.taken_at),
        took=f"{snap.took_s:.2f}",
        cards=cards,
        relays=relays,
        charts=_charts(snap),
        circuits=[_circuit(resource(r, snap.taken_at)) for r in snap.resources],
        exchanges=[_exchange(e) for e in snap.exchanges],
    )


def _card(label: str, value: object, href: str, *, estimated: bool = False) -> dict[str, Any]:
    if isinstance(value, int):
        value = f"~{value:,}" if estimated else f"{value:,}"
    return {"label": label, "value": value, "href": href}


def _charts(snap: Snapshot) -> list[Chart]:
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
    return [published, failed, backlog]


def _circuit(d: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "resource": d["resource"],
        "state": d["state"],
        "failures": d["failures"],
        "until": _until(d["opens_in_s"]),
        "tokens": "-" if d["rate_tokens"] is None else d["rate_tokens"],
        "error": short(d["last_error"]),
    }


def _until(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    # Past its cooldown an open circuit waits for the next message to probe with.
    return f"half-open in {seconds:.0f} s" if seconds >= 1 else "probe due"


def _exchange(e: Mapping[str, Any]) -> dict[str, Any]:
    name = e["exchange"]
    age = e["oldest_ready_age_s"]
    return {
        "href": link("/messages", {"exchange": [name]}),
        "name": name or "(default)",
        "cells": [
            (
                link("/messages", {"exchange": [name], "state": [s]}),
                f"~{e[s]}" if s in e.get("estimated", ()) else e[s],
            )
            for s in STATES
        ],
        "age": "-" if age is None else f"{age:.1f} s",
    }
