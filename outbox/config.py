"""Process-wide settings of the library side (the relay has its own, in `relay.runtime.config`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class LibrarySettings:
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    # PostgreSQL: wake an idle relay with NOTIFY, at most once per notify_interval per process.
    # NOTIFY takes a cluster-wide lock at commit, so it is rationed, not sent per message; a busy
    # relay is polling every few milliseconds anyway.
    notify: bool = True
    notify_interval: float = 0.1


def _from_env() -> LibrarySettings:
    notify = os.environ.get("OUTBOX_NOTIFY", "1").lower() not in ("0", "false", "no")
    raw = os.environ.get("OUTBOX_MAX_PAYLOAD_BYTES")
    if raw is None:
        return LibrarySettings(notify=notify)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"OUTBOX_MAX_PAYLOAD_BYTES must be an integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"OUTBOX_MAX_PAYLOAD_BYTES must be positive, got {value}")
    return LibrarySettings(max_payload_bytes=value, notify=notify)


_settings = _from_env()


def settings() -> LibrarySettings:
    return _settings


def configure(
    *,
    max_payload_bytes: int | None = None,
    notify: bool | None = None,
    notify_interval: float | None = None,
) -> LibrarySettings:
    """Change library settings for this process; returns the settings now in force."""
    global _settings
    if max_payload_bytes is not None:
        if isinstance(max_payload_bytes, bool) or not isinstance(max_payload_bytes, int):
            raise TypeError("max_payload_bytes must be an integer")
        if max_payload_bytes < 1:
            raise ValueError("max_payload_bytes must be positive")
        _settings = replace(_settings, max_payload_bytes=max_payload_bytes)
    if notify is not None:
        _settings = replace(_settings, notify=bool(notify))
    if notify_interval is not None:
        if notify_interval < 0:
            raise ValueError("notify_interval must not be negative")
        _settings = replace(_settings, notify_interval=float(notify_interval))
    return _settings
