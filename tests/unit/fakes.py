"""Fakes at the port boundary of the relay loop: an in-memory store and a scripted publisher."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from relay.amqp.wire import to_outgoing
from relay.core.bucket import Bucket
from relay.core.circuit import Circuit
from relay.core.outcome import Fate, Outcome
from relay.core.policy import Dead, Retry
from relay.core.retention import RetentionPolicy
from relay.errors import DatabaseUnavailable
from relay.ports import Claimed, Done, Outgoing, ResourceRow, StateCounts, T

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclass
class Row:
    claimed: Claimed
    state: str = "pending"
    due: bool = True  # False after a release with a delay: not claimable in this test's time
    token: uuid.UUID | None = None
    error: str | None = None
    burned: int = 0  # failures that counted against max_attempts
    released: int = 0  # times given back unsent
    abandoned: int = 0  # times given up by a crashing relay


def make_claimed(seq: int, **overrides: object) -> Claimed:
    fields: dict[str, object] = {
        "seq": seq,
        "id": uuid.UUID(int=seq),
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


@dataclass
class FakeStore:
    rows: dict[int, Row] = field(default_factory=dict)
    fail_next: list[str] = field(default_factory=list)  # operation names that raise once
    history: list[tuple[int, str, str]] = field(default_factory=list)
    resource_rows: dict[str, ResourceRow] = field(default_factory=dict)
    now: dt.datetime = EPOCH  # the shared clock the resource transitions see
    alive: dict[str, dt.datetime] = field(default_factory=dict)
    runs: dict[str, dt.datetime] = field(default_factory=dict)  # relay id -> its run's start
    runs_asked: list[int] = field(default_factory=list)  # each claim's `run`
    runs_extended: list[int] = field(default_factory=list)  # each claim_run's `after`

    def add(self, *claimed: Claimed) -> None:
        for c in claimed:
            self.rows[c.seq] = Row(c)

    def purge_expired(self, policy: RetentionPolicy, now: dt.datetime) -> int:
        return 0

    def _maybe_fail(self, op: str) -> None:
        if op in self.fail_next:
            self.fail_next.remove(op)
            raise DatabaseUnavailable(f"{op}: database is down (fake)")

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
    ) -> list[Claimed]:
        self._maybe_fail("claim")
        self.runs_asked.append(run)
        ready = [
            r
            for r in self.rows.values()
            if r.state == "pending"
            and r.due
            and r.claimed.exchange not in exclude
            and (only is None or r.claimed.exchange == only)
            and self._in_key_order(r)
        ][:limit]
        if run > 0:  # as the store: a key's head and at most `run` behind it
            taken: dict[str, int] = {}
            kept = []
            for r in ready:
                key = r.claimed.key
                if key is not None:
                    taken[key] = taken.get(key, 0) + 1
                    if taken[key] > run + 1:
                        continue
                kept.append(r)
            ready = kept
        suspects = [r for r in ready if r.claimed.suspect]
        ready = suspects[:suspect_group] or ready  # suspects are claimed apart, as in the store
        for r in ready:
            r.state, r.token = "in_flight", token
        return [r.claimed for r in ready]

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
        key = self.rows[after].claimed.key if after in self.rows else None
        if key is None:
            return []
        line = sorted(
            (r for r in self.rows.values() if r.claimed.key == key),
            key=lambda r: r.claimed.seq,
        )
        if any(
            r.state in ("pending", "dead") or (r.state == "in_flight" and r.token != token)
            for r in line
            if r.claimed.seq <= after
        ):
            return []
        run: list[Row] = []
        for r in line:
            if r.claimed.seq <= after or r.state not in ("pending", "in_flight", "dead"):
                continue
            if len(run) == limit:
                break
            ok = r.state == "pending" and r.due and r.claimed.exchange not in exclude
            if not ok or r.claimed.suspect:
                break
            run.append(r)
        for r in run:
            r.state, r.token = "in_flight", token
        return [r.claimed for r in run]

    def _in_key_order(self, row: Row) -> bool:
        """Per-key order, as the store keeps it: nothing earlier of its key is in flight, or
        pending and not claimable now, nor dead (dead_key="hold"); the fake claims a key's whole
        line at once, an unlimited run."""
        key = row.claimed.key
        return key is None or not any(
            r.claimed.key == key
            and r.claimed.seq < row.claimed.seq
            and (r.state in ("in_flight", "dead") or (r.state == "pending" and not r.due))
            for r in self.rows.values()
        )

    def _guarded(self, token: uuid.UUID, seqs: Sequence[int]) -> list[Row]:
        return [
            self.rows[s]
            for s in seqs
            if self.rows[s].token == token and self.rows[s].state == "in_flight"
        ]

    def mark_published(self, token: uuid.UUID, seqs: Sequence[int]) -> int:
        self._maybe_fail("mark")
        rows = self._guarded(token, seqs)
        for r in rows:
            r.state, r.token = "published", None
        return len(rows)

    def release(
        self, token: uuid.UUID, seqs: Sequence[int], *, delay_seconds: float, error: str
    ) -> int:
        self._maybe_fail("release")
        rows = self._guarded(token, seqs)
        for r in rows:
            r.state, r.token, r.error = "pending", None, error
            r.due = delay_seconds <= 0
            r.released += 1
        return len(rows)

    def abandon(
        self, token: uuid.UUID, *, error: str, relay_id: str = "", max_attempts: int = 10
    ) -> int:
        self._maybe_fail("abandon")
        rows = [r for r in self.rows.values() if r.token == token and r.state == "in_flight"]
        for r in rows:
            r.state, r.token, r.error = "pending", None, error
            r.abandoned += 1
        return len(rows)

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
            row.token = None
            if isinstance(d, Dead):
                row.state, row.error = "dead", d.reason
            else:
                row.state, row.error, row.due = "pending", d.failure.detail, False
                row.burned += 1 if d.burn else 0
            self.history.append((d.seq, relay_id, type(d).__name__))
        return changed

    def unpark_sweep(self) -> int:
        return 0

    def extend_leases(self, tokens: Sequence[uuid.UUID], lease_seconds: float) -> int:
        return 0

    def reclaim_expired(self, *, relay_id: str = "", max_attempts: int = 10) -> int:
        return 0

    def has_ready(self, part: str) -> bool:
        return any(
            r.state == "pending" and r.due and r.claimed.exchange == part
            for r in self.rows.values()
        )

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
        return StateCounts(by_state, by_state.get("pending", 0), 0, None)

    def ping(self) -> None:
        pass

    def close(self) -> None:
        pass

    def states(self) -> dict[int, str]:
        return {seq: r.state for seq, r in self.rows.items()}


def _as_chain(done: Done, chain: Hashable, broken: set[Hashable]) -> Done:
    """The real publisher's contract for a chain (ports.Publisher.publish): after the first
    outcome that is not CONFIRMED, the rest of the chain was never sent (held back), in this
    batch and in the chain's later ones (answered in the order they were handed over)."""

    def answer(outcomes: list[Outcome]) -> None:
        chained: list[Outcome] = []
        for o in outcomes:
            if chain in broken:
                o = Outcome(o.ref, Fate.NOT_SENT, "held back", held_back=True)
            elif o.fate is not Fate.CONFIRMED:
                broken.add(chain)
            chained.append(o)
        done(chained)

    return answer


@dataclass
class FakePublisher:
    """Settles each batch at once with `decide(item)`, or holds batches when `hold` is set."""

    decide: Callable[[Outgoing], Outcome] = lambda item: Outcome(item.ref, Fate.CONFIRMED)
    hold: bool = False
    ready: bool = True
    blocked: bool = False
    alive: bool = True
    held: list[tuple[Sequence[Outgoing], Done]] = field(default_factory=list)
    chained: list[list[int]] = field(default_factory=list)  # the refs of each chain's batch
    chain_ids: list[Hashable] = field(default_factory=list)  # the chain of each of those
    broken_chains: set[Hashable] = field(default_factory=set)
    published: list[Outgoing] = field(default_factory=list)
    stopped: bool = False
    encode = staticmethod(to_outgoing)  # the real wire format: malformed rows fail as they would

    def start(self, timeout: float = 10.0) -> None:
        self.ready = True

    def publish(
        self, items: Sequence[Outgoing], done: Done, *, chain: Hashable | None = None
    ) -> None:
        self.published.extend(items)
        if chain is not None:
            self.chained.append([i.ref for i in items])
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
            done([Outcome(i.ref, Fate.UNCONFIRMED, "publisher stopped") for i in items])
