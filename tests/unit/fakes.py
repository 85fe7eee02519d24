"""Fakes at the port boundary of the relay loop: an in-memory store and a scripted publisher."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Callable, Collection, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from relay.amqp.wire import to_outgoing
from relay.core.bucket import Bucket
from relay.core.circuit import Circuit
from relay.core.outcome import Fate, Outcome
from relay.core.policy import Dead, Retry
from relay.core.retention import RetentionPolicy
from relay.errors import DatabaseUnavailable
from relay.ports import Claimed, Done, FdWait, Outgoing, ResourceRow, StateCounts, T

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclass
class Row:
    claimed: Claimed  # as added; a claim hands out a copy with the row's current values
    state: str = "pending"
    token: uuid.UUID | None = None
    error: str | None = None
    burned: int = 0  # failures that counted against max_attempts
    released: int = 0  # times given back unsent
    abandoned: int = 0  # times given up by a crashing relay
    available_at: dt.datetime = EPOCH  # claimable from then on
    attempts: int = 0  # claims charged so far (a claim counts the one it starts)
    lease_expires: dt.datetime | None = None
    suspect: bool = False  # its last lease ended unsettled (see relay/ports.py, Claimed)

    @classmethod
    def of(cls, claimed: Claimed) -> Row:
        return cls(
            claimed,
            available_at=claimed.available_at,
            attempts=claimed.attempts - 1,
            suspect=claimed.suspect,
        )


def make_claimed(seq: int, **overrides: object) -> Claimed:
    fields: dict[str, object] = {
        "seq": seq,
        "id": str(uuid.UUID(int=seq)),
        "exchange": "ex",
        "routing_key": "rk",
        "payload": b"{}",
        "content_type": "application/json",
        "headers": None,
        "key": None,
        "priority": 0,
        "attempts": 1,
        "max_attempts": None,
        "available_at": EPOCH,
        "created_at": EPOCH,
        "traceparent": None,
        "tracestate": None,
    }
    fields.update(overrides)
    return Claimed(**fields)  # type: ignore[arg-type]


# The states of an earlier message of its key that keep a keyed message waiting (dead_key="hold",
# the default; relay/store/common.py, BLOCKING_HOLD).
BLOCKING = ("pending", "in_flight", "dead")


@dataclass
class FakeStore:
    """An in-memory Store that keeps the real stores' contract
    (tests/contract/test_store_contract.py runs the same tests on it and on them): claim order,
    per-key heads and runs, lease guards, due times by `now`, lease expiry. Not modelled: crash
    isolation beyond "suspects are claimed apart" (no solitary step, no attempt charged on
    reclaim), attempt records, parking, retention."""

    rows: dict[int, Row] = field(default_factory=dict)
    fail_next: list[str] = field(default_factory=list)  # operation names that raise once
    history: list[tuple[int, str, str]] = field(default_factory=list)
    resource_rows: dict[str, ResourceRow] = field(default_factory=dict)
    now: dt.datetime = EPOCH  # the store's clock: due times, leases, resource transitions
    alive: dict[str, dt.datetime] = field(default_factory=dict)
    runs: dict[str, dt.datetime] = field(default_factory=dict)  # relay id -> its run's start
    runs_asked: list[int] = field(default_factory=list)  # each claim's `run`
    runs_extended: list[int] = field(default_factory=list)  # each claim_run's `after`

    def add(self, *claimed: Claimed) -> None:
        for c in claimed:
            self.rows[c.seq] = Row.of(c)

    def purge_expired(self, policy: RetentionPolicy, now: dt.datetime) -> int:
        return 0

    def _maybe_fail(self, op: str) -> None:
        if op in self.fail_next:
            self.fail_next.remove(op)
            raise DatabaseUnavailable(f"{op}: database is down (fake)")

    def _due(self, row: Row) -> bool:
        return row.state == "pending" and row.available_at <= self.now

    def _line(self, key: str) -> list[Row]:
        """The key's messages in seq order."""
        return sorted((r for r in self.rows.values() if r.claimed.key == key), key=_seq)

    def _is_head(self, row: Row) -> bool:
        """Nothing earlier of its key is unfinished, or dead (it holds the key)."""
        key = row.claimed.key
        return key is None or not any(
            r.claimed.seq < row.claimed.seq and r.state in BLOCKING for r in self._line(key)
        )

    def _lease(self, rows: list[Row], token: uuid.UUID, lease_seconds: float) -> list[Claimed]:
        for r in rows:
            r.state, r.token, r.attempts = "in_flight", token, r.attempts + 1
            r.lease_expires = self.now + dt.timedelta(seconds=lease_seconds)
        return [
            r.claimed._replace(attempts=r.attempts, available_at=r.available_at, suspect=r.suspect)
            for r in rows
        ]

    def _follow(
        self, head: Row, run: int, exclude: Sequence[str], only: str | None = None
    ) -> list[Row]:
        """Up to `run` messages after `head` in its key's line (its unfinished or dead ones),
        the prefix that is ready: pending, due, never leased unsettled, not excluded."""
        key = head.claimed.key
        assert key is not None
        behind = [
            r for r in self._line(key) if r.claimed.seq > head.claimed.seq and r.state in BLOCKING
        ][:run]
        taken: list[Row] = []
        for r in behind:
            part = r.claimed.exchange
            if not self._due(r) or r.suspect or part in exclude or only not in (None, part):
                break
            taken.append(r)
        return taken

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
        self._maybe_fail("claim")
        self.runs_asked.append(run)
        ready = sorted(
            (
                r
                for r in self.rows.values()
                if self._due(r)
                and r.claimed.exchange not in exclude
                and (only is None or r.claimed.exchange == only)
                and self._is_head(r)
            ),
            key=_claim_order,
        )[:limit]
        suspects = [r for r in ready if r.suspect][: max(1, suspect_group)]
        chosen = suspects or ready  # suspects are claimed apart, as in the store
        if run > 0 and not suspects:  # a run behind each keyed head, `follow` more at most
            extra: list[Row] = []
            for head in [r for r in chosen if r.claimed.key is not None]:
                extra += self._follow(head, run, exclude, only)
            chosen = chosen + extra[: max(0, limit if follow is None else follow)]
        return sorted(self._lease(chosen, token, lease_seconds), key=_claimed_order)

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
        """As the store: the next `limit` of the key of `after`, while every earlier unfinished
        one of the key is `token`'s in flight; the prefix that is pending and due."""
        self._maybe_fail("claim_run")
        self.runs_extended.append(after)
        row = self.rows.get(after)
        if row is None or row.claimed.key is None or limit <= 0:
            return []
        if any(
            r.state in BLOCKING and not (r.state == "in_flight" and r.token == token)
            for r in self._line(row.claimed.key)
            if r.claimed.seq <= after
        ):
            return []
        return self._lease(self._follow(row, limit, exclude), token, lease_seconds)

    def _guarded(self, token: uuid.UUID, seqs: Sequence[int]) -> list[Row]:
        """The rows of `seqs` still leased to `token` (a stale token changes nothing)."""
        rows = (self.rows.get(s) for s in seqs)
        return [r for r in rows if r is not None and r.token == token and r.state == "in_flight"]

    def _end_lease(self, row: Row, state: str) -> None:
        row.state, row.token, row.lease_expires = state, None, None

    def mark_published(self, token: uuid.UUID, seqs: Sequence[int]) -> int:
        self._maybe_fail("mark")
        rows = self._guarded(token, seqs)
        for r in rows:
            self._end_lease(r, "published")
            r.error, r.suspect = None, False
        return len(rows)

    def release(
        self, token: uuid.UUID, seqs: Sequence[int], *, delay_seconds: float, error: str
    ) -> int:
        """Back to pending unsent, due after `delay_seconds`, the attempt not charged."""
        self._maybe_fail("release")
        rows = self._guarded(token, seqs)
        for r in rows:
            self._end_lease(r, "pending")
            r.error = error
            r.available_at = self.now + dt.timedelta(seconds=delay_seconds)
            r.attempts = max(r.attempts - 1, 0)
            r.released += 1
        return len(rows)

    def abandon(
        self, token: uuid.UUID, *, error: str, relay_id: str = "", max_attempts: int = 10
    ) -> int:
        self._maybe_fail("abandon")
        rows = [r for r in self.rows.values() if r.token == token and r.state == "in_flight"]
        for r in rows:
            self._take_back(r)
            r.error = error
            r.abandoned += 1
        return len(rows)

    def _take_back(self, row: Row) -> None:
        """A lease ended unsettled: pending again, as a suspect, the attempt not charged."""
        row.state, row.token, row.suspect = "pending", None, True
        row.attempts = max(row.attempts - 1, 0)

    def settle_failures(
        self, token: uuid.UUID, decisions: Sequence[Retry | Dead], *, relay_id: str
    ) -> int:
        self._maybe_fail("settle")
        changed = 0
        for d in decisions:
            rows = self._guarded(token, [d.seq])
            if not rows:
                continue
            row = rows[0]
            changed += 1
            if isinstance(d, Dead):
                self._end_lease(row, "dead")
                row.error = d.reason
            else:
                self._end_lease(row, "pending")
                row.error, row.available_at = d.failure.detail, d.at
                if d.burn:
                    row.burned += 1
                else:
                    row.attempts -= 1  # a failure that does not count gives the attempt back
            self.history.append((d.seq, relay_id, type(d).__name__))
        return changed

    def unpark_sweep(self) -> int:
        return 0

    def extend_leases(self, tokens: Sequence[uuid.UUID], lease_seconds: float) -> int:
        rows = [r for r in self.rows.values() if r.state == "in_flight" and r.token in tokens]
        for r in rows:
            r.lease_expires = self.now + dt.timedelta(seconds=lease_seconds)
        return len(rows)

    def reclaim_expired(self, *, relay_id: str = "", max_attempts: int = 10) -> int:
        rows = [
            r
            for r in self.rows.values()
            if r.state == "in_flight" and r.lease_expires is not None and r.lease_expires < self.now
        ]
        for r in rows:
            self._take_back(r)
        return len(rows)

    def has_ready(self, part: str) -> bool:
        return any(self._due(r) and r.claimed.exchange == part for r in self.rows.values())

    def heartbeat(self, relay_id: str) -> None:
        self.alive[relay_id] = self.now

    def forget_relay(self, relay_id: str) -> None:
        self.alive.pop(relay_id, None)
        self.runs.pop(relay_id, None)

    def register_relay(self, relay_id: str) -> dt.datetime:
        self._maybe_fail("register")
        # Each run named apart, as the database's clock would.
        started = max([self.now, *self.runs.values()]) + dt.timedelta(microseconds=1)
        self.runs[relay_id] = self.alive[relay_id] = started
        return started

    def beat(self, relay_id: str, started_at: dt.datetime) -> bool:
        self._maybe_fail("beat")
        if self.runs.get(relay_id) != started_at:
            return False
        self.alive[relay_id] = self.now
        return True

    def reclaim_owner(self, relay_id: str, *, max_attempts: int = 10) -> int:
        return 0

    def reclaim_strays(
        self, relay_id: str, held: Collection[tuple[uuid.UUID, int]], *, max_attempts: int = 10
    ) -> int:
        self._maybe_fail("reclaim_strays")
        # One relay per fake store: every lease is relay_id's.
        strays = [
            r for r in self.rows.values()
            if r.state == "in_flight" and (r.token, r.claimed.seq) not in held
        ]  # fmt: skip
        for row in strays:
            self._take_back(row)
        return len(strays)

    def reclaim_dead(
        self, *, relay_id: str, dead_after: float, max_attempts: int = 10
    ) -> tuple[list[str], int]:
        self._maybe_fail("reclaim_dead")
        return [], 0

    def relays(self, within_seconds: float) -> list[tuple[str, dt.datetime, dt.datetime]]:
        return [(r, t, t) for r, t in sorted(self.alive.items())]

    def resources(self) -> list[ResourceRow]:
        self._maybe_fail("resources")
        return [self.resource_rows[k] for k in sorted(self.resource_rows)]

    def change_resource(
        self, resource: str, change: Callable[[ResourceRow, dt.datetime], tuple[ResourceRow, T]]
    ) -> T:
        self._maybe_fail("change_resource")
        row = self.resource_rows.get(resource) or ResourceRow(Circuit(resource), Bucket())
        new, result = change(row, self.now)
        self.resource_rows[resource] = new
        return result

    def counts(self) -> StateCounts:
        by_state: dict[str, int] = {}
        for r in self.rows.values():
            by_state[r.state] = by_state.get(r.state, 0) + 1
        ready = sum(1 for r in self.rows.values() if self._due(r))
        return StateCounts(by_state, ready, by_state.get("pending", 0) - ready, None)

    def while_waiting(self, wait: FdWait) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def ping(self) -> None:
        pass

    def close(self) -> None:
        pass

    def states(self) -> dict[int, str]:
        return {seq: r.state for seq, r in self.rows.items()}


def _seq(row: Row) -> int:
    return row.claimed.seq


def _claim_order(row: Row) -> tuple[int, dt.datetime, int]:
    """Highest priority first, then the longest due, then enqueue order."""
    return (-row.claimed.priority, row.available_at, row.claimed.seq)


def _claimed_order(c: Claimed) -> tuple[int, dt.datetime, int]:
    return (-c.priority, c.available_at, c.seq)


def _as_chain(done: Done, chain: Hashable, broken: set[Hashable]) -> Done:
    """The real publisher's contract for a chain (ports.Publisher.publish): after the first
    outcome that is not CONFIRMED, the rest of the chain was never sent (held back), in this
    batch and in the chain's later ones (answered in the order they were handed over)."""

    def answer(outcomes: list[Outcome]) -> None:
        chained: list[Outcome] = []
        for o in outcomes:
            if chain in broken:
                o = Outcome(o.seq, Fate.NOT_SENT, "held back", held_back=True)
            elif o.fate is not Fate.CONFIRMED:
                broken.add(chain)
            chained.append(o)
        done(chained)

    return answer


@dataclass
class FakePublisher:
    """Settles each batch at once with `decide(item)`, or holds batches when `hold` is set."""

    decide: Callable[[Outgoing], Outcome] = lambda item: Outcome(item.seq, Fate.CONFIRMED)
    hold: bool = False
    ready: bool = True
    blocked: bool = False
    held: list[tuple[Sequence[Outgoing], Done]] = field(default_factory=list)
    chained: list[list[int]] = field(default_factory=list)  # the refs of each chain's batch
    chain_ids: list[Hashable] = field(default_factory=list)  # the chain of each of those
    broken_chains: set[Hashable] = field(default_factory=set)
    published: list[Outgoing] = field(default_factory=list)
    stopped: bool = False
    encode = staticmethod(to_outgoing)  # the real wire format: malformed rows fail as they would

    def start(self, timeout: float = 10.0) -> None:
        self.ready = True

    def wait(self, timeout: float) -> None:
        """Nothing to read: every answer was given in publish() or by a test's call."""

    def interrupt(self) -> None:
        pass

    def wait_fd(self, fileno: int, events: int) -> int:
        return events  # no database here has a socket to wait on

    def watch(self, fileno: int, ready: Callable[[], None]) -> None:
        pass  # waits return at once here: nothing to wake them

    def unwatch(self, fileno: int) -> None:
        pass

    def publish(
        self, items: Sequence[Outgoing], done: Done, *, chain: Hashable | None = None
    ) -> None:
        self.published.extend(items)
        if chain is not None:
            self.chained.append([i.seq for i in items])
            self.chain_ids.append(chain)
            done = _as_chain(done, chain, self.broken_chains)
        if self.hold:
            self.held.append((items, done))
        else:
            done([self.decide(i) for i in items])

    def answer_first(self) -> None:
        """Answer the batch held longest (a chain's pieces come back one after another)."""
        items, done = self.held.pop(0)
        done([self.decide(i) for i in items])

    def confirm_held(self) -> None:
        held, self.held = self.held, []
        for items, done in held:
            done([self.decide(i) for i in items])

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True
        held, self.held = self.held, []
        for items, done in held:
            done([Outcome(i.seq, Fate.UNCONFIRMED, "publisher stopped") for i in items])
