"""Process-wide settings of the library side (the relay has its own, in `relay.runtime.config`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
# JSON nested deeper than this is refused: json.dumps fails near 1,000 levels, and consumers'
# parsers often stop far sooner.
DEFAULT_MAX_JSON_DEPTH = 64
# The encoded AMQP headers table (the relay's own headers included): it travels in one frame
# with the other properties, and RabbitMQ's frame_max is 128 KiB by default; a message whose
# header frame is larger could never be published.
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
# NOTIFYs per second per process, and how many may go at once: a steady 100 msg/s notifies on
# every message, and a flood of commits no more often than that. Each notifying commit holds the
# lock through its WAL flush, so the cost grows with the rate times the commit time
# (benchmarks/enqueue_cost.py measures it with 8 writers).
DEFAULT_NOTIFY_RATE = 100.0
DEFAULT_NOTIFY_BURST = 10
# How enqueue hands messages to the relay on PostgreSQL: rows of outbox_message ("table"), or
# messages in the write-ahead log that the relay reads from its replication slot ("logical").
TABLE, LOGICAL = "table", "logical"
CAPTURES = (TABLE, LOGICAL)
DEFAULT_CAPTURE_SLOT = "outbox_relay"
# A slot name as PostgreSQL takes it unquoted (and as the relay's `capture setup` makes it).
_SLOT_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_SLOT_RULE = (
    "a slot name is 1 to 63 lower-case letters, digits and underscores, not starting with a digit"
)


@dataclass(frozen=True, slots=True)
class LibrarySettings:
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    # PostgreSQL: wake an idle relay with NOTIFY, at most notify_rate times a second per
    # process (bursts of notify_burst). NOTIFY takes a cluster-wide lock at commit, so a flood of
    # commits is rationed (outbox/ration.py); a relay that busy is polling every few ms anyway.
    notify: bool = True
    notify_rate: float = DEFAULT_NOTIFY_RATE
    notify_burst: int = DEFAULT_NOTIFY_BURST
    # Called with each value of a JSON payload that outbox does not encode itself
    # (outbox/jsonvalues.py); returns something that encodes.
    json_default: Callable[[Any], Any] | None = None
    # "logical": on PostgreSQL, enqueue writes each message into the transaction's WAL
    # (outbox/pg_emit.py), for a relay reading the slot capture_slot; "table": rows, as elsewhere.
    capture: str = TABLE
    capture_slot: str = DEFAULT_CAPTURE_SLOT


# Positive integer settings and their environment variables.
_LIMITS = {
    "max_payload_bytes": "OUTBOX_MAX_PAYLOAD_BYTES",
    "max_json_depth": "OUTBOX_MAX_JSON_DEPTH",
    "max_header_bytes": "OUTBOX_MAX_HEADER_BYTES",
}


def _from_env() -> LibrarySettings:
    notify = os.environ.get("OUTBOX_NOTIFY", "1").lower() not in ("0", "false", "no")
    limits: dict[str, Any] = {}
    for field, variable in _LIMITS.items():
        raw = os.environ.get(variable)
        if raw is None:
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{variable} must be an integer, got {raw!r}") from None
        if value < 1:
            raise ValueError(f"{variable} must be positive, got {value}")
        limits[field] = value
    # Read as the relay reads the same variables (relay/runtime/settings.py): stripped, and
    # empty as unset, so one environment means one mode on both sides.
    capture = os.environ.get("OUTBOX_CAPTURE", "").strip() or TABLE
    if capture not in CAPTURES:
        raise ValueError(f"OUTBOX_CAPTURE must be one of {', '.join(CAPTURES)}, got {capture!r}")
    slot = os.environ.get("OUTBOX_CAPTURE_SLOT", "").strip() or DEFAULT_CAPTURE_SLOT
    if _SLOT_NAME.fullmatch(slot) is None:
        raise ValueError(f"OUTBOX_CAPTURE_SLOT: {_SLOT_RULE}, got {slot!r}")
    return LibrarySettings(notify=notify, capture=capture, capture_slot=slot, **limits)


_settings = _from_env()


def settings() -> LibrarySettings:
    return _settings


def reset() -> LibrarySettings:
    """Put every setting back as the process started (environment included), json_default
    removed; return them. For tests that configure and must leave nothing behind."""
    global _settings
    _settings = _from_env()
    return _settings


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer")
    if value < 1:
        raise ValueError(f"{name} must be positive")
    return value


def configure(
    *,
    max_payload_bytes: int | None = None,
    max_json_depth: int | None = None,
    max_header_bytes: int | None = None,
    notify: bool | None = None,
    notify_rate: float | None = None,
    notify_burst: int | None = None,
    json_default: Callable[[Any], Any] | None = None,
    capture: str | None = None,
    capture_slot: str | None = None,
) -> LibrarySettings:
    """Change the library's settings for this process; return the settings now in force.

    Arguments left as None keep their current value. The limits start from the environment
    (`OUTBOX_MAX_PAYLOAD_BYTES`, `OUTBOX_MAX_JSON_DEPTH`, `OUTBOX_MAX_HEADER_BYTES`,
    `OUTBOX_NOTIFY=0` to turn NOTIFY off, `OUTBOX_CAPTURE`, `OUTBOX_CAPTURE_SLOT`) and apply to
    every later `enqueue` and `enqueue_async` in the process.

    Args:
        max_payload_bytes: The largest encoded payload `enqueue` accepts (default 1 MiB);
            larger raises `PayloadTooLarge`.
        max_json_depth: The deepest nesting of a JSON payload (default 64); deeper raises
            `PayloadTooDeep`, a `PayloadEncodingError`.
        max_header_bytes: The largest encoded AMQP headers table, the relay's own headers
            included (default 16 KiB); larger raises `HeadersTooLarge`, an `InvalidHeader`.
            The headers travel in one frame, which must fit the broker's frame_max (128 KiB
            by default) or the message can never be published.
        notify: PostgreSQL only: whether a commit that enqueued wakes an idle relay with
            NOTIFY (default True). Without it the relay finds new messages at its next poll.
        notify_rate: NOTIFYs per second at most, per process (default 100); `math.inf`
            notifies on every commit. Every notifying commit takes PostgreSQL's cluster-wide
            notification lock, so a flood of commits is rationed; a relay that busy is
            polling often anyway.
        notify_burst: How many commits close together may each notify before the rate
            applies (default 10).
        json_default: A function called with each value of a JSON payload that outbox does
            not encode itself (it encodes `datetime`, `date`, `time`, `UUID`, `Decimal`, enums,
            dataclasses and pydantic models); it returns something JSON can encode, or raises
            `TypeError` to refuse it. A refused value raises `PayloadEncodingError`, naming
            its type and where it is in the payload. It replaces the function set before;
            `outbox.config.reset()` removes it.
        capture: How the relay learns of messages on PostgreSQL: `"table"` (the default), a
            row in outbox_message; `"logical"`, a transactional message in the transaction's
            write-ahead log (`pg_logical_emit_message`), which a relay run with
            `--capture logical` reads from its replication slot, and no row (a message with
            an idempotency key or a delay gets a held row too). No NOTIFY is sent. MySQL,
            MariaDB and SQLite write rows either way. The first logical enqueue of a process
            on a database checks that the slot exists, and raises `CaptureNotSetUp` if not.
        capture_slot: The relay's replication slot that logical capture checks for (default
            `outbox_relay`).

    Returns:
        The settings in force after the change.

    Raises:
        TypeError: A value has the wrong type (json_default is not callable).
        ValueError: A limit or rate is not positive, capture is neither "table" nor
            "logical", or capture_slot cannot name a slot.
    """
    global _settings
    limits = {
        "max_payload_bytes": max_payload_bytes,
        "max_json_depth": max_json_depth,
        "max_header_bytes": max_header_bytes,
    }
    changes: dict[str, Any] = {n: _positive(n, v) for n, v in limits.items() if v is not None}
    if notify is not None:
        changes["notify"] = bool(notify)
    if notify_rate is not None:
        # math.inf: every commit notifies.
        if isinstance(notify_rate, bool) or not isinstance(notify_rate, int | float):
            raise TypeError("notify_rate must be a number (NOTIFYs per second)")
        if not notify_rate > 0:
            raise ValueError(
                f"notify_rate must be positive, got {notify_rate} (notify=False turns NOTIFY off)"
            )
        changes["notify_rate"] = float(notify_rate)
    if notify_burst is not None:
        changes["notify_burst"] = _positive("notify_burst", notify_burst)
    if json_default is not None:
        if not callable(json_default):
            raise TypeError(
                f"json_default must be a function of one value, not {type(json_default).__name__}"
            )
        changes["json_default"] = json_default
    if capture is not None:
        if capture not in CAPTURES:
            raise ValueError(f"capture must be one of {', '.join(CAPTURES)}, got {capture!r}")
        changes["capture"] = capture
    if capture_slot is not None:
        if not isinstance(capture_slot, str):
            raise TypeError(f"capture_slot must be a string, not {type(capture_slot).__name__}")
        if _SLOT_NAME.fullmatch(capture_slot) is None:
            raise ValueError(f"capture_slot: {_SLOT_RULE}, got {capture_slot!r}")
        changes["capture_slot"] = capture_slot
    _settings = replace(_settings, **changes)
    return _settings
