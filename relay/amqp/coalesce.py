"""A pika connection that writes a chunk of messages to its socket at once, and at once.

pika hands every frame to its transport as a write of its own, and the transport sends each with
a `send()` of its own: three system calls per message (method, header, body). Inside
`coalesced()`, the frames are gathered and handed over as one write when it ends, in the order
pika made them; the transport sends that as its socket takes it. The broker reads the same
bytes, in fewer, larger segments, and spends less time reading them too.

pika's transport only buffers a write and sends it when the IO loop next polls the socket. The
relay's thread does its database work between polls, so a chunk handed over before a claim or a
mark would wait for that statement: when `coalesced()` ends, what it gathered is sent straight
away instead (`_send_now`), as much as the socket takes; the rest goes at the next poll.

Only the write is changed: pika still marshals every frame and counts it, and a frame written
outside `coalesced()` (a heartbeat, a channel opening or closing, the connection's own methods)
goes out as pika writes it. Should a pika release no longer route frames through
`_adapter_emit_data` (a private method of `BaseConnection`, as of pika 1.4), nothing is gathered
and every frame goes out as pika writes it: slower, never wrong.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

from pika.adapters.select_connection import SelectConnection

# Whether this pika routes every frame through the method overridden below.
SUPPORTED = callable(getattr(SelectConnection, "_adapter_emit_data", None))
# Gathered frames are handed over once they reach this size: the joined copy costs memory beside
# pika's own buffer, so a batch of large messages goes out in pieces of about this size.
WRITE_AT = 256 * 1024


class CoalescingConnection(SelectConnection):  # type: ignore[misc]  # pika is untyped here
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._held: list[bytes] | None = None  # frames gathered by coalesced(), in order
        self._held_bytes = 0
        super().__init__(*args, **kwargs)

    def _adapter_emit_data(self, data: bytes) -> None:
        held = self._held
        if held is None:
            super()._adapter_emit_data(data)
            return
        held.append(data)
        self._held_bytes += len(data)
        if self._held_bytes >= WRITE_AT:
            self._write_held()

    def _write_held(self) -> None:
        held = self._held
        if held:
            # No transport: the connection closed meanwhile, and pika drops what it would write.
            if getattr(self, "_transport", None) is not None:
                self._send_now(b"".join(held))
            held.clear()
        self._held_bytes = 0

    def _send_now(self, data: bytes) -> None:
        """Send `data` now, as much as the socket takes; pika's transport buffers the rest and
        sends it when the socket turns writable. On a plain socket with nothing buffered before
        it, straight to the socket (pika's transport would register for writability and back for
        each write: two system calls a message more for a chain); otherwise through the
        transport, which is then asked to send at once (any error aborts the connection, as
        pika's own write would)."""
        transport = self._transport
        sock = getattr(transport, "_sock", None)
        if type(sock) is socket.socket and not transport.get_write_buffer_size():
            try:
                sent = sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                sent = 0  # pika's transport meets the same error below and aborts
            if sent == len(data):
                return
            data = data[sent:]
        super()._adapter_emit_data(data)
        if transport.get_write_buffer_size() and hasattr(transport, "_on_socket_writable"):
            transport._on_socket_writable()

    def send_frames(self, data: bytes) -> None:
        """Write frames made outside pika (relay/amqp/frames.py); pika counts their bytes."""
        self._output_marshaled_frames((data,))

    @contextlib.contextmanager
    def coalesced(self) -> Iterator[None]:
        """Write the frames made inside as one write at the end (nested: at the outermost), or
        in writes of about WRITE_AT bytes when there are more."""
        if self._held is not None or not SUPPORTED:
            yield
            return
        self._held = []
        try:
            yield
        finally:
            self._write_held()
            self._held = None
