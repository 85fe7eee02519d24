"""The log as the loop's second source of messages (`--capture logical`).

Applications emit each message into their transaction's WAL (outbox/logged.py); the relay reads
them from its replication slot in commit order (relay/capture/stream.py) and publishes them as
it publishes claimed rows: they join the loop as one lease of their own (`lease`), whose rows
are settled here instead of in the table (this class is the lease's `Holder`). Nothing is
written for a message the broker confirmed: the slot is moved past it, and that is its mark.

A message takes the table's path, in the state the table's relay would give it, when it cannot
go at once or did not go:

- it failed (`settle_failures`: retry with backoff, deferred, or dead with its history), or
  was held back behind its key's message that failed (`release`);
- it is delayed, or its key has a message in the table (`held_keys`), or in that path already:
  the key's later messages wait behind it there, as the table's own key order keeps them;
- it cannot be read (dead-lettered as malformed, with the reason).

Such messages wait in `_moving` until nothing earlier of their key is still in flight from the
log, then are written together in log order (LogTable.admit), so a key's order holds from one
path to the other. A key's messages published from the log go as one chain (relay/loop/chains.py):
each sent once the one before it is confirmed, across reads of the log.

The slot moves past a commit (`stream.confirm`) once every message of it is resolved: confirmed
by the broker, or written into the table. A relay killed before that reads them again: at most
what it held is published twice, and nothing is lost.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from outbox import logged
from relay.capture.stream import Commit, SlotInUse, SlotLost, SlotMissing, StreamBroken
from relay.core.policy import Dead, Retry
from relay.errors import DatabaseUnavailable
from relay.loop.leases import Lease, Leases
from relay.loop.sources import SourceFailed
from relay.ports import Claimed
from relay.reconnect import Backoff
from relay.store.logtable import Admitted

log = logging.getLogger("relay.capture")

# Seconds between tries to take the slot while another relay holds it: a standby takes over
# within this of the holder's death (the server frees the slot when its connection ends).
STANDBY_RETRY = 2.0
# Seconds between the reports of how far the slot may move, at most, while messages settle.
TELL_EVERY = 0.01


class Stream(Protocol):
    """What the source needs of the replication stream (relay/capture/stream.py)."""

    def open(self) -> None: ...
    def fileno(self) -> int: ...
    def read(self, max_commits: int = ...) -> list[Commit]: ...
    def confirm(self, lsn: int) -> None: ...
    def idle(self) -> None: ...
    def flush_status(self, reply: bool = False) -> None: ...
    def close(self) -> None: ...


class Table(Protocol):
    """What the source writes to the outbox table (relay/store/logtable.py)."""

    def admit(self, rows: Sequence[Admitted], *, relay_id: str) -> None: ...
    def mark(self, ids: Sequence[str]) -> int: ...
    def held_keys(self, keys: Collection[str]) -> set[str]: ...


@dataclass(slots=True)
class _Open:
    """A commit read from the log and not yet resolved: its messages still to resolve."""

    end_lsn: int
    open: int


class LogSource:
    def __init__(
        self,
        stream: Stream,
        table: Table,
        *,
        relay_id: str,
        clock: Callable[[], float],
        wall: Callable[[], dt.datetime],
    ) -> None:
        self._stream = stream
        self._table = table
        self._relay_id = relay_id
        self._clock = clock
        self._wall = wall
        self.lease = Lease(uuid.uuid4(), {}, 0.0, holder=self)
        self._seqs = 0  # the log's messages are numbered here, in the order they are read
        self._commits: deque[_Open] = deque()
        self._commit_of: dict[int, _Open] = {}
        self._through = 0  # end of the last commit read: one read again after a reconnect is old
        self._with_row: dict[int, str] = {}  # seq -> id of a message that has a held row
        self._moving: dict[int, Admitted] = {}  # to be written into the table, by seq
        self._moving_keys: dict[str, int] = {}  # how many of those each key has
        self._generation: dict[str, int] = {}  # a key's chain is renamed each time it moves
        self._live: dict[str, int] = {}  # per key: its messages in the lease, unresolved
        self._single: set[str] = set()  # keys whose one message in the lease goes alone
        self._behind: dict[str, deque[Claimed]] = {}  # waiting for their key's single to settle
        self.connected = False
        self.standby = False  # another relay holds the slot: this one tries again
        self._next_try = 0.0
        self._told = 0.0  # clock time the server was last told how far the slot may move
        self._per_commit = 1.0  # messages per commit read, on average (recent ones weigh more)
        self._backoff = Backoff(first=0.2, cap=STANDBY_RETRY, floor=0.1)

    # ----------------------------------------------------------------- the stream

    def connect(self, now: float) -> bool:
        """Open the stream when due; True when it is open. Raises SlotLost or SlotMissing (the
        relay cannot go on); another relay holding the slot, or a broken connection, is tried
        again later."""
        if self.connected:
            return True
        if now < self._next_try:
            return False
        try:
            self._stream.open()
        except (SlotLost, SlotMissing) as exc:
            raise SourceFailed(str(exc)) from exc
        except SlotInUse as exc:
            if not self.standby:
                log.info("relay.capture_standby", extra={"error": str(exc)})
            self.standby = True
            self._next_try = now + STANDBY_RETRY
            return False
        except StreamBroken as exc:
            wait = self._backoff.failed()
            log.error("relay.capture_unavailable", extra={"error": str(exc), "retry_in": wait})
            self._next_try = now + wait
            return False
        if self.standby:
            log.info("relay.capture_taken_over")
        self.standby = False
        self.connected = True
        self._backoff.succeeded()
        log.info("relay.capture_started")
        return True

    def fileno(self) -> int | None:
        return self._stream.fileno() if self.connected else None

    def _broken(self, exc: Exception) -> None:
        self._stream.close()
        self.connected = False
        wait = self._backoff.failed()
        self._next_try = self._clock() + wait
        log.error("relay.capture_unavailable", extra={"error": str(exc), "retry_in": wait})

    # ----------------------------------------------------------------- reading

    def intake(
        self, leases: Leases, room: int, passed_by: Callable[[str, str], bool] | None = None
    ) -> tuple[int, bool]:
        """Read what the log has, up to about `room` messages: publish each into the lease, or
        route it to the table (`passed_by`: its destination's circuit is open, or it is rate
        limited, and the table's claims see to it). Returns the messages taken into the lease,
        and whether the log may have more at once (a full read)."""
        if room <= 0 or not self.connect(self._clock()):
            return 0, False
        try:
            # The stream counts commits, the room messages: a commit's share of the room by the
            # size of those read so far, so one read takes about what there is room for.
            wanted = max(1, int(room / self._per_commit))
            commits = self._stream.read(wanted)
        except (SlotLost, SlotMissing) as exc:
            raise SourceFailed(str(exc)) from exc
        except StreamBroken as exc:
            self._broken(exc)
            return 0, False
        taken = self._take(commits, leases, passed_by) if commits else 0
        if commits:
            size = sum(len(c.messages) for c in commits) / len(commits)
            self._per_commit += (size - self._per_commit) / 4
        return taken, len(commits) >= wanted

    def _take(
        self,
        commits: list[Commit],
        leases: Leases,
        passed_by: Callable[[str, str], bool] | None = None,
    ) -> int:
        now = self._wall()
        read: list[tuple[int, logged.Logged | Exception, _Open]] = []
        data_of: dict[int, bytes] = {}  # the bytes of those that cannot be read
        for commit in commits:
            if commit.end_lsn <= self._through:
                continue  # read before a reconnect, and held or resolved already
            self._through = commit.end_lsn
            opened = _Open(commit.end_lsn, len(commit.messages))
            self._commits.append(opened)
            for data in commit.messages:
                self._seqs += 1
                try:
                    message: logged.Logged | Exception = logged.unpack(data)
                except (logged.LoggedError, ValueError) as exc:
                    message = exc
                    data_of[self._seqs] = data
                    log.error("relay.capture_malformed", extra={"error": str(exc),
                                                                "lsn": commit.end_lsn})  # fmt: skip
                read.append((self._seqs, message, opened))
                self._commit_of[self._seqs] = opened
        unknown = {
            m.key
            for _, m, _ in read
            if isinstance(m, logged.Logged) and m.key is not None and not self._direct(m.key)
        }
        try:
            held = self._table.held_keys(unknown) if unknown else set()
        except DatabaseUnavailable as exc:
            # Whether the table holds them cannot be known now: they take the table's path,
            # written once the database is back (nothing read is dropped).
            log.error("relay.capture_keys_unknown", extra={"error": str(exc)})
            held = unknown
        lease = self.lease
        taken = 0
        keyed: dict[str, list[Claimed]] = {}  # this read's messages of each key, in order
        for seq, message, opened in read:
            if isinstance(message, Exception):
                self._move(seq, _malformed(message, data_of[seq], opened.end_lsn, now))
                continue
            key = message.key
            if message.has_row:
                self._with_row[seq] = message.id
            if (
                message.available_at > now
                or (key is not None and (key in held or key in self._moving_keys))
                or (passed_by is not None and passed_by(message.exchange, message.routing_key))
            ):
                self._move(seq, _waiting(message))
                continue
            row = Claimed(
                seq,
                message.id,
                message.exchange,
                message.routing_key,
                message.payload,
                message.content_type,
                message.headers,
                key,
                message.priority,
                1,
                message.max_attempts,
                message.available_at,
                message.created_at,
                message.traceparent,
                message.tracestate,
            )
            if key is None:
                lease.rows[seq] = row
                lease.unsent.append(row)
                taken += 1
            else:
                keyed.setdefault(key, []).append(row)
        for key, rows in keyed.items():
            if key in self._single:
                # Its key's message in flight goes alone: these wait for it to settle.
                self._behind.setdefault(key, deque()).extend(rows)
            else:
                self._hand(key, rows)
                taken += len(rows)
        if lease.rows and lease.token not in leases:
            leases[lease.token] = lease
        self.flush()
        return taken

    def _hand(self, key: str, rows: list[Claimed]) -> None:
        """Give a key's messages to the lease, after what it has of the key. A key with nothing
        in flight and one message goes alone, side by side with the others, as a claim's
        single keyed row goes; otherwise as (more of) the key's chain, each message sent once
        the one before it is confirmed."""
        lease = self.lease
        for row in rows:
            lease.rows[row.seq] = row
        if key not in self._live and len(rows) == 1:
            lease.unsent.append(rows[0])
            self._single.add(key)
        else:
            lease.chains.setdefault(self._chain(key), deque()).extend(rows)
        self._live[key] = self._live.get(key, 0) + len(rows)

    def _direct(self, key: str) -> bool:
        """Whether the key has messages from the log in flight: its next one follows them."""
        return key in self._live or key in self._behind

    def _gone(self, key: str | None) -> None:
        """A message of `key` left the lease (resolved, or on its way to the table). Once the
        key has none left there, those that waited behind it follow: into the lease, or into
        the table behind it if it went there."""
        if key is None or key not in self._live:
            return
        left = self._live[key] - 1
        if left:
            self._live[key] = left
            return
        del self._live[key]
        self._single.discard(key)
        behind = self._behind.pop(key, None)
        if not behind:
            return
        if key in self._moving_keys:
            for row in behind:
                self._move(row.seq, _behind(row, row.seq in self._with_row))
        else:
            self._hand(key, list(behind))

    def _chain(self, key: str) -> str:
        generation = self._generation.get(key, 0)
        return key if generation == 0 else f"{key}\0{generation}"

    # ----------------------------------------------------------------- into the table

    def _move(self, seq: int, row: Admitted) -> None:
        self._moving[seq] = row
        if row.key is not None:
            self._moving_keys[row.key] = self._moving_keys.get(row.key, 0) + 1
            # Its chain, if it had one, ended here: the next time the key goes from the log,
            # it is a new chain (the publisher holds a broken one back for good).
            self._generation[row.key] = self._generation.get(row.key, 0) + 1

    def flush(self) -> int:
        """Write into the table, in log order, every message waiting for it whose key has
        nothing earlier still in flight from the log; how many. A database failure keeps them
        for the next call (the slot is not moved past them meanwhile)."""
        if not self._moving:
            return 0
        first_live: dict[str, int] = {}
        for seq, row in self.lease.rows.items():
            if row.key is not None and row.key in self._moving_keys and seq not in self._moving:
                first_live[row.key] = min(seq, first_live.get(row.key, seq))
        ready = [
            seq
            for seq in sorted(self._moving)
            if (key := self._moving[seq].key) is None or seq < first_live.get(key, seq + 1)
        ]
        if not ready:
            return 0
        try:
            self._table.admit([self._moving[seq] for seq in ready], relay_id=self._relay_id)
        except DatabaseUnavailable as exc:
            log.error("relay.capture_admit_failed", extra={"error": str(exc)})
            return 0
        for seq in ready:
            key = self._moving.pop(seq).key
            if key is not None:
                left = self._moving_keys[key] - 1
                if left:
                    self._moving_keys[key] = left
                else:
                    del self._moving_keys[key]
            self._resolve(seq)
        return len(ready)

    # ----------------------------------------------------------------- the slot

    def _resolve(self, seq: int) -> None:
        self._with_row.pop(seq, None)
        opened = self._commit_of.pop(seq, None)
        if opened is not None:
            opened.open -= 1

    def advance(self) -> None:
        """Move the slot past every commit read whose messages are all resolved; with nothing
        held, past everything the server has sent (other databases' traffic included)."""
        if not self.connected:
            return
        commits = self._commits
        last = None
        while commits and commits[0].open <= 0:
            last = commits.popleft().end_lsn
        if last is not None:
            self._stream.confirm(last)
        if not commits and not self._moving:
            self._stream.idle()
        now = self._clock()
        if last is not None and now - self._told >= TELL_EVERY:
            # At once, not at the stream's next status update: a relay killed now publishes
            # again only what it held (and the rest of a transaction it began).
            self._told = now
            try:
                self._stream.flush_status()
            except StreamBroken as exc:
                self._broken(exc)

    @property
    def held(self) -> int:
        """Messages read from the log and not yet resolved."""
        return len(self._commit_of)

    def close(self) -> None:
        """Say how far the slot may move, and let it go (another relay may take it)."""
        if self.connected:
            self.advance()
            self._stream.close()
            self.connected = False

    # ----------------------------------------------------------------- Holder

    def mark_published(self, token: uuid.UUID, seqs: Sequence[int]) -> int:
        """Confirmed by the broker: resolved, once the held rows among them are marked."""
        ids = [self._with_row[seq] for seq in seqs if seq in self._with_row]
        if ids:
            self._table.mark(ids)  # may raise DatabaseUnavailable: the settler tries again
        rows = self.lease.rows
        for seq in seqs:
            row = rows.get(seq)
            if row is not None:
                self._gone(row.key)
            self._resolve(seq)
        return len(seqs)

    def settle_failures(
        self, token: uuid.UUID, decisions: Sequence[Retry | Dead], *, relay_id: str
    ) -> int:
        """Failures go into the table as the table's relay would settle them."""
        rows = self.lease.rows
        for decision in decisions:
            row = rows.get(decision.seq)
            if row is not None:  # moved first: what waits behind it follows it there
                self._move(decision.seq, _failed(row, decision, decision.seq in self._with_row))
                self._gone(row.key)
        self.flush()
        return len(decisions)

    def release(
        self, token: uuid.UUID, seqs: Sequence[int], *, delay_seconds: float, error: str
    ) -> int:
        """Given back unsent (held back behind its key, the broker away, a stop): into the
        table, pending, no attempt charged."""
        at = self._wall() + dt.timedelta(seconds=delay_seconds)
        rows = self.lease.rows
        for seq in seqs:
            row = rows.get(seq)
            if row is not None:  # moved first: what waits behind it follows it there
                self._move(seq, _released(row, seq in self._with_row, at, error))
                self._gone(row.key)
        self.flush()
        return len(seqs)

    def abandon(
        self, token: uuid.UUID, *, error: str, relay_id: str = "", max_attempts: int = 10
    ) -> int:
        """The relay is crashing: nothing is written, and the slot keeps them for the next."""
        return 0


# ----------------------------------------------------------------------- table rows


def _admitted(
    row: Claimed | logged.Logged,
    *,
    has_row: bool,
    state: str,
    attempts: int,
    available_at: dt.datetime,
    error: str | None,
    failure_class: str | None = None,
    outcome: str | None = None,
) -> Admitted:
    return Admitted(
        row.id,
        has_row,
        row.exchange,
        row.routing_key,
        row.payload,
        row.content_type,
        row.headers,
        row.key,
        row.priority,
        row.max_attempts,
        state,
        attempts,
        available_at,
        row.created_at,
        row.traceparent,
        row.tracestate,
        error,
        failure_class,
        outcome,
    )


def _waiting(message: logged.Logged) -> Admitted:
    """A message that may not go now (delayed, or its key held in the table)."""
    return _admitted(
        message,
        has_row=message.has_row,
        state="pending",
        attempts=0,
        available_at=message.available_at,
        error=None,
    )


def _failed(row: Claimed, decision: Retry | Dead, has_row: bool) -> Admitted:
    if isinstance(decision, Dead):
        return _admitted(
            row,
            has_row=has_row,
            state="dead",
            attempts=row.attempts,
            available_at=row.available_at,
            error=decision.reason,
            failure_class=decision.failure.cls.value,
            outcome=decision.kind,
        )
    return _admitted(
        row,
        has_row=has_row,
        state="pending",
        attempts=row.attempts if decision.burn else row.attempts - 1,
        available_at=decision.at,
        error=decision.failure.detail,
        failure_class=decision.failure.cls.value,
        outcome=decision.kind,
    )


def _behind(row: Claimed, has_row: bool) -> Admitted:
    """A message that waited behind its key's message, which went into the table."""
    return _admitted(
        row, has_row=has_row, state="pending", attempts=0, available_at=row.available_at, error=None
    )


def _released(row: Claimed, has_row: bool, at: dt.datetime, error: str) -> Admitted:
    return _admitted(
        row, has_row=has_row, state="pending", attempts=0, available_at=at, error=error
    )


def _malformed(exc: Exception, data: bytes, lsn: int, now: dt.datetime) -> Admitted:
    """A message that cannot be read: dead, under an id of its own, its bytes as the payload
    for an operator to look at, with why and where."""
    return Admitted(
        str(uuid.uuid4()),
        False,
        "",
        "",
        data,
        "application/octet-stream",
        None,
        None,
        0,
        None,
        "dead",
        0,
        now,
        now,
        None,
        None,
        f"malformed message in the log (commit ending at {lsn:X}): {exc}",
        "malformed",
        "dead",
    )
