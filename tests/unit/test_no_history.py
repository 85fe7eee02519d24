"""The README, the docs site and the code's comments say what is true now, not when it was found.

Measurements and the story of how a choice was reached belong in commit messages and in the
benchmarks' output; a comment gives the reason for a choice, a page describes the project as it
is. This looks for the wording that gives history away: a date, a time of day, a work session, a
document that is not in the repository, an earlier version. Timestamps with a time of day
(`2026-11-22T08:00`, `2026-11-23 14:00:00`) are examples of input or output, not history, and
pass. The performance page and the changelog are about what was measured and when: not checked.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.docs_blocks import DOCS, README, ROOT

HISTORY = [
    # A date that is not part of a timestamp: "measured on 2026-11-26".
    re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b(?![T ]\d\d:)"),
    re.compile(r"\b(this|that) (morning|afternoon|evening)\b", re.I),
    re.compile(r"\bthat day\b", re.I),
    re.compile(r"\bthe (morning|afternoon|evening|day)'s\b", re.I),
    # A work session (a SQLAlchemy session is "the session", "a session", "the session's").
    re.compile(r"\b(previous|last|earlier|later|prior) sessions?\b", re.I),
    re.compile(r"\bthis session's\b", re.I),
    # A design document kept outside the repository.
    re.compile(r"field[- ]notes|shared/design", re.I),
    # What an earlier version did ("an index an earlier version created"); a rule that names
    # "earlier versions' figures" is not history.
    re.compile(r"\b(an|the|in|of|by) earlier versions?\b", re.I),
]

# What was measured and when is what these pages are for.
HISTORICAL_PAGES = {DOCS / "performance.md", DOCS / "changelog.md", ROOT / "CHANGELOG.md"}
CODE = ("outbox", "relay", "benchmarks")


def _pages() -> list[Path]:
    found = [README, *sorted(DOCS.rglob("*.md"))]
    # docs/_generated/ holds make bench's tables, each dated: the performance page includes them.
    generated = DOCS / "_generated"
    return [
        p for p in found if p.exists() and p not in HISTORICAL_PAGES and generated not in p.parents
    ]


def _sources() -> list[Path]:
    return sorted(p for top in CODE for p in (ROOT / top).rglob("*.py"))


def _prose(source: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file: (line number, text) per line."""
    lines: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            lines.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                lines.extend((first + i, text) for i, text in enumerate(doc.splitlines()))
    return lines


def _history(lines: list[tuple[int, str]]) -> list[str]:
    return [
        f"{number}: {found.group(0)!r} in {text.strip()[:100]!r}"
        for number, text in lines
        for pattern in HISTORY
        if (found := pattern.search(text))
    ]


def _listed(found: list[str], most: int = 20) -> str:
    more = f"; and {len(found) - most} more" if len(found) > most else ""
    return "; ".join(found[:most]) + more


@pytest.mark.parametrize("path", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_say_what_is_true_now(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = _history(list(enumerate(text.splitlines(), start=1)))
    assert not found, (
        f"{path.relative_to(ROOT)} tells history (say what is true now; figures go on "
        "docs/performance.md): " + _listed(found)
    )


def test_comments_and_docstrings_say_what_is_true_now() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{where}"
        for path in _sources()
        for where in _history(_prose(path.read_text(encoding="utf-8")))
    ]
    assert not found, (
        "comments and docstrings tell history (give the reason for a choice; the measurement "
        "behind it goes in the commit message): " + _listed(found)
    )


@pytest.mark.parametrize(
    "text",
    [
        "measured on 2026-11-26",
        "the run that afternoon",
        "as the previous session's run showed",
        "see field-notes.md",
        "an index an earlier version created",
        "the day's final code",
    ],
)
def test_history_is_recognised(text: str) -> None:
    assert _history([(1, text)])


@pytest.mark.parametrize(
    "text",
    [
        "outbox-relay reschedule ID --at 2026-11-23T08:00Z",
        "'Reschedule 3 messages to 2026-11-23 14:00:00 UTC'",
        "enqueue joins the session's transaction",
        "the broker ended the TLS session before the AMQP handshake",
        "pass a Session or a Connection",
        "No dated runs or earlier versions' figures in the docs",
    ],
)
def test_what_is_not_history_passes(text: str) -> None:
    assert not _history([(1, text)])
