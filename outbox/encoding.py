"""Pure validation and encoding of what `enqueue` accepts. No database, no clock.

Everything here runs before a row is built, so a bad call never reaches the caller's transaction.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from outbox import jsonvalues
from outbox.errors import (
    HeadersTooLarge,
    InvalidDestination,
    InvalidHeader,
    InvalidOption,
    PayloadEncodingError,
    PayloadTooDeep,
    PayloadTooLarge,
)

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
BYTES_TYPE = "application/octet-stream"

# AMQP 0-9-1 short strings (exchange, routing key, header names, properties): <= 255 bytes.
SHORTSTR_MAX = 255
# Header values are signed 64-bit integers on the wire.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Stored in a 32-bit integer column.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# A delay beyond this is almost certainly a unit mistake (milliseconds passed as seconds).
MAX_DELAY = dt.timedelta(days=3650)
# Header names the relay sets itself; a caller-supplied one would be silently overwritten.
RESERVED_HEADERS = frozenset({"x-outbox-key", "traceparent", "tracestate"})
RESERVED_PREFIX = "x-outbox-"

HeaderValue = str | int | float | bool

# Encoded sizes in an AMQP field table (as outbox/amqp_codec.py writes it): a name is a shortstr
# (1 + bytes); a value is a type octet and then: str 4 + bytes, bool 1, int 4 when it fits in 32
# bits else 8, float 8 (a double).
INT32_TABLE = range(-(2**31), 2**31)


def _json_encoder(extra: jsonvalues.JsonDefault | None) -> json.JSONEncoder:
    return json.JSONEncoder(
        separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=jsonvalues.hook(extra)
    )


# json.dumps with these options would build an encoder per call: one, made once per configured
# json_default, does the same.
_JSON = _json_encoder(None)
_configured: tuple[jsonvalues.JsonDefault, json.JSONEncoder] | None = None


def _encoder(extra: jsonvalues.JsonDefault | None) -> json.JSONEncoder:
    global _configured
    if extra is None:
        return _JSON
    held = _configured
    if held is None or held[0] is not extra:
        held = _configured = (extra, _json_encoder(extra))
    return held[1]


@dataclass(frozen=True, slots=True)
class Encoded:
    body: bytes
    content_type: str


def encode_payload(
    payload: object,
    content_type: str | None,
    max_bytes: int,
    max_depth: int = 64,
    json_default: jsonvalues.JsonDefault | None = None,
) -> Encoded:
    """Turn a payload into bytes and the content type that describes them.

    A dict, a list, a dataclass or a pydantic model is JSON; inside it, the values of
    `outbox.jsonvalues` and whatever `json_default` converts."""
    if isinstance(payload, dict | list) or _is_record(payload):
        text, body = _json_text(payload, max_depth, json_default)
        # Brackets in the text bound the depth from above (strings may hold some too): most
        # payloads skip the walk, of the JSON itself (what converted values became included).
        if text.count("[") + text.count("{") > max_depth:
            check_depth("payload", json.loads(text), max_depth)
        derived = JSON_TYPE
    elif isinstance(payload, str):
        try:
            body = payload.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PayloadEncodingError(f"payload text is not valid UTF-8: {exc}") from exc
        derived = TEXT_TYPE
    elif isinstance(payload, bytes | bytearray | memoryview):
        body = bytes(payload)
        derived = BYTES_TYPE
    else:
        raise PayloadEncodingError(
            "payload must be dict, list, a dataclass, a pydantic model, str or bytes, "
            f"not {type(payload).__name__}"
        )
    if len(body) > max_bytes:
        raise PayloadTooLarge(
            f"payload is {len(body)} bytes encoded, over the limit of {max_bytes} bytes "
            "(raise it with outbox.configure(max_payload_bytes=...))"
        )
    return Encoded(body, _content_type(content_type) if content_type is not None else derived)


def _is_record(payload: object) -> bool:
    """A dataclass instance or a pydantic model: a JSON object as a payload of its own."""
    if isinstance(payload, str | bytes | bytearray | memoryview | int | float | type(None)):
        return False  # the common payloads, answered without a look at their class
    return jsonvalues.builtin_record(payload)


def _json_text(
    payload: object, max_depth: int, extra: jsonvalues.JsonDefault | None
) -> tuple[str, bytes]:
    try:
        text = _encoder(extra).encode(payload)
        return text, text.encode("utf-8")  # a lone surrogate fails here, not in the database
    except RecursionError:
        if isinstance(payload, dict | list):
            check_depth("payload", payload, max_depth)  # names the limit when it is lower
        raise PayloadTooDeep(
            "payload is nested too deep for JSON encoding (about 1,000 levels)"
        ) from None
    except Exception as exc:  # json's TypeError or ValueError, or json_default's own error
        found = jsonvalues.locate(payload, extra)
        if found is not None:
            cause = found.__cause__ or exc  # json_default's own error, when it raised
            raise PayloadEncodingError(f"payload cannot be encoded as JSON: {found}") from cause
        raise PayloadEncodingError(f"payload cannot be encoded as JSON: {exc}") from exc


def check_depth(what: str, value: object, limit: int) -> None:
    """Refuse JSON nested deeper than `limit` (json.dumps would hit RecursionError near 1,000,
    and a consumer's parser may have a lower limit still). Iterative: no recursion to exhaust."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise PayloadTooDeep(
                f"{what} is nested more than {limit} levels deep "
                "(raise the limit with outbox.configure(max_json_depth=...))"
            )
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, dict | list))


def value_size(value: HeaderValue) -> int:
    """The bytes a valid header value takes in an AMQP field table, type octet included."""
    if isinstance(value, str):
        return 5 + (len(value) if value.isascii() else len(value.encode("utf-8")))
    if isinstance(value, bool):
        return 2
    if isinstance(value, int):
        return 5 if value in INT32_TABLE else 9
    return 9  # float: a double


def name_size(name: str) -> int:
    return 1 + (len(name) if name.isascii() else len(name.encode("utf-8")))


def header_table_size(headers: Mapping[str, HeaderValue]) -> int:
    """The encoded size of a headers table of valid values, its 4-byte length included."""
    return 4 + sum(name_size(n) + value_size(v) for n, v in headers.items())


def check_header_size(
    headers: Mapping[str, HeaderValue] | None,
    *,
    key: str | None,
    traceparent: str | None,
    tracestate: str | None,
    limit: int,
) -> None:
    """Refuse headers whose table, with the ones the relay adds, encodes to more than `limit`."""
    if not headers:
        return  # the relay's own headers alone are under 1 KiB
    added: dict[str, HeaderValue] = {}
    if key is not None:
        added["x-outbox-key"] = key
    if traceparent:
        added["traceparent"] = traceparent
        if tracestate:
            added["tracestate"] = tracestate
    size = header_table_size(headers) + header_table_size(added) - 4
    if size > limit:
        raise HeadersTooLarge(
            f"headers encode to {size} bytes (with the relay's own), over the limit of {limit} "
            "bytes (raise it with outbox.configure(max_header_bytes=...))"
        )


def _content_type(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidOption(f"content_type must be a non-empty string, not {value!r}")
    _shortstr("content_type", value, InvalidOption)
    return value


def _text(what: str, value: str, error: type[Exception]) -> int:
    """The UTF-8 size of a text field the database stores as text; refuses what it cannot hold."""
    try:
        # ASCII text is its own UTF-8 (and holds no lone surrogate): no need to encode it.
        size = len(value) if value.isascii() else len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise error(f"{what} is not valid UTF-8: {exc}") from exc
    # PostgreSQL's text and jsonb cannot hold U+0000; refused on every database so a message
    # accepted on SQLite would be accepted on PostgreSQL too.
    if "\x00" in value:
        raise error(f"{what} contains a NUL character (U+0000), which the database cannot store")
    return size


def _shortstr(what: str, value: str, error: type[Exception]) -> None:
    size = _text(what, value, error)
    if size > SHORTSTR_MAX:
        raise error(f"{what} is {size} bytes, over AMQP's limit of {SHORTSTR_MAX}")


def check_destination(exchange: object, routing_key: object) -> None:
    if not isinstance(exchange, str):
        raise InvalidDestination(f"exchange must be a string, not {type(exchange).__name__}")
    if not isinstance(routing_key, str):
        raise InvalidDestination(f"routing_key must be a string, not {type(routing_key).__name__}")
    if exchange == "" and routing_key == "":
        raise InvalidDestination(
            "empty routing target: the default exchange ('') needs a queue name as routing_key"
        )
    _shortstr("exchange", exchange, InvalidDestination)
    _shortstr("routing_key", routing_key, InvalidDestination)


def check_headers(headers: Mapping[str, Any] | None) -> dict[str, HeaderValue] | None:
    """Validate caller headers; return a plain dict (or None when there are none)."""
    if headers is None:
        return None
    if not isinstance(headers, Mapping):
        raise InvalidHeader(f"headers must be a mapping, not {type(headers).__name__}")
    out: dict[str, HeaderValue] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not name:
            raise InvalidHeader(f"header names must be non-empty strings, not {name!r}")
        _shortstr(f"header name {name!r}", name, InvalidHeader)
        lowered = name.lower()
        if lowered in RESERVED_HEADERS or lowered.startswith(RESERVED_PREFIX):
            raise InvalidHeader(f"header {name!r} is reserved: the relay sets it")
        out[name] = _header_value(name, value)
    return out or None


def _header_value(name: str, value: object) -> HeaderValue:
    # bool before int: bool is an int subclass but travels as an AMQP boolean.
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise InvalidHeader(f"header {name!r}: integer {value} does not fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidHeader(f"header {name!r}: {value} is not a finite number")
        return value
    if isinstance(value, str):
        _text(f"header {name!r}: value", value, InvalidHeader)
        return value
    raise InvalidHeader(
        f"header {name!r}: value must be str, int, float or bool, not {type(value).__name__}"
    )


def check_delay(delay: object) -> dt.timedelta | None:
    if delay is None:
        return None
    if isinstance(delay, bool) or not isinstance(delay, int | float | dt.timedelta):
        raise InvalidOption(f"delay must be seconds or a timedelta, not {type(delay).__name__}")
    if isinstance(delay, dt.timedelta):
        td = delay
    else:
        if not math.isfinite(delay):
            raise InvalidOption(f"delay must be a finite number of seconds, not {delay}")
        if delay < 0:
            raise InvalidOption(f"delay must not be negative, got {delay}")
        if delay > MAX_DELAY.total_seconds():
            raise InvalidOption(f"delay of {delay} s is over the maximum of {MAX_DELAY.days} days")
        td = dt.timedelta(seconds=delay)
    if td < dt.timedelta(0):
        raise InvalidOption(f"delay must not be negative, got {td}")
    if td > MAX_DELAY:
        raise InvalidOption(f"delay of {td} is over the maximum of {MAX_DELAY.days} days")
    return td or None


def check_text_option(what: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidOption(f"{what} must be a non-empty string or None, not {value!r}")
    _shortstr(what, value, InvalidOption)
    return value


def check_int_option(what: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"{what} must be an integer, not {type(value).__name__}")
    if not max(minimum, INT32_MIN) <= value <= INT32_MAX:
        raise InvalidOption(f"{what} must be between {max(minimum, INT32_MIN)} and {INT32_MAX}")
    return value


@dataclass(frozen=True, slots=True)
class UnreadableJson:
    """Stored JSON that does not decode, in place of its value.

    A store decodes a row's JSON while fetching a whole claim; raising there would fail every
    row of it. This value carries the row's problem on to the relay's per-row checks instead,
    where only that row is dead-lettered.
    """

    reason: str

    def __str__(self) -> str:
        return f"<unreadable JSON: {self.reason}>"


def load_stored_json(text: str | bytes) -> Any:
    """json.loads that never raises: a value that does not decode becomes UnreadableJson (a
    store's json_deserializer; a hand-edited row may hold anything)."""
    if text == b"null" or text == "null":
        return None  # a message without headers: most rows a claim reads
    try:
        return json.loads(text)
    except RecursionError:
        return UnreadableJson("nested too deep to decode")
    except (ValueError, TypeError) as exc:  # JSONDecodeError, bad UTF-8, not text at all
        return UnreadableJson(f"not JSON ({exc})")
