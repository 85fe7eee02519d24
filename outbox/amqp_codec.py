"""Float header values on the wire, which pika cannot do by itself, without patching pika for all.

The contract lets headers be floats, and AMQP 0-9-1 has a type for them (a double, 'd'), but
pika's table encoder rejects floats and its decoder truncates doubles to integers.

Encoding is per message: `Properties` is a `pika.BasicProperties` whose headers table is written
by `encode_table` (floats as doubles, everything else exactly as pika writes it). The relay's
publisher and the consumer's retry and dead-letter copies build their properties with it; pika's
own encoder, and every other publisher in the process, stay as they are.

Decoding cannot be per message: pika decodes a delivery's properties before any code of ours
sees it, and the truncation loses the value. `install_float_decoding()` makes pika decode doubles
(and single floats) as Python floats, process-wide and from then on; every other type decodes as
before. `outbox.Processor` (and so `outbox.Consumer`) calls it when it is constructed, so every
message it handles sees floats as floats; a process that builds neither keeps pika's decoder.

The relay imports this module too: `outbox` never imports `relay`, and one codec serves both.
"""

from __future__ import annotations

import copy
import struct
from typing import Any

import pika
import pika.data

_pika_decode_value = pika.data.decode_value  # pika's own, captured before anything replaces it


def encode_value(pieces: list[bytes], value: Any) -> int:
    """pika's `encode_value`, with floats as AMQP doubles (also inside nested tables and arrays)."""
    if isinstance(value, float):
        pieces.append(struct.pack(">cd", b"d", value))
        return 9
    if isinstance(value, dict):
        pieces.append(b"F")
        return 1 + encode_table(pieces, value)
    if isinstance(value, list):
        items: list[bytes] = []
        for item in value:
            encode_value(items, item)
        body = b"".join(items)
        pieces.append(struct.pack(">cI", b"A", len(body)))
        pieces.append(body)
        return 5 + len(body)
    return int(pika.data.encode_value(pieces, value))


def encode_table(pieces: list[bytes], table: dict[str, Any] | None) -> int:
    """pika's `encode_table`, with `encode_value` above for the values."""
    entries: list[bytes] = []
    size = 0
    for key, value in (table or {}).items():
        size += pika.data.encode_short_string(entries, key)
        size += encode_value(entries, value)
    pieces.append(struct.pack(">I", size))
    pieces.extend(entries)
    return size + 4


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_float(item) for item in value)
    return False


class Properties(pika.BasicProperties):  # type: ignore[misc]  # pika ships no type hints
    """`pika.BasicProperties` whose headers may hold floats, sent as AMQP doubles."""

    def encode(self) -> list[bytes]:
        if self.headers is None or not _has_float(self.headers):
            # pika writes every other value as encode_value would (tests/unit/test_outbox_codec.py
            # compares the bytes), and more cheaply: this runs for every message sent.
            return list(pika.BasicProperties.encode(self))
        # pika writes everything but the headers; the headers table goes where AMQP puts it,
        # after content-type and content-encoding (the property list's order is fixed by the
        # spec), and its flag bit is set in the first flag word, where AMQP defines it.
        bare = copy.copy(self)
        bare.headers = None
        pieces: list[bytes] = list(pika.BasicProperties.encode(bare))
        (flags,) = struct.unpack(">H", pieces[0])
        pieces[0] = struct.pack(">H", flags | pika.BasicProperties.FLAG_HEADERS)
        before: list[bytes] = []
        for value in (self.content_type, self.content_encoding):
            if value is not None:
                pika.data.encode_short_string(before, value)
        table: list[bytes] = []
        encode_table(table, self.headers)
        at = 1 + len(before)
        return pieces[:at] + table + pieces[at:]


def decode_value(encoded: bytes, offset: int) -> tuple[Any, int]:
    """pika's `decode_value`, with AMQP doubles and floats decoded as floats, not truncated."""
    kind = encoded[offset : offset + 1]
    if kind == b"d":
        return struct.unpack_from(">d", encoded, offset + 1)[0], offset + 9
    if kind == b"f":
        return struct.unpack_from(">f", encoded, offset + 1)[0], offset + 5
    return _pika_decode_value(encoded, offset)  # type: ignore[no-any-return]


def install_float_decoding() -> None:
    """From now on, pika decodes float header values as floats in this whole process. Idempotent.

    pika's tables call the module's `decode_value` for every value, nested ones included, so
    replacing that one function is enough; values of every other type decode as before.
    """
    if pika.data.decode_value is not decode_value:
        pika.data.decode_value = decode_value


def float_decoding_installed() -> bool:
    return pika.data.decode_value is decode_value
