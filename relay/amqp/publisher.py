"""Everything pika: one connection, publisher confirms streamed, on the caller's thread.

Many messages are in flight at once (pika's asynchronous adapter; a BlockingConnection waits for
each confirm and tops out near a fifth of the rate). The relay hands over whole chunks with
`publish()`; once the broker has answered every message of a chunk, `done` is called with one
`Outcome` per message. Nothing outside this module knows what a delivery tag is.

The publisher has no thread of its own: the thread that uses it does its IO in `wait()`, which
reads the broker's answers (calling `done` there), writes what was published, and runs pika's
timers (reconnects, confirm timeouts). The relay loop calls it between its turns, so one thread
claims, sends, reads confirms and records them, and nothing is handed between threads.
`interrupt()` is the one method another thread may call: it ends a `wait()` early.

The broker may be a cluster: the nodes are tried in the order given, and a failed connect or a
lost connection moves on to the next node at once; only when every node failed does the
publisher back off before the next round (relay/amqp/nodes.py, Rounds).

Each exchange gets its own confirm channel: publishing to a missing exchange makes the broker
close the channel (404), and with one channel per exchange that takes down only the messages
that were going there, never the other destinations' messages in flight. What is waiting for
the broker's answer (chunks, channels, chains) is tracked in relay/amqp/confirms.py.

A nacked channel is retired (RabbitMQ may go on refusing a channel it nacked once). A nack
before the channel confirmed anything may be a quorum queue electing its leader: the message is
sent again on a fresh channel after a pause; a nack after confirms, or on fresh channels again
and again, is reported REJECTED (relay/amqp/nacks.py). A node silent while confirms are owed is
dropped for the next (relay/amqp/stall.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import select
import selectors
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from pika import spec
from pika.adapters.select_connection import IOLoop, PollEvents
from pika.exceptions import (
    AMQPConnectionError,
    AMQPHeartbeatTimeout,
    ChannelClosedByBroker,
)

from relay.amqp import frames
from relay.amqp.coalesce import CoalescingConnection
from relay.amqp.confirms import Chains, Chan, Chunk, Entry, report
from relay.amqp.connect_errors import connect_error
from relay.amqp.nacks import RESEND_PAUSES, resend_pause
from relay.amqp.nodes import Node, Rounds, broker_nodes, lost_fields, plain
from relay.amqp.stall import STALL_TIMEOUT, Action, Silence
from relay.amqp.tls import TlsOptions
from relay.amqp.untraced import untraced, wrapped_pika
from relay.amqp.wire import DEFAULT_FRAME_MAX, to_outgoing
from relay.core.outcome import Fate, Outcome
from relay.core.signing import Keyring
from relay.core.urls import redact
from relay.errors import BrokerUnavailable
from relay.ports import Claimed, Done, Outgoing

log = logging.getLogger("relay.publisher")

# AMQP allows 2047 channels per connection by default; idle ones beyond this are closed.
MAX_CHANNELS = 256
# The longest wait between reconnect rounds: with the connect itself, the relay is back within a
# second of the broker accepting connections again, however long it was away.
RECONNECT_MAX_DELAY = 0.75


class Publisher:
    """A confirmed-publish pipeline over one AMQP connection, reconnecting on its own."""

    def encode(
        self, row: Claimed, *, traceparent: str | None = None, tracestate: str | None = None
    ) -> Outgoing:
        """A claimed row as a message on this wire, checked against this connection's frame_max;
        MalformedRow when there can be none."""
        signer = self._keyring.for_exchange(row.exchange) if self._keyring is not None else None
        return to_outgoing(
            row,
            traceparent=traceparent,
            tracestate=tracestate,
            frame_max=self._frame_max,
            signer=signer,
        )

    def __init__(
        self,
        amqp_url: str,
        *,
        confirm_timeout: float = 30.0,
        reconnect_max_delay: float = RECONNECT_MAX_DELAY,
        blocked_timeout: float = 300.0,
        stall_timeout: float = STALL_TIMEOUT,
        name: str = "outbox-relay",
        tls: TlsOptions | None = None,
        signing: Keyring | None = None,
        resend_pauses: tuple[float, ...] = RESEND_PAUSES,
    ) -> None:
        nodes = broker_nodes(amqp_url, tls)
        self._keyring = signing  # None: messages go unsigned
        for node in nodes:
            params = node.params
            params.client_properties = {"connection_name": name}
            # pika's default is to wait forever while the broker blocks publishers (an alarm).
            params.blocked_connection_timeout = blocked_timeout
            params.connection_attempts = 1
            params.socket_timeout = 5
        self._all_urls = redact(amqp_url)
        self._rounds = Rounds(nodes, reconnect_max_delay)
        self.node: str | None = None  # host:port of the node connected to, for logs and /readyz
        self._confirm_timeout = confirm_timeout
        self._silence = Silence(stall_timeout)  # a node gone silent (relay/amqp/stall.py)
        self._ioloop = IOLoop()
        self._started = False  # the poller is active: wait() does IO, stop() has work to do
        # interrupt() writes a byte here, which ends a poll: pika's own wake-up takes a lock,
        # which a signal handler must not (the thread it interrupts may hold it).
        self._woken: socket.socket | None = None  # its read end, polled from start() to stop()
        self._wake: socket.socket | None = None
        self._conn: Any = None
        self._chans: OrderedDict[tuple[Hashable, str], Chan] = OrderedDict()  # LRU first
        # Nacked channels: nothing more is sent on them; closed once their messages are answered.
        self._retired: dict[Chan, None] = {}
        self._resend_pauses = resend_pauses
        self._pausing: dict[Entry, None] = {}  # nacked messages waiting to be sent again
        self._chains = Chains(self._next_in_chain)
        self._returned: dict[str, str] = {}
        self._stopping = False
        self._first_attempt = False  # a node answered, or every node failed once
        self._first_error: str | None = None
        # Nodes that failed before any answered, and why: logged once one answers, or said all
        # at once by start() when none does (one line, not a warning per node before it).
        self._first_round: list[tuple[Node, str]] = []
        self.ready = False  # read by /readyz on the HTTP thread; a plain bool is atomic enough
        self.blocked = False
        # What the broker negotiated at connection.tune; RabbitMQ closes the connection on a
        # larger frame, so encode() refuses a message whose header frame would be.
        self._frame_max = DEFAULT_FRAME_MAX
        self.connections = 0  # connections opened so far: more than one means one was lost

    # ----------------------------------------------------------------- the caller's API

    def start(self, timeout: float = 10.0) -> None:
        """Connect to the first node that answers, in order; raise BrokerUnavailable if none
        does (`timeout` seconds per node)."""
        wrapped = wrapped_pika()
        if wrapped:
            log.info("broker.instrumentation_bypassed", extra={"wrapped": ",".join(wrapped)})
        self._woken, self._wake = socket.socketpair()
        self._woken.setblocking(False)
        self._wake.setblocking(False)
        self._ioloop.activate_poller()
        self._ioloop.add_handler(self._woken.fileno(), self._drain_wake_ups, PollEvents.READ)
        self._started = True
        with untraced():
            self._connect()
        self._ioloop.call_later(1.0, self._check_confirm_timeouts)
        waited = timeout * len(self._rounds.nodes)
        deadline = time.monotonic() + waited
        while not self._first_attempt and time.monotonic() < deadline:
            self.wait(deadline - time.monotonic())
        if not self._first_attempt:
            self.stop(1.0)
            raise BrokerUnavailable(f"broker {self._all_urls} did not answer within {waited:.0f} s")
        if self._first_error is not None:
            self.stop(1.0)
            raise BrokerUnavailable(f"cannot connect to broker {self._why_none_answered()}")

    def wait(self, timeout: float) -> None:
        """Do the broker's IO: wait up to `timeout` seconds for it (0: only what is ready), then
        handle what came (the broker's answers call their chunks' `done` here) and the timers
        that are due. Returns after the first burst of events, or `interrupt()`."""
        if not self._started:
            return
        loop = self._ioloop
        # pika's poll waits until its next timer: this one bounds the wait.
        bound = loop.call_later(max(0.0, timeout), _nothing)
        with untraced():
            loop.poll()
            loop.process_timeouts()
        loop.remove_timeout(bound)

    def interrupt(self) -> None:
        """End the current or next `wait()` at once. Safe from any thread and signal handler:
        one non-blocking send, no lock."""
        wake = self._wake
        if wake is not None:
            with contextlib.suppress(OSError):  # a byte is pending already, or it just closed
                wake.send(b"\0")

    def _drain_wake_ups(self, _fd: int, _events: int) -> None:
        woken = self._woken
        with contextlib.suppress(OSError):  # drained (would block), or closed
            while woken is not None and woken.recv(4096):
                pass

    def wait_fd(self, fileno: int, events: int) -> int:
        """Wait until `fileno` (the database's socket) is ready for `events` (selectors'
        EVENT_READ, EVENT_WRITE), doing the broker's IO meanwhile: its answers are read and a
        chain's next message is sent while a statement runs (relay/store/overlap.py). Returns
        the events that are ready (both on an error, for the driver to find it)."""
        if not self._started:  # stopped: nothing else to do while waiting
            readers = [fileno] if events & selectors.EVENT_READ else []
            writers = [fileno] if events & selectors.EVENT_WRITE else []
            r, w, _ = select.select(readers, writers, [fileno])
            return (selectors.EVENT_READ if r else 0) | (
                selectors.EVENT_WRITE if w else 0
            ) or events
        mask = (PollEvents.READ if events & selectors.EVENT_READ else 0) | (
            PollEvents.WRITE if events & selectors.EVENT_WRITE else 0
        )
        got = 0

        def happened(_fd: int, what: int) -> None:
            nonlocal got
            got |= what

        loop = self._ioloop
        loop.add_handler(fileno, happened, mask)
        try:
            while not got:
                self.wait(1.0)
        finally:
            loop.remove_handler(fileno)
        if got & ~(PollEvents.READ | PollEvents.WRITE):  # an error or a hang-up
            return selectors.EVENT_READ | selectors.EVENT_WRITE
        return (selectors.EVENT_READ if got & PollEvents.READ else 0) | (
            selectors.EVENT_WRITE if got & PollEvents.WRITE else 0
        )

    def watch(self, fileno: int, ready: Callable[[], None]) -> None:
        """Call `ready` from `wait()` whenever `fileno` can be read, until `unwatch`: another
        source of the loop's work (the log's stream, relay/capture/source.py) ends a wait as
        the broker's answers do."""
        self._ioloop.add_handler(fileno, lambda _fd, _events: ready(), PollEvents.READ)

    def unwatch(self, fileno: int) -> None:
        with contextlib.suppress(Exception):  # closed with the poller, or never watched
            self._ioloop.remove_handler(fileno)

    def _why_none_answered(self) -> str:
        """Where and why, in one line: each node and its error, in plain words but the last
        one's, which relay.errors.plain_broker_error reads (the CLI applies it to the line)."""
        if len(self._rounds.nodes) == 1:
            return f"{self._url}: {self._first_error}"
        *earlier, (last, why) = self._first_round
        reasons = [plain(node, error) for node, error in earlier] + [f"{last.name}: {why}"]
        return f"{self._all_urls}: {'; '.join(reasons)}"

    def publish(
        self,
        items: Sequence[Outgoing],
        done: Done,
        *,
        chain: Hashable | None = None,
        lane: Hashable = None,
    ) -> None:
        """Publish a chunk; `done(outcomes)` is called from `wait()` once the broker has answered
        every message (at once when none can be sent). A chain's chunks go one message at a
        time (ports.Publisher.publish). Each `lane` has channels of its own (one per exchange):
        one database's messages never wait for another's confirms on a shared channel
        (relay/amqp/shared.py)."""
        with untraced():
            self._publish(Chunk(items, done, time.monotonic(), chain=chain, lane=lane))

    def stop(self, timeout: float = 5.0) -> None:
        """Close the connection; unanswered messages are reported UNCONFIRMED or NOT_SENT."""
        if not self._started:
            return
        self._shutdown()
        deadline = time.monotonic() + timeout
        while self._conn is not None and time.monotonic() < deadline:
            self.wait(deadline - time.monotonic())
        self.ready = False
        self._fail_everything("publisher stopped before the broker confirmed")
        self._started = False
        woken, wake = self._woken, self._wake
        self._woken = self._wake = None
        with contextlib.suppress(Exception):
            if woken is not None:
                self._ioloop.remove_handler(woken.fileno())
        with contextlib.suppress(Exception):
            self._ioloop.deactivate_poller()
        # The loop's wake-up socket pairs are ours to close once nothing polls them.
        with contextlib.suppress(Exception):
            self._ioloop.close()
        for end in (woken, wake):
            if end is not None:
                end.close()

    # ----------------------------------------------------------------- connection

    @property
    def _url(self) -> str:
        """The node connected to, or being tried (password masked)."""
        return self._rounds.current.url

    def _connect(self) -> None:
        if self._stopping:
            return
        self._conn = CoalescingConnection(
            parameters=self._rounds.current.params,
            on_open_callback=self._on_connection_open,
            on_open_error_callback=self._on_connection_open_error,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._ioloop,
        )

    def _on_connection_open(self, conn: Any) -> None:
        self.blocked = False  # a new connection starts unblocked; the broker re-sends the alarm
        conn.add_on_connection_blocked_callback(self._on_blocked)
        conn.add_on_connection_unblocked_callback(self._on_unblocked)
        self._rounds.connected()
        negotiated = getattr(getattr(conn, "params", None), "frame_max", None)
        if isinstance(negotiated, int) and negotiated > 0:
            self._frame_max = negotiated
        self.connections += 1
        self._silence.reset(time.monotonic())
        self.node = self._rounds.current.name
        # Each node that failed before this one answered, and the node tried after it.
        tried_next = [node.name for node, _ in self._first_round[1:]] + [self.node]
        for (failed, why), next_node in zip(self._first_round, tried_next, strict=False):
            log.warning("broker.lost", extra=lost_fields(failed, why, 0.0, next_node))
        self._first_round.clear()
        self.ready = True
        log.info("broker.connected", extra={"node": self.node, "broker": self._url})
        self._first_attempt = True

    def _on_connection_open_error(self, _conn: Any, err: BaseException) -> None:
        self._conn = None
        self._lost(f"connection failed: {connect_error(err)}")

    def _on_connection_closed(self, _conn: Any, reason: BaseException) -> None:
        self._conn = None
        if self._stopping:
            self._fail_everything("publisher stopped before the broker confirmed")
            return
        self._lost(f"connection closed: {reason}")

    def _lost(self, why: str) -> None:
        self.ready = False
        self.node = None
        self._fail_everything(why)
        failure = self._rounds.failed()
        starting = not self._first_attempt
        if starting:
            self._first_round.append((failure.node, why))
            if failure.round_over:
                self._first_error = why
                self._first_attempt = True
                return
        if self._stopping:
            return
        delay = self._rounds.backoff(failure)
        if not starting:
            fields = lost_fields(failure.node, why, delay, failure.next_node, self._rounds.attempt)
            log.warning("broker.lost", extra=fields)
        self._ioloop.call_later(delay, self._connect)

    def _on_blocked(self, _conn: Any, frame: Any) -> None:
        self.blocked = True
        # The reason names the alarm ("low on disk", "low on memory") an operator must clear.
        reason = getattr(getattr(frame, "method", None), "reason", None) or "resource alarm"
        log.warning("broker.blocked", extra={"broker": self._url, "reason": reason})

    def _on_unblocked(self, _conn: Any, _frame: Any) -> None:
        self.blocked = False
        log.info("broker.unblocked", extra={"broker": self._url})

    # ----------------------------------------------------------------- channels

    def _chan(self, exchange: str, lane: Hashable) -> Chan:
        key = (lane, exchange)
        chan = self._chans.get(key)
        if chan is not None:
            self._chans.move_to_end(key)
            return chan
        if len(self._chans) >= MAX_CHANNELS:
            self._close_idle_channel()
        chan = Chan(exchange, lane)
        self._chans[key] = chan
        self._conn.channel(on_open_callback=lambda ch: self._on_channel_open(chan, ch))
        return chan

    def _close_idle_channel(self) -> None:
        for key, chan in self._chans.items():
            if chan.channel is not None and not chan.unconfirmed and not chan.queued:
                del self._chans[key]
                with contextlib.suppress(Exception):  # already closing is fine
                    chan.channel.close()
                return

    def _on_channel_open(self, chan: Chan, channel: Any) -> None:
        channel.add_on_close_callback(lambda ch, reason: self._on_channel_closed(chan, reason))
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(
            lambda frame: self._on_confirm(chan, frame),
            callback=lambda _frame: self._on_confirm_ok(chan, channel),
        )

    def _on_confirm_ok(self, chan: Chan, channel: Any) -> None:
        if self._chans.get(chan.key) is not chan:
            return  # replaced while opening (the connection was lost meanwhile)
        chan.channel = channel
        chan.next_tag = 0
        queued, chan.queued = chan.queued, []
        with self._conn.coalesced():
            for chunk, i in queued:
                self._send(chan, chunk, i)

    def _on_channel_closed(self, chan: Chan, reason: BaseException) -> None:
        if self._chans.get(chan.key) is chan:
            del self._chans[chan.key]
        self._retired.pop(chan, None)
        if isinstance(reason, ChannelClosedByBroker) and reason.reply_code == 404:
            text = str(reason.reply_text)
            log.warning("broker.destination_missing", extra={"exchange": chan.exchange})
            self._fail_chan(chan, Fate.DESTINATION_MISSING, text, Fate.DESTINATION_MISSING)
        else:
            # pika closes every channel with the connection's error before it reports the
            # connection closed: those messages were lost with the connection, not by their
            # destination (so they open no circuit).
            lost = isinstance(reason, AMQPConnectionError)
            why = f"channel closed: {reason}"
            self._fail_chan(chan, Fate.UNCONFIRMED, why, Fate.NOT_SENT, lost=lost)

    # ----------------------------------------------------------------- publishing

    def _publish(self, chunk: Chunk) -> None:
        n = len(chunk.items)
        chunk.outcomes = [None] * n
        chunk.remaining = n
        if n == 0:
            chunk.done([])
            return
        if chunk.chain is not None and self._chains.held_back(chunk):
            return
        if self._conn is None or not self._conn.is_open or self._stopping:
            why = "connection blocked" if self.blocked else "no connection to the broker"
            for i, item in enumerate(chunk.items):
                self._answer(
                    chunk, i, Outcome(item.seq, Fate.NOT_SENT, why, while_blocked=self.blocked)
                )
            return
        if chunk.chain is not None:
            self._chains.start(chunk)
            return
        chan: Chan | None = None
        with self._conn.coalesced():  # the whole chunk in one write (relay/amqp/coalesce.py)
            for i, item in enumerate(chunk.items):
                if chan is None or chan.exchange != item.exchange:
                    chan = self._chan(item.exchange, chunk.lane)
                self._send_or_queue(chan, chunk, i)

    def _next_in_chain(self, chunk: Chunk, i: int) -> None:
        """Send message `i` of a chained chunk (the one before it was confirmed). Straight from
        the confirm's callback: no database round trip between the two."""
        if self._conn is None or not self._conn.is_open or self._stopping:
            why = "connection blocked" if self.blocked else "no connection to the broker"
            outcome = Outcome(chunk.items[i].seq, Fate.NOT_SENT, why, while_blocked=self.blocked)
            self._answer(chunk, i, outcome)
            return
        chunk.sent_at = time.monotonic()  # the confirm timeout counts from this message's send
        with self._conn.coalesced():  # its three frames in one write
            self._send_or_queue(self._chan(chunk.items[i].exchange, chunk.lane), chunk, i)

    def _send_or_queue(self, chan: Chan, chunk: Chunk, i: int) -> None:
        if chan.channel is None:
            chan.queued.append((chunk, i))  # sent once the channel is in confirm mode
        else:
            self._send(chan, chunk, i)

    def _send(self, chan: Chan, chunk: Chunk, i: int) -> None:
        item = chunk.items[i]
        channel = chan.channel
        if not channel.is_open:  # closing: its close callback answers what it has
            why = "publish failed: the channel is closing"
            self._answer(
                chunk, i, Outcome(item.seq, Fate.NOT_SENT, why, while_blocked=self.blocked)
            )
            return
        # The message's own frames (relay/amqp/frames.py), written as pika writes its own: no
        # instrumentation of basic_publish is on the path (untraced.py).
        self._conn.send_frames(
            frames.frame(channel.channel_number, item.method, item.header, item.body,
                         self._frame_max)
        )  # fmt: skip
        chan.next_tag += 1
        chan.unconfirmed[chan.next_tag] = (chunk, i)

    def _on_return(self, _ch: Any, method: Any, properties: Any, _body: bytes) -> None:
        # basic.return arrives before the basic.ack of the same message.
        if properties.message_id:
            self._returned[properties.message_id] = (
                f"{method.reply_code} {method.reply_text}: exchange {method.exchange!r} "
                f"routing key {method.routing_key!r}"
            )

    def _on_confirm(self, chan: Chan, frame: Any) -> None:
        method = frame.method
        tag: int = method.delivery_tag
        ack = isinstance(method, spec.Basic.Ack)
        if method.multiple:
            tags = list(itertools.takewhile(lambda t: t <= tag, chan.unconfirmed))
        else:
            tags = [tag]
        for t in tags:
            entry = chan.unconfirmed.pop(t, None)
            if entry is None:
                continue
            chunk, i = entry
            item = chunk.items[i]
            returned = self._returned.pop(item.message_id, None)
            if returned is not None:
                outcome = Outcome(item.seq, Fate.UNROUTABLE, returned)
            elif ack:
                chan.acked = True
                outcome = Outcome(item.seq, Fate.CONFIRMED)
            elif self._nacked(chan, chunk, i):
                continue  # sent again on a fresh channel after a pause
            else:
                outcome = Outcome(item.seq, Fate.REJECTED, "basic.nack from broker")
            self._answer(chunk, i, outcome)
        if chan.retired and not chan.unconfirmed:
            self._close_retired(chan)

    # ----------------------------------------------------------------- nacks

    def _nacked(self, chan: Chan, chunk: Chunk, i: int) -> bool:
        """Retire the nacked channel; True when message `i` is to be sent again on a fresh
        channel (relay/amqp/nacks.py), False when its nack is to be reported: at once when the
        channel had confirms before it (the destination took messages, and now refuses them:
        a full queue)."""
        self._retire(chan)
        if chan.acked:
            return False
        nacks = chunk.nacks.get(i, 0) + 1
        chunk.nacks[i] = nacks
        pause = resend_pause(nacks, self._resend_pauses)
        if pause is None or self._stopping:
            return False
        self._pausing[chunk, i] = None
        self._ioloop.call_later(pause, lambda: self._resend(chunk, i))
        return True

    def _retire(self, chan: Chan) -> None:
        if chan.retired:
            return
        chan.retired = True
        if self._chans.get(chan.key) is chan:
            del self._chans[chan.key]  # the exchange's next message opens a new channel
        self._retired[chan] = None
        log.debug("broker.nacked", extra={"exchange": chan.exchange, "node": self.node})

    def _close_retired(self, chan: Chan) -> None:
        self._retired.pop(chan, None)
        with contextlib.suppress(Exception):  # already closing is fine
            chan.channel.close()

    def _resend(self, chunk: Chunk, i: int) -> None:
        if self._pausing.pop((chunk, i), 1) is not None:
            return  # answered meanwhile: the connection was lost, or the publisher stopped
        if self._conn is None or not self._conn.is_open or self._stopping:
            why = "no connection to the broker"
            outcome = Outcome(chunk.items[i].seq, Fate.UNCONFIRMED, why, connection_lost=True)
            self._answer(chunk, i, outcome)
            return
        with self._conn.coalesced():
            self._send_or_queue(self._chan(chunk.items[i].exchange, chunk.lane), chunk, i)

    def _answer(self, chunk: Chunk, i: int, outcome: Outcome) -> None:
        if chunk.outcomes[i] is not None:
            return
        chunk.outcomes[i] = outcome
        chunk.remaining -= 1
        if chunk.chain is not None:
            self._chains.answered(chunk, i, outcome)
            return
        if chunk.remaining == 0:
            report(chunk)

    # ----------------------------------------------------------------- failures

    def _fail_chan(
        self, chan: Chan, sent_fate: Fate, why: str, queued_fate: Fate, *, lost: bool = False
    ) -> None:
        blocked = self.blocked
        unconfirmed, chan.unconfirmed = chan.unconfirmed, {}
        queued, chan.queued = chan.queued, []
        for entries, fate in ((unconfirmed.values(), sent_fate), (queued, queued_fate)):
            for chunk, i in entries:
                item = chunk.items[i]
                self._returned.pop(item.message_id, None)
                outcome = Outcome(item.seq, fate, why, while_blocked=blocked, connection_lost=lost)
                self._answer(chunk, i, outcome)

    def _fail_everything(self, why: str) -> None:
        chans = [*self._chans.values(), *self._retired]
        self._chans.clear()
        self._retired.clear()
        for chan in chans:
            self._fail_chan(chan, Fate.UNCONFIRMED, why, Fate.NOT_SENT, lost=True)
        # Nacked, waiting to be sent again: the broker may have routed them to some queues.
        pausing, self._pausing = self._pausing, {}
        for chunk, i in pausing:
            outcome = Outcome(chunk.items[i].seq, Fate.UNCONFIRMED, why, connection_lost=True)
            self._answer(chunk, i, outcome)
        self._returned.clear()

    def _check_stalled(self, now: float) -> None:
        """Ask a node gone silent while confirms are owed, then drop it (relay/amqp/stall.py)."""
        conn = self._conn
        if conn is None or not conn.is_open:
            return
        owed = [next(iter(c.unconfirmed.values()))[0].sent_at
                for c in [*self._chans.values(), *self._retired] if c.unconfirmed]  # fmt: skip
        silence = self._silence
        action = silence.check(now, conn.bytes_received, min(owed, default=None), self.blocked)
        if action is Action.ASK:
            with contextlib.suppress(Exception):
                conn.channel(on_open_callback=lambda ch: ch.close())
        elif action is Action.DROP:
            silent = silence.timeout * 2
            why = f"the node answered nothing for {silent:g} s while confirms were owed"
            conn._terminate_stream(AMQPHeartbeatTimeout(why))  # as pika's heartbeat checker does

    def _check_confirm_timeouts(self) -> None:
        now = time.monotonic()
        self._check_stalled(now)
        for chan in [*self._chans.values(), *self._retired]:
            oldest = next(iter(chan.unconfirmed.values()), None)
            if oldest is None or now - oldest[0].sent_at <= self._confirm_timeout:
                continue
            # Answer the channel's messages now (a blocked broker would not even answer a
            # channel.close) and publish further messages on a fresh channel; the relay
            # republishes these with the same message ids. Late confirms land on the old
            # channel object and are ignored.
            log.warning(
                "broker.confirm_timeout", extra={"broker": self._url, "exchange": chan.exchange}
            )
            if self._chans.get(chan.key) is chan:
                del self._chans[chan.key]
            self._retired.pop(chan, None)
            why = f"no confirm within {self._confirm_timeout:g} s"
            self._fail_chan(chan, Fate.UNCONFIRMED, why, Fate.NOT_SENT)
            with contextlib.suppress(Exception):  # already closing is fine
                chan.channel.close()
        if not self._stopping:
            self._ioloop.call_later(1.0, self._check_confirm_timeouts)

    def _shutdown(self) -> None:
        self._stopping = True
        self.ready = False
        if self._conn is not None and not self._conn.is_closed:
            try:
                self._conn.close()
                return  # stop() waits for _on_connection_closed
            except Exception:  # noqa: S110 - the connection is dropped below
                pass
        self._conn = None


def _nothing() -> None:
    """A timer or callback whose only effect is to end a wait."""
