"""Float header values on the wire, which pika cannot do by itself.

The contract lets headers be floats, and AMQP 0-9-1 has a type for them (a double, 'd'), but
pika's table encoder rejects floats and its decoder truncates doubles to integers. This wraps
both so floats travel as doubles and come back as floats; every other value is left to pika,
so nothing that worked before changes. The publisher installs it when it is imported.
"""

from __future__ import annotations

import struct
from typing import Any

import pika.data

_original_encode = pika.data.encode_value
_original_decode = pika.data.decode_value


def _encode_value(pieces: list[bytes], value: Any) -> int:
    if isinstance(value, float):
        pieces.append(struct.pack(">cd", b"d", value))
        return 9
    return int(_original_encode(pieces, value))


def _decode_value(encoded: bytes, offset: int) -> tuple[Any, int]:
    kind = encoded[offset : offset + 1]
    if kind == b"d":
        return struct.unpack_from(">d", encoded, offset + 1)[0], offset + 9
    if kind == b"f":
        return struct.unpack_from(">f", encoded, offset + 1)[0], offset + 5
    return _original_decode(encoded, offset)  # type: ignore[no-any-return]


def install() -> None:
    if pika.data.encode_value is not _encode_value:
        pika.data.encode_value = _encode_value
        pika.data.decode_value = _decode_value
