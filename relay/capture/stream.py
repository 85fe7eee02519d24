"""One replication connection reading the relay's slot: outbox messages as whole commits, in
commit order, and the status updates that let PostgreSQL free the WAL behind what is published.

It talks to libpq through psycopg's low-level wrapper (`psycopg.pq`) on a `replication=database`
connection: START_REPLICATION, then CopyData frames read with `get_copy_data` in asynchronous
mode, which never waits and never holds the GIL while the network does (a blocking read would
hold it). The caller waits on `fileno()` with select() and calls `read()` when it is readable.

Positions. The server resends, on every new connection, each transaction whose commit record
lies at or after the slot's confirmed position, so nothing is confirmed that is not done with:
`confirm(end_lsn)` once every message of a commit is published, `idle()` when nothing is in
flight. Both only move the position this object reports; it reaches the server with the next
status update, which `read()` sends every `status_interval` seconds (and at once when the server
asks): the server drops a connection that says nothing for wal_sender_timeout (60 s by default).

Not thread-safe: one thread reads, confirms and closes.
"""

from __future__ import annotations

import contextlib
import re
import selectors
import time
from collections.abc import Callable
from typing import NamedTuple

from psycopg import OperationalError, pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq.abc import PGconn, PGresult

from relay.capture import pgoutput
from relay.capture.pgoutput import Commit, Decoder, lsn_text, parse_lsn
from relay.errors import RelayError

__all__ = [
    "CaptureError",
    "Commit",
    "ReplicationStream",
    "SlotInUse",
    "SlotLost",
    "SlotMissing",
    "StreamBroken",
    "checked_name",
]

# Slot and publication names are written into the statements (a replication connection takes
# no bound parameters), so only names that need no quoting are accepted.
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# SQLSTATEs of START_REPLICATION's refusals.
_UNDEFINED_OBJECT = "42704"  # no such slot
_OBJECT_IN_USE = "55006"  # another walsender streams from it
_NOT_IN_PREREQUISITE_STATE = "55000"  # among others: the slot was invalidated

# Added to the connection string unless it says otherwise: a server that does not answer fails
# the connection instead of hanging it, and pg_stat_replication names who reads the slot.
_CONNECT_DEFAULTS = {"connect_timeout": "10", "application_name": "outbox-relay capture"}
# How long close() waits for the server to end the stream, which releases the slot at once.
_CLOSE_WAIT = 2.0
# How many times one read() refills libpq's buffer from the socket: a bound on the time one call
# takes while the server keeps sending. What is left stays on the socket, where select() sees it.
_ROUNDS = 64

# What the stream needs of the slot before it starts: it exists, in this database, decodes with
# pgoutput, still has its WAL; and the publication pgoutput is told to use exists.
_SLOT_SQL = (
    "SELECT s.database, s.plugin, s.active_pid, s.wal_status, s.confirmed_flush_lsn,"
    " current_database(),"
    " EXISTS (SELECT FROM pg_publication WHERE pubname = '{publication}')"
    " FROM (SELECT) AS one LEFT JOIN pg_replication_slots AS s ON s.slot_name = '{slot}'"
)
_START_SQL = (
    "START_REPLICATION SLOT {slot} LOGICAL {start}"
    " (proto_version '1', publication_names '{publication}', messages 'true')"
)


class CaptureError(RelayError):
    """Logical capture failed."""


class SlotMissing(CaptureError):
    """The replication slot or its publication does not exist: `outbox-relay capture setup`."""


class SlotInUse(CaptureError):
    """Another process streams from the replication slot (a slot has one reader at a time)."""


class SlotLost(CaptureError):
    """The server invalidated the replication slot: the WAL it held was removed, and with it the
    messages not yet read."""


class StreamBroken(CaptureError):
    """The replication connection failed or the server ended the stream: open it again later."""


def checked_name(kind: str, name: str) -> str:
    """`name` if it can name a slot or publication unquoted; ValueError otherwise."""
    if _NAME.fullmatch(name) is None:
        raise ValueError(
            f"{kind} name {name!r}: use 1 to 63 lower-case letters, digits and underscores, "
            "not starting with a digit"
        )
    return name


class _Slot(NamedTuple):
    """The slot as pg_replication_slots shows it (`database` None: no such slot)."""

    database: str | None
    plugin: str | None
    active_pid: int | None
    wal_status: str | None
    confirmed: int
    current_database: str
    publication_exists: bool


class ReplicationStream:
    """Whole commits carrying messages of `prefix`, read from `slot` through `publication`."""

    def __init__(
        self,
        conninfo: str,
        *,
        slot: str,
        publication: str,
        prefix: str = "outbox",
        status_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        params = {**_CONNECT_DEFAULTS, **conninfo_to_dict(conninfo), "replication": "database"}
        self._conninfo = make_conninfo("", **params)
        self._slot = checked_name("slot", slot)
        self._publication = checked_name("publication", publication)
        self._prefix = prefix
        self._interval = status_interval
        self._clock = clock
        self._conn: PGconn | None = None
        self._decoder = Decoder(prefix)
        self._confirmed = 0
        self._last_status = 0.0

    @property
    def received_lsn(self) -> int:
        """The highest position the server has told this connection of."""
        return self._decoder.heard

    @property
    def confirmed_lsn(self) -> int:
        """The position up to which everything is done with (the server frees WAL behind it)."""
        return self._confirmed

    def open(self) -> None:
        """Connect and start streaming from the slot's confirmed position (closing a connection
        this object had first). SlotMissing, SlotInUse, SlotLost or StreamBroken if it cannot."""
        self.close()
        conn = pq.PGconn.connect(self._conninfo.encode())
        if conn.status != pq.ConnStatus.OK:
            problem = _one_line(conn.error_message)
            conn.finish()
            raise StreamBroken(f"cannot open a replication connection: {problem}")
        try:
            self._start(conn)
        except BaseException:
            conn.finish()
            raise
        self._conn = conn

    def fileno(self) -> int:
        """The connection's socket, to wait on with select() until it is readable."""
        return self._live().socket

    def read(self, max_commits: int = 1000) -> list[Commit]:
        """The whole commits that have arrived, at most `max_commits`, in commit order; never
        waits. A transaction not yet whole stays buffered until its commit arrives. A full batch
        means more may be buffered where select() cannot see it: call again before waiting.
        StreamBroken when the connection fails or the server ends the stream."""
        conn = self._live()
        decoder = self._decoder
        rounds = 0
        try:
            while True:
                taken = decoder.drain(conn.get_copy_data, max_commits)
                if taken < 0:
                    self._ended(conn)
                # Full, or the socket had nothing more (the last refill gave no frame).
                full = len(decoder.ready) >= max_commits
                if full or (rounds and not taken) or rounds == _ROUNDS:
                    break
                conn.consume_input()
                rounds += 1
        except OperationalError as exc:
            self._broken(conn, exc)
        if decoder.reply:
            decoder.reply = False
            self.flush_status()
        elif self._clock() - self._last_status >= self._interval:
            self.flush_status()
        ready, decoder.ready = decoder.ready, []
        return ready

    def confirm(self, lsn: int) -> None:
        """Everything up to `lsn` (a commit's `end_lsn`) is done with; a lower one than already
        confirmed is ignored. Reported with the next status update (`flush_status` sends now)."""
        if lsn > self._confirmed:
            self._confirmed = lsn

    def idle(self) -> None:
        """Nothing read is in flight: the server may free all it has told of, though not past a
        transaction `read` has not returned yet."""
        self.confirm(self._decoder.settled_up_to())

    def flush_status(self, reply: bool = False) -> None:
        """Send a status update now (`reply`: ask the server to answer with a keepalive)."""
        conn = self._live()
        try:
            self._send_status(conn, reply)
        except OperationalError as exc:
            self._broken(conn, exc)

    def close(self) -> None:
        """Report the confirmed position, end the stream (the server releases the slot before
        this returns, within a couple of seconds) and disconnect. Idempotent; never raises."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            # Closing anyway: a connection that fails now has nothing more to say.
            with contextlib.suppress(Exception):
                self._send_status(conn, False)
                conn.put_copy_end()
                conn.flush()
                _wait_for_end(conn, time.monotonic() + _CLOSE_WAIT)
        finally:
            conn.finish()

    def _live(self) -> PGconn:
        if self._conn is None:
            raise StreamBroken("the replication stream is not open")
        return self._conn

    def _start(self, conn: PGconn) -> None:
        slot = self._slot_of(conn)
        self._check(slot)
        # The server never goes back behind its own confirmed position; this one may be ahead
        # when the last status update did not reach it, and the server skips what it covers.
        self._confirmed = max(self._confirmed, slot.confirmed)
        self._decoder = Decoder(self._prefix)
        self._decoder.heard = self._confirmed
        sql = _START_SQL.format(
            slot=self._slot, start=lsn_text(self._confirmed), publication=self._publication
        )
        result = conn.exec_(sql.encode())
        if result.status != pq.ExecStatus.COPY_BOTH:
            self._refused(conn, result)
        self._last_status = self._clock()

    def _slot_of(self, conn: PGconn) -> _Slot:
        sql = _SLOT_SQL.format(slot=self._slot, publication=self._publication)
        result = conn.exec_(sql.encode())
        if result.status != pq.ExecStatus.TUPLES_OK:
            raise StreamBroken(f"cannot read the replication slot's state: {_error(result)}")
        values = [result.get_value(0, column) for column in range(result.nfields)]
        database, plugin, pid, wal_status, confirmed, current, publication = (
            None if v is None else v.decode() for v in values
        )
        assert current is not None
        return _Slot(
            database,
            plugin,
            None if pid is None else int(pid),
            wal_status,
            0 if confirmed is None else parse_lsn(confirmed),
            current,
            publication == "t",
        )

    def _check(self, slot: _Slot) -> None:
        name, setup = self._slot, "run `outbox-relay capture setup`"
        if slot.database is None:
            raise SlotMissing(f'replication slot "{name}" does not exist: {setup}')
        if slot.database != slot.current_database:
            raise SlotMissing(
                f'replication slot "{name}" belongs to database "{slot.database}", not '
                f'"{slot.current_database}": give each database a slot of its own '
                "(outbox-relay capture setup --slot NAME)"
            )
        if slot.wal_status == "lost":
            raise self._lost()
        if slot.plugin != "pgoutput":
            raise CaptureError(
                f'replication slot "{name}" is not a logical slot decoding with pgoutput '
                f"(plugin {slot.plugin}): drop it, then {setup}"
            )
        if not slot.publication_exists:
            raise SlotMissing(f'publication "{self._publication}" does not exist: {setup}')

    def _lost(self) -> SlotLost:
        return SlotLost(
            f'replication slot "{self._slot}" was invalidated (the server removed WAL it held, '
            "see max_slot_wal_keep_size): the messages it had not delivered are lost. Drop it "
            "and set it up again (outbox-relay capture drop, then outbox-relay capture setup), "
            "then re-send what the applications committed in the meantime"
        )

    def _refused(self, conn: PGconn, result: PGresult) -> None:
        state = _sqlstate(result)
        said = _error(result)
        if state == _UNDEFINED_OBJECT:
            raise SlotMissing(
                f'replication slot "{self._slot}" does not exist: run `outbox-relay capture setup`'
            )
        if state == _OBJECT_IN_USE:
            pid = None
            with contextlib.suppress(CaptureError):  # the pid only makes the message better
                pid = self._slot_of(conn).active_pid
            who = "another process" if pid is None else f"another process (pid {pid})"
            raise SlotInUse(
                f'replication slot "{self._slot}" is in use by {who}: a slot has one reader '
                "at a time"
            )
        if state == _NOT_IN_PREREQUISITE_STATE and self._slot_of(conn).wal_status == "lost":
            raise self._lost()
        if state is None or state[:2] in ("08", "57"):  # connection lost, server shutting down
            raise StreamBroken(f"START_REPLICATION failed: {said}")
        raise CaptureError(f"START_REPLICATION failed: {said}")

    def _send_status(self, conn: PGconn, reply: bool) -> None:
        confirmed = self._confirmed
        conn.put_copy_data(
            pgoutput.status_update(
                write=max(self._decoder.heard, confirmed),
                flush=confirmed,
                apply=confirmed,
                clock=pgoutput.pg_clock(time.time()),
                reply=reply,
            )
        )
        conn.flush()
        self._last_status = self._clock()

    def _ended(self, conn: PGconn) -> None:
        """The server ended the COPY: say why, from what it sent with it."""
        said = ""
        try:
            conn.consume_input()
            while not conn.is_busy():
                result = conn.get_result()
                if result is None:
                    break
                if result.status == pq.ExecStatus.FATAL_ERROR and not said:
                    said = _error(result)
        except OperationalError:
            pass
        self._conn = None
        conn.finish()
        raise StreamBroken(f"the server ended the replication stream: {said or 'no reason given'}")

    def _broken(self, conn: PGconn, exc: OperationalError) -> None:
        self._conn = None
        conn.finish()
        raise StreamBroken(f"the replication connection failed: {_one_line(str(exc))}") from exc


def _wait_for_end(conn: PGconn, deadline: float) -> None:
    """Read until the server has answered the end of the COPY and finished the command (it
    releases the slot first), or until `deadline`."""
    with selectors.DefaultSelector() as selector:
        selector.register(conn.socket, selectors.EVENT_READ)
        copying = True
        while True:
            if copying:
                size, _ = conn.get_copy_data(1)
                if size != 0:
                    copying = size > 0  # -1: the server's answer to the end of the COPY
                    continue
            elif not conn.is_busy():
                if conn.get_result() is None:
                    return
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return
            conn.consume_input()


def _sqlstate(result: PGresult) -> str | None:
    state = result.error_field(pq.DiagnosticField.SQLSTATE)
    return None if state is None else state.decode()


def _error(result: PGresult) -> str:
    return _one_line(result.error_message)


def _one_line(text: bytes | str) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = text.strip().splitlines()
    return lines[0].removeprefix("ERROR:  ").removeprefix("FATAL:  ") if lines else "unknown"
