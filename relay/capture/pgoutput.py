"""The bytes of a logical replication stream decoded by pgoutput (protocol version 1), both ways:
the frames the server sends inside CopyData and the status update the relay answers with.

Pure: no connection, no clock. The stream (relay/capture/stream.py) hands libpq's
`get_copy_data` to `Decoder.drain`, which takes the CopyData payloads it has and keeps what a
transaction has said until its commit arrives, so a transaction is never returned in part. Only
what the relay needs is parsed: Begin, Commit and transactional logical decoding messages
carrying the relay's prefix; every other pgoutput message (Relation, Type, Origin, Insert, ...)
is skipped by its first byte.

Frames (https://www.postgresql.org/docs/current/protocol-replication.html), network byte order:

    w  Int64 walStart  Int64 walEnd  Int64 sendTime  Byten pgoutput message
    k  Int64 walEnd    Int64 sendTime  Byte1 replyRequested
    r  Int64 write  Int64 flush  Int64 apply  Int64 clock  Byte1 replyRequested   (to the server)

pgoutput messages (https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html):

    B  Int64 final_lsn  Int64 commit time  Int32 xid
    C  Int8 flags  Int64 commit_lsn  Int64 end_lsn  Int64 commit time
    M  Int8 flags (1: transactional)  Int64 lsn  String prefix (NUL-terminated)  Int32 n  Byten

Times are microseconds since PostgreSQL's epoch, `PG_EPOCH`. A position (LSN) is a 64-bit
integer, written by PostgreSQL as two hexadecimal halves, "16/B374D848".
"""

from __future__ import annotations

import datetime as dt
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass

XLOG_DATA = ord("w")
KEEPALIVE = ord("k")
BEGIN = ord("B")
COMMIT = ord("C")
MESSAGE = ord("M")
TRANSACTIONAL = 1  # the flag of a logical decoding message emitted with transactional = true

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)  # where the protocol's times count from
_UNIX_AT = 946_684_800  # PG_EPOCH in seconds since the Unix epoch
_UNIX_TO_PG_US = _UNIX_AT * 1_000_000
# A protocol time as a datetime, by way of a float: cheaper than adding a timedelta, and exact to
# the microsecond while the float's step (2**-22 s until 2106) is under half of one.
_from_unix = dt.datetime.fromtimestamp
_UTC = dt.UTC

_LSN = re.compile(r"[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}")
_U64 = struct.Struct("!Q")
_I32 = struct.Struct("!i")
_KEEPALIVE = struct.Struct("!QqB")  # walEnd, sendTime, replyRequested (after the 'k')
_BEGIN = struct.Struct("!QqI")  # final_lsn, commit time, xid (after the 'B')
_COMMIT = struct.Struct("!BQQq")  # flags, commit_lsn, end_lsn, commit time (after the 'C')
_STATUS = struct.Struct("!cQQQqB")
_XLOG_HEAD = 25  # 'w' and its three Int64: where the pgoutput message starts
_WAL_END_AT = 9  # the walEnd of an XLogData frame
_MESSAGE_FLAGS_AT = _XLOG_HEAD + 1
_MESSAGE_PREFIX_AT = _XLOG_HEAD + 10  # 'M', its flags and its Int64 lsn come first
_NOTHING = (0, memoryview(b""))  # get_copy_data's answer when it has no frame


def lsn_text(lsn: int) -> str:
    """A position as PostgreSQL writes it: "16/B374D848"."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """The position PostgreSQL writes as `text` ("16/B374D848"); ValueError if it is not one."""
    if _LSN.fullmatch(text) is None:
        raise ValueError(f"not a WAL position (expected e.g. 16/B374D848): {text!r}")
    high, _, low = text.partition("/")
    return int(high, 16) << 32 | int(low, 16)


def pg_time(microseconds: int) -> dt.datetime:
    """A protocol time (microseconds since `PG_EPOCH`) as an aware datetime."""
    return _from_unix(microseconds / 1e6 + _UNIX_AT, _UTC)


def pg_clock(unix_seconds: float) -> int:
    """A Unix time (`time.time()`) as the protocol's clock: microseconds since `PG_EPOCH`."""
    return round(unix_seconds * 1_000_000) - _UNIX_TO_PG_US


def status_update(*, write: int, flush: int, apply: int, clock: int, reply: bool) -> bytes:
    """A Standby Status Update: the server may free the WAL of a logical slot up to `flush`."""
    return _STATUS.pack(b"r", write, flush, apply, clock, 1 if reply else 0)


# Builders of what the server sends: for tests and for reading a stream without a server.


def xlog_data(wal_start: int, wal_end: int, message: bytes, send_time: int = 0) -> bytes:
    """An XLogData frame around a pgoutput message."""
    return b"w" + struct.pack("!QQq", wal_start, wal_end, send_time) + message


def keepalive(wal_end: int, *, reply: bool, send_time: int = 0) -> bytes:
    """A Primary keepalive frame."""
    return b"k" + _KEEPALIVE.pack(wal_end, send_time, 1 if reply else 0)


def begin(final_lsn: int, commit_time: int, xid: int) -> bytes:
    """A pgoutput Begin message."""
    return b"B" + _BEGIN.pack(final_lsn, commit_time, xid)


def commit(commit_lsn: int, end_lsn: int, commit_time: int) -> bytes:
    """A pgoutput Commit message."""
    return b"C" + _COMMIT.pack(0, commit_lsn, end_lsn, commit_time)


def message(lsn: int, prefix: str, content: bytes, *, transactional: bool = True) -> bytes:
    """A pgoutput logical decoding Message (protocol version 1: no xid)."""
    flags = TRANSACTIONAL if transactional else 0
    head = struct.pack("!BQ", flags, lsn) + prefix.encode() + b"\0"
    return b"M" + head + _I32.pack(len(content)) + content


@dataclass(frozen=True, slots=True)
class Commit:
    """A committed transaction's messages, in the order it emitted them."""

    end_lsn: int  # the commit record's end: confirm this once every message in it is published
    commit_time: dt.datetime  # UTC
    messages: list[bytes]  # each transactional message's content with the stream's prefix


class Decoder:
    """Turns the frames of one replication connection into whole commits.

    `ready` collects the commits that carried at least one message of `prefix`; the caller
    takes them and clears the list. A transaction with none of them (another prefix, only
    skipped messages) produces nothing: there is nothing in it to publish, and `heard` still
    moves past it. A new connection needs a new Decoder: the server starts over from the slot's
    confirmed position, and a transaction the last connection left half read comes again whole.
    """

    __slots__ = ("_begin", "_messages", "_prefix", "_prefix_end", "heard", "ready", "reply")

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix.encode() + b"\0"
        self._prefix_end = _MESSAGE_PREFIX_AT + len(self._prefix)
        self._messages: list[bytes] | None = None  # the open transaction's, between B and C
        self._begin = memoryview(b"")  # the open transaction's Begin frame
        self.ready: list[Commit] = []
        self.heard = 0  # the highest position the server has told: keepalives, XLogData walEnd
        self.reply = False  # a keepalive asked for a status update

    @property
    def in_transaction(self) -> bool:
        """Whether a Begin has arrived whose Commit has not."""
        return self._messages is not None

    def feed(self, frame: memoryview) -> None:
        """Take one CopyData payload (as `get_copy_data` gives it)."""
        frames = iter(((len(frame), frame),))
        self.drain(lambda _: next(frames, _NOTHING), sys.maxsize)

    def drain(
        self, get_copy_data: Callable[[int], tuple[int, memoryview]], max_commits: int
    ) -> int:
        """Take frames from `get_copy_data(1)` (libpq's, non-blocking) until it has none, or
        `ready` holds `max_commits`; returns how many it took, or -1 when the COPY has ended.
        Unknown frames and pgoutput messages are skipped.

        The hot path of capture, run for every frame, in one function so that its state stays
        in local variables. It parses only what it keeps: inside a transaction positions are not
        tracked (nothing there may be confirmed before its commit), and a message's content is
        the rest of its frame, so its length is not read.
        """
        ready = self.ready
        taken = 0
        if len(ready) >= max_commits:
            return taken
        messages = self._messages
        heard = self.heard
        prefix, prefix_end = self._prefix, self._prefix_end
        content_at = prefix_end + 4
        unpack_commit, unpack_u64, from_unix, utc = (
            _COMMIT.unpack_from,
            _U64.unpack_from,
            _from_unix,
            _UTC,
        )
        try:
            while True:
                size, frame = get_copy_data(1)
                if size <= 0:
                    return taken if size == 0 else -1
                taken += 1
                kind = frame[0]
                if kind == XLOG_DATA:
                    tag = frame[_XLOG_HEAD]
                    if messages is not None:
                        if tag == MESSAGE:
                            if frame[_MESSAGE_PREFIX_AT:prefix_end] == prefix and (
                                frame[_MESSAGE_FLAGS_AT] & TRANSACTIONAL
                            ):
                                messages.append(frame[content_at:].tobytes())
                        elif tag == COMMIT:
                            _, _, end_lsn, at = unpack_commit(frame, _XLOG_HEAD + 1)
                            if end_lsn > heard:
                                heard = end_lsn
                            if messages:
                                ready.append(
                                    Commit(end_lsn, from_unix(at / 1e6 + _UNIX_AT, utc), messages)
                                )
                                if len(ready) >= max_commits:
                                    messages = None
                                    return taken
                            messages = None
                    elif tag == BEGIN:
                        messages = []
                        self._begin = frame
                    else:
                        # Outside a transaction (a non-transactional message): not ours to
                        # publish, enqueue emits transactional ones. Its position counts.
                        (wal_end,) = unpack_u64(frame, _WAL_END_AT)
                        if wal_end > heard:
                            heard = wal_end
                elif kind == KEEPALIVE:
                    wal_end, _, reply = _KEEPALIVE.unpack_from(frame, 1)
                    if wal_end > heard:
                        heard = wal_end
                    if reply:
                        self.reply = True
        finally:
            self._messages = messages
            self.heard = heard

    def settled_up_to(self) -> int:
        """How far the server may free WAL once every commit handed out is published: what it
        has told us, but not past the commit record of a transaction still being read."""
        if self._messages is not None:
            final_lsn: int = _U64.unpack_from(self._begin, _XLOG_HEAD + 1)[0]
            return min(self.heard, final_lsn)
        return self.heard
