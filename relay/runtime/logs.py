"""Logs as one line per event: a stable event name, then key=value fields (logfmt)."""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import time
from collections.abc import Iterable

from relay.core.urls import redact

# The levels an operator may choose (--log-level, OUTBOX_LOG_LEVEL).
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# The longest one-line message (an error line, a crash's reason): a driver's error can quote a
# whole statement.
MAX_LINE = 600
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
# The database a thread works for, when one relay serves several (relay/runtime/tenants.py): every
# line it logs says `database=NAME`. Threads it starts take it with them (contextvars.copy_context).
DATABASE: contextvars.ContextVar[str | None] = contextvars.ContextVar("database", default=None)
_make_record = logging.getLogRecordFactory()


def _record(*args: object, **kwargs: object) -> logging.LogRecord:
    record = _make_record(*args, **kwargs)
    name = DATABASE.get()
    if name is not None and "database" not in record.__dict__:
        record.database = name
    return record


logging.setLogRecordFactory(_record)


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [f"{ts}.{int(record.msecs):03d}Z", record.levelname.lower(), record.getMessage()]
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                parts.append(f"{key}={_quote(value)}")
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def _quote(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n'):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # pika logs each failed connection step as an error, several lines per attempt; the relay
    # reports the failure itself, once, in its own words. Shown again at DEBUG.
    if root.level > logging.DEBUG:
        logging.getLogger("pika").setLevel(logging.CRITICAL)


def printable(text: str, keep: str = "") -> str:
    """`text` with every character a terminal would act on written as an escape (`\\x1b`,
    `\\u202e`), so a stored routing key or error cannot move the cursor, clear the line or
    reorder what is shown. Characters in `keep` (say, a payload's newlines) stay."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


# A URL quoted in a message: a value typed into the wrong flag, or a driver's error.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


def one_line(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` as one printable line of at most MAX_LINE characters, with the passwords of any
    URL it quotes and each of `secrets` masked (a driver's message may quote one)."""
    text = _URL.sub(lambda m: redact(m.group(0)), text)
    for secret in secrets:
        text = text.replace(secret, "***")
    line = printable(" ".join(text.split()))
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…"
