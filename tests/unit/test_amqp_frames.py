"""The relay's own frames are byte for byte what pika writes for the same publish."""

from __future__ import annotations

from typing import Any

import pytest
from pika import frame, spec

from outbox.amqp_codec import Properties
from relay.amqp import frames

FRAME_MAX = 4096


def pika_frames(
    channel: int, exchange: str, routing_key: str, body: bytes, props: Properties
) -> bytes:
    method = frame.Method(channel, spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                      mandatory=True))  # fmt: skip
    parts = [method.marshal(), frame.Header(channel, len(body), props).marshal()]
    room = FRAME_MAX - 8
    parts += [frame.Body(channel, body[i : i + room]).marshal() for i in range(0, len(body), room)]
    return b"".join(parts)


HEADERS: list[dict[str, Any] | None] = [
    None,
    {},
    {"x-outbox-key": "order-7", "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
    {"n": 7, "big": 2**40, "neg": -3, "yes": True, "ratio": 0.25, "é": "ünïcode"},
]


@pytest.mark.parametrize("headers", HEADERS)
@pytest.mark.parametrize("body", [b"", b"x" * 80, bytes(range(256)) * 40])
def test_a_message_is_framed_as_pika_frames_it(headers: dict[str, Any] | None, body: bytes) -> None:
    fields: dict[str, Any] = {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "delivery_mode": 2,
        "message_id": "0b9e3f4c-8a0e-4a8e-9d5c-3b1f2e6a7c90",
        "timestamp": 1_764_400_000,
    }
    content = frames.content_fields(fields["content_type"], fields["content_encoding"])
    head = frames.header(
        len(body), content=content, headers=headers, message_id=fields["message_id"],
        timestamp=fields["timestamp"],
    )  # fmt: skip
    ours = frames.frame(7, frames.publish_method("orders", "order.created"), head, body, FRAME_MAX)
    theirs = pika_frames(7, "orders", "order.created", body, Properties(headers=headers or None,
                                                                        **fields))  # fmt: skip
    assert ours == theirs


def test_the_header_frame_size_is_what_goes_on_the_wire() -> None:
    head = frames.header(
        0, content=frames.content_fields("text/plain", "utf-8"), headers={"a": "b"},
        message_id="m", timestamp=0,
    )  # fmt: skip
    whole = frames.frame(1, frames.publish_method("", "q"), head, b"", FRAME_MAX)
    method_frame = 7 + len(frames.publish_method("", "q")) + 1
    assert frames.header_frame_size(head) == len(whole) - method_frame
