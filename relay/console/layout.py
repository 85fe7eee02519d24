"""What every page shares: the Jinja2 templates (relay/console/templates/, autoescaped, every
value through html.py's escaping), who is looking (Viewer), and how ages are written (times and
other cells as the command line writes them: relay/runtime/message_rows.py)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from relay.console.actions import ACTIONS
from relay.console.html import attribute, visible


@dataclass(frozen=True, slots=True)
class Viewer:
    """What the page may offer the person looking at it."""

    can_act: bool  # signed in (a session) on a console with a token
    actions_on: bool  # the console has a token at all
    name: str | None = None  # who is signed in


TEMPLATES = Environment(
    loader=PackageLoader("relay.console", "templates"),
    autoescape=True,
    finalize=visible,
    undefined=StrictUndefined,
    auto_reload=False,
)
TEMPLATES.filters["attribute"] = attribute
TEMPLATES.globals["verbs"] = {name: a.verb for name, a in ACTIONS.items()}


def render(template: str, viewer: Viewer, **context: Any) -> str:
    """A whole page: `template` with `context`, framed by base.html for `viewer`."""
    return TEMPLATES.get_template(template).render(viewer=viewer, **context)


def error_page(status: int, text: str, viewer: Viewer) -> str:
    return render("error.html", viewer, title=f"{status}", live=0, status=status, text=text)


def ago(value: dt.datetime, now: dt.datetime) -> str:
    seconds = max(0.0, (now - value).total_seconds())
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"
