"""One broker connection shared by the relays of several databases (relay/runtime/tenants.py).

A relay serving one database does the broker's IO on its own thread (relay/amqp/publisher.py).
Serving many, each database's loop has a thread of its own, so that one database that is slow,
locked or gone holds up no other; the connection stays one, owned by the broker thread
(`Broker`), which does all its IO. Each loop talks to it through a `Share`, a ports.Publisher:

- `publish` hands the chunk to the broker thread and returns;
- the broker's answers come back as calls to the chunk's `done`, made on the loop's own thread,
  in its `wait()` (so, as with one database, nothing a loop holds is touched by another thread);
- `wait()` sleeps on the loop's own wake-up socket and the sockets it watches (the log's stream,
  --capture logical), not on the broker's.

A chain is named per share, so two databases' keys of the same name never share one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable, Hashable, Sequence

from relay.amqp.publisher import Publisher
from relay.core.outcome import Outcome
from relay.ports import Claimed, Done, Outgoing

log = logging.getLogger("relay.publisher")

# Longest the broker thread sleeps when nothing wakes it: its timers (confirm timeouts,
# reconnects) are pika's and end a wait on their own; this only bounds a missed wake-up.
BROKER_IDLE_WAIT = 1.0


class Broker:
    """The publisher, its IO done on a thread of its own for the shares handed out."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker", daemon=True)
        self._tags = itertools.count()

    def start(self, timeout: float = 10.0) -> None:
        """Connect (BrokerUnavailable if no node answers), then hand the IO to its thread."""
        self.publisher.start(timeout)
        self._thread.start()

    def share(self) -> Share:
        return Share(self, next(self._tags))

    def call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the broker thread, soon. Any thread."""
        self._calls.put(fn)
        self.publisher.interrupt()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the connection once every share has stopped: what is still unanswered is
        answered UNCONFIRMED or NOT_SENT to its share."""
        if not self._thread.is_alive():
            return
        self._stopping.set()
        self.publisher.interrupt()
        self._thread.join()
        self.publisher.stop(timeout)

    def _run(self) -> None:
        publisher = self.publisher
        calls = self._calls
        while not self._stopping.is_set():
            publisher.wait(BROKER_IDLE_WAIT)
            while True:
                try:
                    fn = calls.get_nowait()
                except queue.Empty:
                    break
                try:
                    fn()
                except Exception:  # a bug in one call must not end every database's publishing
                    log.exception("broker.call_failed")


class Share:
    """One database loop's publisher: the broker's connection, its answers on the loop's thread."""

    def __init__(self, broker: Broker, tag: int) -> None:
        self._broker = broker
        self._real = broker.publisher
        self._tag = tag
        self._answers: queue.SimpleQueue[tuple[Done, list[Outcome]]] = queue.SimpleQueue()
        self._woken, self._wake = socket.socketpair()
        self._woken.setblocking(False)
        self._wake.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._woken, selectors.EVENT_READ, None)
        self._unanswered = 0  # chunks handed over and not yet answered (this thread's count)

    # What the loop reads of the connection: plain attributes the broker thread sets.
    @property
    def ready(self) -> bool:
        return self._real.ready

    @property
    def blocked(self) -> bool:
        return self._real.blocked

    def encode(
        self, row: Claimed, *, traceparent: str | None = None, tracestate: str | None = None
    ) -> Outgoing:
        return self._real.encode(row, traceparent=traceparent, tracestate=tracestate)

    def start(self, timeout: float = 10.0) -> None:
        """The broker is started once, for every share (Broker.start)."""

    def publish(
        self, items: Sequence[Outgoing], done: Done, *, chain: Hashable | None = None
    ) -> None:
        answers, wake = self._answers, self._wake

        def answered(outcomes: list[Outcome]) -> None:  # on the broker thread
            answers.put((done, outcomes))
            with contextlib.suppress(OSError):  # a byte is pending already
                wake.send(b"\0")

        named = None if chain is None else (self._tag, chain)
        real = self._real
        self._unanswered += 1
        self._broker.call(lambda: real.publish(items, answered, chain=named, lane=self._tag))

    def wait(self, timeout: float) -> None:
        """Take the broker's answers (calling their `done`) and what the watched sockets say,
        waiting up to `timeout` for either; returns early on `interrupt()`."""
        if self._answers.empty():
            events = self._selector.select(max(0.0, timeout))
        else:
            events = self._selector.select(0)
        for key, _mask in events:
            if key.data is None:
                self._drain_wake_ups()
            else:
                key.data()
        self._deliver()

    def _deliver(self) -> None:
        while True:
            try:
                done, outcomes = self._answers.get_nowait()
            except queue.Empty:
                return
            self._unanswered -= 1
            done(outcomes)

    def _drain_wake_ups(self) -> None:
        with contextlib.suppress(OSError):  # drained (would block)
            while self._woken.recv(4096):
                pass

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            self._wake.send(b"\0")

    def wait_fd(self, fileno: int, events: int) -> int:
        """Wait for the database's socket. The broker thread goes on with the broker's IO (a
        chain's next message included) meanwhile: there is nothing else to do here."""
        readers = [fileno] if events & selectors.EVENT_READ else []
        writers = [fileno] if events & selectors.EVENT_WRITE else []
        r, w, x = select.select(readers, writers, [fileno])
        if x:  # an error: both, for the driver to find it
            return selectors.EVENT_READ | selectors.EVENT_WRITE
        return (selectors.EVENT_READ if r else 0) | (selectors.EVENT_WRITE if w else 0)

    def watch(self, fileno: int, ready: Callable[[], None]) -> None:
        self._selector.register(fileno, selectors.EVENT_READ, ready)

    def unwatch(self, fileno: int) -> None:
        with contextlib.suppress(KeyError, ValueError):  # never watched
            self._selector.unregister(fileno)

    def stop(self, timeout: float = 5.0) -> None:
        """Wait, up to `timeout`, for the answers to what this loop handed over; the broker's
        connection stays open for the others (Broker.stop closes it)."""
        deadline = time.monotonic() + timeout
        while self._unanswered > 0 and time.monotonic() < deadline:
            self.wait(min(0.05, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        self._selector.close()
        self._woken.close()
        self._wake.close()
