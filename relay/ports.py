"""The ports between the relay loop and its adapters (the database, the broker): plain values in,
plain values out. The loop sees its adapters only through these; they see only these and the core.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from relay.core.bucket import Bucket
from relay.core.circuit import Circuit
from relay.core.outcome import Outcome
from relay.core.policy import Dead, Retry
from relay.core.retention import RetentionPolicy
from relay.errors import RelayError

T = TypeVar("T")

# Waits until a file descriptor is ready: (fileno, events wanted) -> events ready, each a
# selectors event mask (EVENT_READ 1, EVENT_WRITE 2). Store.while_waiting takes one.
FdWait = Callable[[int, int], int]


class Claimed(NamedTuple):
    """A row the relay holds under a lease, with everything needed to publish it. A NamedTuple,
    not a frozen dataclass: hundreds are made a claim, and a frozen dataclass's __init__ costs
    ten times as much."""

    seq: int
    id: str  # the message id as text: what goes on the wire as message_id
    exchange: str
    routing_key: str
    payload: bytes
    content_type: str
    headers: Mapping[str, Any] | None
    key: str | None
    priority: int
    attempts: int  # including the attempt this claim starts
    max_attempts: int | None
    available_at: dt.datetime
    created_at: dt.datetime
    traceparent: str | None
    tracestate: str | None
    # The last lease on it ended unsettled (its relay died holding it): it is claimed with other
    # suspects only, or alone, and must be published with nothing else in flight
    # (relay/core/suspects.py).
    suspect: bool = False


@dataclass(frozen=True, slots=True)
class StateCounts:
    by_state: Mapping[str, int]
    ready: int  # pending and due now
    delayed: int  # pending, due later
    oldest_ready_age_s: float | None  # how long the longest-waiting due message has been due
    # The states whose figure in by_state is an estimate (published and cancelled beside a large
    # table, relay/store/estimates.py); every other figure is exact.
    estimated: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class TableHealth:
    """What the database says of one of the relay's tables: whether autovacuum may clean it, and
    its live and dead rows (the statistics system's running counts, PostgreSQL's n_live_tup and
    n_dead_tup). Every UPDATE and DELETE the relay makes leaves a dead row that only a VACUUM
    reclaims: with autovacuum off, the table and its indexes grow for ever, and claims slow."""

    table: str
    autovacuum: bool  # False: neither autovacuum nor anything else here will ever vacuum it
    why_not: str | None  # when autovacuum is False: the server's setting or the table's own
    live: int
    dead: int

    @property
    def dead_ratio(self) -> float:
        """Dead rows out of all (0 for an empty table)."""
        total = self.live + self.dead
        return self.dead / total if total > 0 else 0.0


class Holder(Protocol):
    """Where the rows of a lease are settled: the outbox table (the Store) for claimed rows, the
    log for messages read from it (relay/capture/source.py). Each call names the lease's token
    and its rows by seq, as the Store's methods of the same names do."""

    def mark_published(self, token: uuid.UUID, seqs: Sequence[int]) -> int: ...

    def settle_failures(
        self, token: uuid.UUID, decisions: Sequence[Retry | Dead], *, relay_id: str
    ) -> int: ...

    def release(
        self, token: uuid.UUID, seqs: Sequence[int], *, delay_seconds: float, error: str
    ) -> int: ...

    def abandon(
        self, token: uuid.UUID, *, error: str, relay_id: str = "", max_attempts: int = 10
    ) -> int: ...


class Store(Protocol):
    def claim(
        self,
        *,
        owner: str,
        token: uuid.UUID,
        limit: int,
        lease_seconds: float,
        exclude: Sequence[str] = (),
        only: str | None = None,
        suspect_group: int = 1,
        run: int = 0,
        follow: int | None = None,
    ) -> list[Claimed]:
        """Lease up to `limit` ready rows to `token`, highest priority and oldest due first.

        Rows whose resource part is in `exclude` are passed by; with `only`, just that part's.
        Suspects are claimed apart: at most `suspect_group` together, or one alone. With `run`,
        up to that many more messages of each keyed head's key, in key order, under the same
        lease (a run, published one after another; `follow` more rows at most in all, `limit`
        when not given)."""

    def claim_run(
        self,
        *,
        owner: str,
        token: uuid.UUID,
        after: int,
        limit: int,
        lease_seconds: float,
        exclude: Sequence[str] = (),
    ) -> list[Claimed]:
        """Lease to `token` the next run of the key of message `after`: up to `limit` more of
        its messages after it, in key order, as a claim's run would take them. Only while every
        earlier unfinished message of the key is `token`'s, in flight: a chain being sent
        goes on without waiting for its own end (relay/loop/chains.py). In seq order."""

    def has_ready(self, part: str) -> bool:
        """Whether a message of the resource `part` is ready to be claimed."""

    def resources(self) -> list[ResourceRow]:
        """Every resource row (circuits and buckets), shared by all relays."""

    def change_resource(
        self, resource: str, change: Callable[[ResourceRow, dt.datetime], tuple[ResourceRow, T]]
    ) -> T:
        """Apply `change` to the resource's row under a lock (created closed if missing), at
        the database's time; write the row it returns and return its second value."""

    def mark_published(self, token: uuid.UUID, seqs: Sequence[int]) -> int:
        """Mark rows published, only where `token` still holds their lease; return rows changed."""

    def release(
        self, token: uuid.UUID, seqs: Sequence[int], *, delay_seconds: float, error: str
    ) -> int:
        """Give rows back for a later attempt, only where `token` still holds their lease."""

    def unpark_sweep(self) -> int:
        """Unpark the next message of every key whose parked messages nothing blocks any more."""

    def extend_leases(self, tokens: Sequence[uuid.UUID], lease_seconds: float) -> int:
        """Push back the expiry of every row still leased to one of `tokens`."""

    def settle_failures(
        self, token: uuid.UUID, decisions: Sequence[Retry | Dead], *, relay_id: str
    ) -> int:
        """Apply retry/dead decisions where `token` still holds the lease; record the attempts."""

    def reclaim_expired(self, *, relay_id: str = "", max_attempts: int = 10) -> int:
        """Return rows whose lease expired (their relay died or stalled) to the ready set, as
        suspects; a row that was claimed alone is charged the attempt (dead past its attempts)."""

    def abandon(
        self, token: uuid.UUID, *, error: str, relay_id: str = "", max_attempts: int = 10
    ) -> int:
        """Do to the rows `token` holds what reclaim_expired does to an expired lease, now: this
        relay is crashing and one of them may be why."""

    def purge_expired(self, policy: RetentionPolicy, now: dt.datetime) -> int:
        """One bounded retention pass: delete the terminal messages `policy` says have expired.
        Raises DatabaseUnavailable, or RetentionFailed for any other database error."""

    def heartbeat(self, relay_id: str) -> None:
        """Say this relay is alive (outbox_relay)."""

    def register_relay(self, relay_id: str) -> dt.datetime:
        """Begin a run of this relay (its heartbeat row, taken over from any earlier run of the
        same id); return the time that names the run."""

    def beat(self, relay_id: str, started_at: dt.datetime) -> bool:
        """Say the run `started_at` is alive; False when its row is gone (another relay found
        its heartbeat stopped, and took its leases) or names another run."""

    def reclaim_owner(self, relay_id: str, *, max_attempts: int = 10) -> int:
        """Do to every row leased to `relay_id` what reclaim_expired does to an expired lease:
        an earlier run of this relay id died holding them."""

    def reclaim_strays(
        self, relay_id: str, held: Collection[tuple[uuid.UUID, int]], *, max_attempts: int = 10
    ) -> int:
        """Do to every row leased to `relay_id` but not among `held` (lease token, seq) what
        reclaim_expired does to an expired lease: a claim whose answer a database outage lost."""

    def reclaim_dead(
        self, *, relay_id: str, dead_after: float, max_attempts: int = 10
    ) -> tuple[list[str], int]:
        """Forget the relays (not `relay_id`) whose heartbeat is older than `dead_after` seconds
        and take their leases back as reclaim_expired would; return those relays and how many
        rows came back."""

    def forget_relay(self, relay_id: str) -> None:
        """Remove this relay's heartbeat on a clean stop."""

    def relays(self, within_seconds: float) -> list[tuple[str, dt.datetime, dt.datetime]]:
        """Relays seen within `within_seconds`."""

    def counts(self) -> StateCounts: ...

    def ping(self) -> None: ...

    def while_waiting(self, wait: FdWait) -> AbstractContextManager[None]:
        """On the calling thread, until the block ends, wait for the database by calling
        `wait(fileno, events)` (which may do other work meanwhile), where the driver allows."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ResourceRow:
    """A resource's shared row: its circuit and its rate-limit bucket."""

    circuit: Circuit
    bucket: Bucket


# ----------------------------------------------------------------------- the broker


@dataclass(slots=True)
class Outgoing:
    """A message ready for the wire (relay/amqp/wire.py makes one from a Claimed row): its
    basic.publish and content header already encoded (relay/amqp/frames.py), so sending it is
    framing them with a channel's number."""

    seq: int  # the row's: its outcome names it
    message_id: str
    exchange: str
    routing_key: str
    body: bytes
    method: bytes  # the basic.publish method's arguments, encoded
    header: bytes  # the content header (body size and properties), encoded


class RetentionFailed(RelayError):
    """A retention pass failed for a reason other than an outage (housekeeping: the relay goes
    on, and tries again after the policy's interval)."""


class MalformedRow(ValueError):
    """A stored row cannot be turned into a message: it would fail the same way forever."""


# Called once per batch, with one outcome per message, when the broker has answered them all.
Done = Callable[[list[Outcome]], None]


class Publisher(Protocol):
    @property
    def ready(self) -> bool: ...  # connected, with somewhere to publish

    @property
    def blocked(self) -> bool: ...  # the broker pushes back (a resource alarm): publish nothing new

    def encode(
        self, row: Claimed, *, traceparent: str | None = None, tracestate: str | None = None
    ) -> Outgoing:
        """The message for `row` (`traceparent`/`tracestate` replace the stored ones: the
        relay's send span); raise MalformedRow when there can be none."""

    def start(self, timeout: float = ...) -> None:
        """Connect; raise BrokerUnavailable if that fails."""

    def wait(self, timeout: float) -> None:
        """Do the broker's IO for up to `timeout` seconds (0: what is ready now): the answers
        that arrive call their batches' `done`. Returns early on `interrupt()`."""

    def interrupt(self) -> None:
        """End a `wait()` early; the only method safe from another thread."""

    def wait_fd(self, fileno: int, events: int) -> int:
        """Wait until `fileno` is ready for `events` (selectors' EVENT_READ, EVENT_WRITE),
        doing the broker's IO meanwhile; return the events that are ready."""

    def watch(self, fileno: int, ready: Callable[[], None]) -> None:
        """Call `ready` from `wait()` whenever `fileno` can be read (ending the wait), until
        `unwatch(fileno)`."""

    def unwatch(self, fileno: int) -> None: ...

    def publish(
        self, items: Sequence[Outgoing], done: Done, *, chain: Hashable | None = None
    ) -> None:
        """Hand over a batch; `done(outcomes)` is called once the broker has answered every
        message: in a later `wait()`, or at once when none can be sent.

        `chain`: the batches handed over with the same chain go one message at a time, in the
        order handed over, each sent once the one before it is confirmed; after the first that
        is not, none of the chain's are sent (NOT_SENT, `held_back`), in this batch or a later
        one. A key's order then holds whatever the broker does with any one of them."""

    def stop(self, timeout: float = ...) -> None:
        """Close; unanswered messages are reported as not confirmed."""
