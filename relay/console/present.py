"""Rows as the API returns them (JSON-ready, as `--json` writes them:
relay/runtime/message_rows.py), and a payload as a person reads it: pretty JSON, text, or a hex
dump of bytes."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from relay.ports import ResourceRow
from relay.runtime.message_rows import jsonable

# The most of a payload a page or the API shows (the rest is counted, not sent).
SHOWN_BYTES = 64 * 1024
HEX_ROW = 16
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


@dataclass(frozen=True, slots=True)
class Payload:
    kind: str  # "json", "text" or "bytes"
    text: str  # what to show: indented JSON, the text, or a hex dump
    size: int  # bytes stored
    truncated: bool  # only the first SHOWN_BYTES are shown


def payload(raw: Any, content_type: str | None) -> Payload:
    """How to show a stored payload: JSON indented when it is JSON, UTF-8 text as text, other
    bytes as a hex dump. A hand-edited row may hold text or NULL where bytes belong."""
    data = _bytes(raw)
    shown = data[:SHOWN_BYTES]
    cut = len(data) > SHOWN_BYTES
    text = _utf8(shown, cut)
    if text is None:
        return Payload("bytes", hex_dump(shown), len(data), cut)
    if not cut and "json" in (content_type or "").lower():
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):
            pass
        else:
            return Payload("json", pretty, len(data), cut)
    return Payload("text", text, len(data), cut)


def _utf8(data: bytes, cut: bool) -> str | None:
    # A cut may split a character: up to three bytes of it may be left at the end.
    for trim in range(4 if cut else 1):
        try:
            return data[: len(data) - trim].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def _bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return bytes(value)


def hex_dump(data: bytes) -> str:
    """Offset, hex bytes, and printable ASCII, sixteen bytes a line."""
    lines = []
    for start in range(0, len(data), HEX_ROW):
        chunk = data[start : start + HEX_ROW]
        ascii_ = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {chunk.hex(' '):<{HEX_ROW * 3 - 1}}  {ascii_}")
    return "\n".join(lines)


def trace_id(traceparent: Any) -> str | None:
    """The trace id of a stored W3C traceparent, when it is one (only then is it linked)."""
    if not isinstance(traceparent, str):
        return None
    found = _TRACEPARENT.match(traceparent.strip())
    return found.group(1) if found else None


def message(row: Mapping[str, Any], trace_url: str | None) -> dict[str, Any]:
    """One message for the API: every field, its payload shown, its trace linked."""
    out = {k: v for k, v in row.items() if k not in ("payload", "seq", "lease_token")}
    shown = payload(row.get("payload"), row.get("content_type"))
    out["payload"] = {
        "kind": shown.kind,
        "text": shown.text,
        "size": shown.size,
        "truncated": shown.truncated,
    }
    tid = trace_id(row.get("traceparent"))
    out["trace_id"] = tid
    out["trace_url"] = trace_url.replace("{trace_id}", tid) if trace_url and tid else None
    result: dict[str, Any] = jsonable(out)
    return result


def resource(r: ResourceRow, now: dt.datetime) -> dict[str, Any]:
    c = r.circuit
    opens_in = None
    if c.state.value == "open" and c.open_until is not None:
        opens_in = round(max(0.0, (c.open_until - now).total_seconds()), 1)
    result: dict[str, Any] = jsonable(
        {
            "resource": c.resource,
            "state": c.state.value,
            "failures": c.failures,
            "opens_in_s": opens_in,
            "probe_owner": c.probe_owner,
            "last_error": c.last_error,
            "changed_at": c.changed_at,
            "rate_tokens": None if r.bucket.tokens is None else round(r.bucket.tokens, 2),
        }
    )
    return result
