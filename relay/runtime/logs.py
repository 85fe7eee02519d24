"""Logs as one line per event: a stable event name, then key=value fields (logfmt)."""

from __future__ import annotations

import logging
import sys
import time

# The levels an operator may choose (--log-level, OUTBOX_LOG_LEVEL).
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


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
