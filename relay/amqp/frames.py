"""A message's AMQP 0-9-1 frames, written by the relay itself.

pika builds every publish from objects: a `Basic.Publish` method, a `BasicProperties` encoded
field by field, three frame objects marshalled one by one. For small messages that is most of
the relay's own CPU per message. The relay sends one kind of message only (basic.publish,
mandatory, with six properties at most), so it encodes the parts once per message, when the row
becomes a message (relay/amqp/wire.py), and frames them with the channel's number when it sends
(`frame`): a few `struct.pack` calls. pika still owns the connection, the channels, confirms,
returns and heartbeats, and writes these bytes to its socket like its own.

The layout is the specification's (AMQP 0-9-1, 4.2.3 frames, 4.2.6 content; the Basic class's
property flags); tests/unit/test_amqp_frames.py checks it against pika's own encoder.
"""

from __future__ import annotations

import struct
from typing import Any

import pika

from outbox.amqp_codec import encode_table, install_float_decoding

_METHOD, _HEADER, _BODY = 1, 2, 3  # frame types
_END = b"\xce"
_FRAME = struct.Struct(">BHI")  # type, channel, payload size
_FRAME_OVERHEAD = _FRAME.size + len(_END)
BASIC = 60
_PUBLISH = struct.pack(">HHH", BASIC, 40, 0)  # class, method basic.publish, reserved ticket
_MANDATORY = b"\x01"  # the bits: mandatory set, immediate clear

# The Basic class's property flags, in the order the properties follow them.
CONTENT_TYPE = 1 << 15
CONTENT_ENCODING = 1 << 14
HEADERS = 1 << 13
DELIVERY_MODE = 1 << 12
MESSAGE_ID = 1 << 7
TIMESTAMP = 1 << 6


def shortstr(text: str) -> bytes:
    """An AMQP short string (the caller has checked it fits in 255 bytes)."""
    raw = text.encode("utf-8")
    return bytes((len(raw),)) + raw


def publish_method(exchange: str, routing_key: str) -> bytes:
    """The payload of a basic.publish method frame, mandatory."""
    return _PUBLISH + shortstr(exchange) + shortstr(routing_key) + _MANDATORY


def content_fields(content_type: str, content_encoding: str) -> bytes:
    """The content type and content encoding properties, encoded (`properties` takes them)."""
    return shortstr(content_type) + shortstr(content_encoding)


# The Basic class's content header up to its properties: class, weight (0), body size, flags.
_HEADER_START = struct.Struct(">HHQH")
_BODY_SIZE = struct.Struct(">HHQ")  # the same without the flags
_BARE = CONTENT_TYPE | CONTENT_ENCODING | DELIVERY_MODE | MESSAGE_ID | TIMESTAMP
_WITH_HEADERS = _BARE | HEADERS
_PERSISTENT = b"\x02"  # delivery mode 2: the broker writes the message to disk
_TIMESTAMP = struct.Struct(">Q")


def header(
    body_size: int, *, content: bytes, headers: dict[str, Any] | None, message_id: str,
    timestamp: int,
) -> bytes:  # fmt: skip
    """The payload of a persistent message's content header frame, for a body of `body_size`
    bytes: `content` from `content_fields`, then the headers (floats as doubles), the delivery
    mode, the message id and the timestamp. One join: this runs once a message."""
    mid = message_id.encode("utf-8")
    if not headers:
        start = _HEADER_START.pack(BASIC, 0, body_size, _BARE)
        return b"".join((start, content, _PERSISTENT, bytes((len(mid),)), mid,
                         _TIMESTAMP.pack(timestamp)))  # fmt: skip
    pieces = [_HEADER_START.pack(BASIC, 0, body_size, _WITH_HEADERS), content]
    encode_table(pieces, headers)
    pieces += [_PERSISTENT, bytes((len(mid),)), mid, _TIMESTAMP.pack(timestamp)]
    return b"".join(pieces)


def header_of(body_size: int, props: bytes) -> bytes:
    """A content header payload around properties pika encoded (flags first, as they come)."""
    return _BODY_SIZE.pack(BASIC, 0, body_size) + props


def header_frame_size(head: bytes) -> int:
    """Bytes of the content header frame with this payload (`header`), framing included (it
    must fit in the connection's frame_max)."""
    return _FRAME_OVERHEAD + len(head)


def frame(channel: int, method: bytes, head: bytes, body: bytes, frame_max: int) -> bytes:
    """Every frame of one message on `channel`, as one piece of bytes: the method, the content
    header, and the body cut into frames of at most `frame_max` bytes (none when it is empty)."""
    pack = _FRAME.pack
    parts = [pack(_METHOD, channel, len(method)), method, _END,
             pack(_HEADER, channel, len(head)), head, _END]  # fmt: skip
    room = frame_max - _FRAME_OVERHEAD
    for start in range(0, len(body), room):
        chunk = body[start : start + room]
        parts += [pack(_BODY, channel, len(chunk)), chunk, _END]
    return b"".join(parts)


def decode_properties(head: bytes) -> pika.BasicProperties:
    """The properties of a content header payload (`header`), as a consumer reads them: for
    tests and tools; floats decode as floats (it installs outbox's decoding, process-wide)."""
    install_float_decoding()
    props = pika.BasicProperties()
    props.decode(head, _BODY_SIZE.size)  # the flags are the properties' own
    return props
