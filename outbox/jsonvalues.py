"""The values a JSON payload may hold beyond JSON's own, and how each becomes JSON.

Pure: no database, no clock. `to_json` is the encoder's `default` hook: it turns one object
the standard encoder does not know into something it does (a str, a dict...), which the encoder
then encodes as usual, so nested values convert too. A payload that fails is walked once more
by `locate`, only then, to name the value that failed and where it is.

The forms are those of the standard library's `isoformat()` and `str()`, as orjson and FastAPI
send them too: lossless (microseconds kept, an aware value's UTC offset as `+HH:MM`, a naive one
without any) and read back by `datetime.fromisoformat`, `uuid.UUID` and `decimal.Decimal`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import math
import sys
import uuid
from collections.abc import Callable
from typing import Any

JsonDefault = Callable[[Any], Any]

# Objects the default hook converts, as named in error messages.
HANDLED = "datetime, date, time, UUID, Decimal, enums, dataclasses and pydantic models"
_KEY_TYPES = (str, int, float, bool, type(None))
_SCALARS = (str, int, float, bool, type(None))
# Deeper than json.dumps itself goes (about 1,000 levels): past it, locate() stops looking.
_WALK_LIMIT = 1200


class Unencodable(Exception):
    """A value no hook converts, at `path`: `reason` says why (the error's own message)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def builtin(value: object) -> tuple[bool, object]:
    """(True, its JSON form) for a value outbox converts itself, else (False, None)."""
    # datetime before date: a datetime is a date too.
    if isinstance(value, dt.date | dt.time):
        return True, value.isoformat()
    if isinstance(value, uuid.UUID):
        return True, str(value)
    if isinstance(value, decimal.Decimal):
        # A string, never a float: a float would round 0.1 and lose a price's trailing zeros.
        return True, str(value)
    if isinstance(value, enum.Enum):
        return True, value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Field by field, not dataclasses.asdict(): that deep-copies every value; the encoder
        # converts the nested ones as it meets them.
        return True, {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    # A pydantic model can exist only once pydantic is imported: never import it here.
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return True, value.model_dump(mode="json")
    return False, None


def builtin_record(value: object) -> bool:
    """Whether `value` is a dataclass instance or a pydantic model (a JSON object)."""
    if dataclasses.is_dataclass(value):
        return not isinstance(value, type)
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, pydantic.BaseModel)


def hook(extra: JsonDefault | None) -> JsonDefault:
    """The encoder's `default`: outbox's conversions, then `extra` (the configured
    json_default) for what they do not handle."""

    def to_json(value: object) -> object:
        handled, converted = builtin(value)
        if handled:
            return converted
        if extra is not None:
            return extra(value)
        raise TypeError(f"{type(value).__name__} is not JSON-encodable")

    return to_json


def locate(payload: object, extra: JsonDefault | None) -> Unencodable | None:
    """The first value of `payload` that does not encode, and its path (for example
    `payload["lines"][2]["price"]`); None when the walk finds none (json would then have failed
    for a reason of its own)."""
    try:
        _walk(payload, "payload", extra, set(), 0)
    except Unencodable as found:
        return found
    return None


def _walk(value: object, path: str, extra: JsonDefault | None, seen: set[int], depth: int) -> None:
    if depth > _WALK_LIMIT:
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Unencodable(path, f"{value} is not a JSON number")
        return
    if isinstance(value, _SCALARS):
        return
    if id(value) in seen:
        raise Unencodable(path, "refers back to itself (a circular reference)")
    if isinstance(value, dict):
        seen.add(id(value))
        for key, item in value.items():
            if not isinstance(key, _KEY_TYPES):
                raise Unencodable(
                    path,
                    f"the key {key!r} is a {type(key).__name__} (JSON keys are strings, "
                    "numbers, booleans or None: convert it with str() first)",
                )
            _walk(item, f"{path}[{key!r}]", extra, seen, depth + 1)
        seen.discard(id(value))
        return
    if isinstance(value, list | tuple):
        seen.add(id(value))
        for index, item in enumerate(value):
            _walk(item, f"{path}[{index}]", extra, seen, depth + 1)
        seen.discard(id(value))
        return
    converted = _convert(value, path, extra)
    seen.add(id(value))
    _walk(converted, path, extra, seen, depth + 1)
    seen.discard(id(value))


def _convert(value: object, path: str, extra: JsonDefault | None) -> object:
    name = type(value).__name__
    try:
        handled, converted = builtin(value)
    except Exception as exc:  # a pydantic model that does not serialize, for one
        raise Unencodable(path, f"{name} did not convert to JSON: {exc}") from exc
    if handled:
        return converted
    if extra is None:
        raise Unencodable(
            path,
            f"{name} is not JSON-encodable (outbox encodes {HANDLED}; add others with "
            "outbox.configure(json_default=...))",
        )
    try:
        return extra(value)
    except Exception as exc:
        raise Unencodable(
            path, f"{name} is not JSON-encodable: json_default raised {type(exc).__name__}: {exc}"
        ) from exc
