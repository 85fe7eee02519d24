"""The console's stylesheet and script, served from /static/ (the Content-Security-Policy allows
no inline script or style). They are files beside this module (relay/console/static/), installed
as package data and read once, at import, through importlib.resources, so they are served from
the installed package whatever the working directory.

The script does two things: it refreshes a live page (the overview, one message) by fetching it
again and swapping its main element, and it runs actions: a dry run through the JSON API, a
dialog with the summary of what will change, then the action itself on confirmation.
"""

from __future__ import annotations

from importlib.resources import files

STATIC = files("relay.console") / "static"


def _read(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


CSS = _read("console.css")
JS = _read("console.js")
