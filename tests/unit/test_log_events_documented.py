"""The log events the docs list are the ones the code logs: every event the operations page and
the consuming guide name is logged somewhere, and every event logged at INFO or above (what an
operator reads and acts on) is listed there. DEBUG events are the code's own business."""

from __future__ import annotations

import re
from pathlib import Path

from relay.loop.circuits import EVENTS as CIRCUIT_EVENTS

ROOT = Path(__file__).resolve().parents[2]
# Where the events are listed: each page's "## Logs" section.
PAGES = ("docs/operations/observability.md", "docs/guides/consuming.md")
PREFIXES = (
    "relay|broker|circuit|listen|database|schema|http|console|consumer|config|command|metrics"
)
# `log.warning("relay.retry", ...)`, `log.info("consumer.duplicate message_id=%s", ...)`: the
# event is the call's first word.
_CALL = re.compile(
    r"\blog\.(debug|info|warning|error|exception|critical)\(\s*(f?)\"([a-z_{}.]+)(?=[\s\":%])"
)
_NAMED = re.compile(rf"`((?:{PREFIXES})\.[a-z_]+)`")


def logged() -> dict[str, set[str]]:
    """Every event the code logs, with the levels it is logged at."""
    found: dict[str, set[str]] = {event: {"info", "warning"} for event in CIRCUIT_EVENTS}
    for package in ("relay", "outbox"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for level, f, event in _CALL.findall(path.read_text()):
                assert not (f and "{" in event), f"{path}: an event name built at run time: {event}"
                if "." in event:
                    found.setdefault(event, set()).add(level)
    return found


def listed() -> set[str]:
    names: set[str] = set()
    for page in PAGES:
        text = (ROOT / page).read_text()
        section = text.split("\n## Logs\n", 1)[1].split("\n## ", 1)[0]
        names.update(_NAMED.findall(section))
    return names


def test_every_listed_event_is_one_the_code_logs() -> None:
    assert sorted(listed() - set(logged())) == []


def test_every_event_an_operator_reads_is_listed() -> None:
    shown = {event for event, levels in logged().items() if levels - {"debug"}}
    assert sorted(shown - listed()) == []


def test_the_scan_finds_the_events_it_must() -> None:
    # A pattern that matched nothing would pass both tests above.
    found = logged()
    assert {"relay.started", "relay.retry", "relay.deferred", "consumer.retry"} <= set(found)
    assert found["relay.window"] == {"debug"}
    assert "circuit.reopened" in found
