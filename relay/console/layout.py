"""What every page shares: the frame (head, navigation, who is signed in, the confirmation
dialog) and how ages and states are written (times and other cells as the command line writes
them: relay/runtime/message_rows.py)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from relay.console.html import Html, render


@dataclass(frozen=True, slots=True)
class Viewer:
    """What the page may offer the person looking at it."""

    can_act: bool  # signed in (a session) on a console with a token
    actions_on: bool  # the console has a token at all
    name: str | None = None  # who is signed in
    csrf: str = ""  # the session's CSRF token, for the script and plain forms


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title · outbox-relay console</title>
<meta name="csrf-token" content="$csrf">
<link rel="stylesheet" href="/static/console.css">
<script src="/static/console.js" defer></script></head>
<body data-live="$live">
<header><a class="brand" href="/">outbox-relay</a>
<nav><a href="/">Overview</a><a href="/messages">Messages</a>
<a href="/messages?state=dead">Dead</a><a href="/messages?state=pending">Pending</a></nav>
<div class="who">$who</div></header>
<p id="result" role="status"></p>
<main id="live">$body</main>
<dialog id="confirm"><form method="dialog"><p id="confirm-summary"></p>
<menu><button value="cancel">Cancel</button>
<button id="confirm-go" value="go" class="danger">Confirm</button></menu></form></dialog>
</body></html>
"""


def page(title: str, body: Html, viewer: Viewer, *, live: int = 0) -> Html:
    """A whole page; `live` seconds between refreshes of its main element (0: none)."""
    if viewer.name is not None:
        who = render(
            'signed in as <b>$name</b> <form method="post" action="/logout">'
            '<input type="hidden" name="csrf" value="$csrf"><button>Log out</button></form>',
            name=viewer.name,
            csrf=viewer.csrf,
        )
    elif viewer.actions_on:
        who = render('<a href="/login">Log in</a> to act on messages')
    else:
        who = render("read-only: no OUTBOX_CONSOLE_TOKEN")
    return render(_PAGE, title=title, csrf=viewer.csrf, live=live or "", who=who, body=body)


def error_page(status: int, text: str, viewer: Viewer) -> Html:
    return page(
        f"{status}", render("<h1>$status</h1><p>$text</p>", status=status, text=text), viewer
    )


def ago(value: dt.datetime, now: dt.datetime) -> str:
    seconds = max(0.0, (now - value).total_seconds())
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def state(name: str) -> Html:
    return render('<span class="state state-$name">$name</span>', name=name)
