"""The relay loop: claim ready rows, hand them to the publisher, settle what the broker answered.

`run_once()` does one non-blocking pass and says what it did; `run()` only loops and waits, and
every wait ends early on a stop request. The work is its parts': the claimer (claims, probes, rate
tokens, the window), the settler (writes answers) and the upkeep (leases, retention). The words
are the glossary's (relay/__init__.py).

Threads. One thread does the work: it claims, hands rows over, does the broker's IO
(`Publisher.wait`, where the broker's answers arrive as calls to `done`) and settles them; nothing
it holds is shared. While a statement keeps it waiting for PostgreSQL, it does the broker's IO
too (`Store.while_waiting` -> `Publisher.wait_fd`, relay/store/overlap.py), so a hot key's chain
goes on meanwhile. Two threads only signal it, through `_inbox` and `Publisher.interrupt()`: the
heartbeat (relay/loop/pulse.py, which `run()` starts: "declared dead", "claim again") and, when
LISTEN is on, the listener (`wake`); `request_stop` comes from a signal handler the same way.
A relay serving several databases runs one such loop per database, each on its thread, and the
broker's IO on a thread of its own (relay/amqp/shared.py): the answers still reach each loop in
its own `Publisher.wait`, so nothing above changes for it.

One message's path, in the order it happens:

1. Claim. `Relay.run_once` -> `Claimer.claim` -> `Claimer._claim`: `Store.claim` leases ready
   rows to a fresh token, as many as `max_in_flight` leaves room for (suspects apart:
   relay/loop/suspects.py).
2. Hold. `Claimer._hold`: the rows become a `Lease` (relay/loop/leases.py), those sent side by
   side waiting in `unsent`, each hot key's run as a chain (`chains.split`).
3. Hand over. `Claimer.pump` -> `Claimer._publish`: while the window has room, a chunk of rows
   (`Chunk`, in `Lease.chunks`) is encoded (`Publisher.encode` -> relay/amqp/wire.py and
   frames.py) and handed to `Publisher.publish` with a `done` callback; a chain goes whole
   (`chains.hand_over`), its chunks one message at a time.
4. Send (relay/amqp/publisher.py): `Publisher._publish` -> `_send` writes the message's frames on
   its exchange's confirm channel, to the socket at once (relay/amqp/coalesce.py).
5. Answer. Later, in `Publisher.wait`: `_on_confirm` -> `_answer` records each message's
   `Outcome` (a chain's next message is sent from there, `confirms.Chains`); once the chunk is
   answered, `done` adds its `Answer` to `Relay._answered`. `Relay._settle` -> `Relay._take`:
   `Lease.answer` takes it once, `chains.answered` says what of it is to be written, and
   `Settler.add` queues it (a chunk the publisher holds too long is answered by
   `_give_up_overdue` instead).
6. Settle. `Settler.settle` (relay/loop/settler.py): decide (relay/core/settlement.py, past the
   circuits), mark the confirmed rows (`Store.mark_published`, one statement per lease), write
   the failures (`Store.settle_failures`), and the rows leave their lease.

Rows that never reach the publisher (the broker cannot take them, a stop, a chain that broke) are
released (`Relay._release` -> `Store.release`, `Lease.drop`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import queue
import random
import time
from collections.abc import Callable

from relay.core.outcome import HELD_BACK, Fate, Outcome
from relay.core.suspects import crashed as crash_reason
from relay.errors import DatabaseUnavailable
from relay.loop import chains, suspects
from relay.loop.circuits import ResourceGuard
from relay.loop.claimer import Claimer
from relay.loop.counts import Counts
from relay.loop.leases import Answer, Lease, Leases
from relay.loop.maintenance import Maintenance
from relay.loop.observer import Observer
from relay.loop.pulse import Pulse
from relay.loop.settings import LoopSettings
from relay.loop.settler import Settler
from relay.loop.sources import Source, SourceFailed
from relay.ports import Publisher, RetentionFailed, Store

log = logging.getLogger("relay")

# What other threads tell the loop (`_inbox`).
_STOP = object()
_WAKE = object()
_DECLARED_DEAD = object()  # another relay found this one's heartbeat stopped
_LOG = object()  # the log's stream has something to read (relay/capture/source.py)
# Why a row held with nothing to settle it was released (Relay._release_orphans).
ORPHANED = "held by the relay with nothing to settle it (a relay bug): released"
# `relay.progress` at INFO while the relay works: at once for the first message settled after a
# quiet spell, then at most once per this many seconds; a relay with nothing to do says nothing.
PROGRESS_EVERY = 60.0


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Relay:
    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        config: LoopSettings,
        *,
        guard: ResourceGuard,
        observer: Observer,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = utc_now,
        rng: random.Random | None = None,
        source: Source | None = None,
    ) -> None:
        self.store = store
        self.source = source  # the log, with --capture logical: a second source of messages
        self._watching: int | None = None  # the log's socket, while a wait ends on it
        self.failure: str | None = None  # why the relay stopped on its own (SourceFailed)
        self.publisher = publisher
        self.config = config
        self.guard = guard
        self.observer = observer
        self._clock = clock
        self._inbox: queue.SimpleQueue[object] = queue.SimpleQueue()  # from other threads
        self._answered: list[Answer] = []  # the publisher's answers, in `Publisher.wait`
        self._leases = Leases()
        self._stopping = False
        self.pulse = Pulse(
            store,
            config,
            clock=clock,
            declared_dead=lambda: self._signal(_DECLARED_DEAD),
            wake=self.wake,
        )
        self.claimer = Claimer(
            store,
            publisher,
            config,
            guard=guard,
            observer=observer,
            leases=self._leases,
            answered=self._answered.append,
            clock=clock,
            fresh=self.pulse.fresh,
        )
        self.settler = Settler(
            store,
            config,
            guard=guard,
            observer=observer,
            leases=self._leases,
            wall=wall,
            rng=rng or random.Random(),
        )
        self.maintenance = Maintenance(store, config, leases=self._leases, wall=wall)
        self.summary = Counts()  # the sum of every pass so far
        self._progress = Counts()  # since the last relay.progress line
        self._progress_from = clock()
        self._progress_logged = -PROGRESS_EVERY
        # When the loop last turned (for /healthz): one stuck in a call goes stale.
        self.heartbeat = clock()
        self._crashed = False  # run() is ending on an exception: release_all abandons
        self._database_error: str | None = None  # the last database failure (database_error)

    # ----------------------------------------------------------------- control

    def request_stop(self) -> None:
        """Ask the loop to drain and stop. Safe from any thread and a signal handler."""
        self._signal(_STOP)

    def wake(self) -> None:
        """A message was committed: claim now instead of at the next poll. From any thread."""
        self._signal(_WAKE)

    def _signal(self, event: object) -> None:
        self._inbox.put(event)
        self.publisher.interrupt()  # the loop may be waiting for the broker's IO

    def problem(self) -> str | None:
        """Why this relay cannot do its work, or None (for /healthz)."""
        return self.pulse.problem(self._clock())

    @property
    def database_error(self) -> str | None:
        """Why the database failed, while it has failed since the last claim that succeeded."""
        return self._database_error if self.claimer.db_attempt else None

    @property
    def in_flight(self) -> int:
        """Rows this relay holds under lease: claimed and not yet settled."""
        return self._leases.in_flight

    # ----------------------------------------------------------------- one pass

    def run_once(self) -> Counts:
        """One pass, never waiting: settle what the broker answered, look after the leases and
        retention when due, claim and publish what there is room for."""
        counts = Counts()
        now = self._clock()
        self._settle(counts, now)
        self.claimer.written(counts.published + counts.retried + counts.deferred + counts.dead, now)
        self._release_held_back(counts)
        publisher = self.publisher
        if self._leases.waiting and (not publisher.ready or publisher.blocked):
            # The broker cannot take them for now (no connection, or an alarm that may last):
            # give them back at once, as they were claimed, rather than hold them leased.
            counts.released += self._release_unsent("the broker could not take them")
        elif not self._stopping:
            try:
                self.claimer.extend_runs(counts, now)  # before the chains that end run dry
            except DatabaseUnavailable as exc:
                self._db_failed("claim", exc)
            self.claimer.pump(now)  # what was just written made room in the window
        self._give_up_overdue(now)
        upkeep = self.maintenance
        if now >= upkeep.next_upkeep:
            counts.released += self._release_orphans()
            try:
                upkeep.upkeep(counts, now)
            except DatabaseUnavailable as exc:
                self._db_failed("lease maintenance", exc)
        retention = None if self._stopping else upkeep.retention_due(now)
        if retention is not None:
            try:
                upkeep.purge(retention, now)
            except DatabaseUnavailable as exc:
                self._db_failed("retention", exc)
            except RetentionFailed as exc:
                # Housekeeping: the relay goes on; the pass is tried again after its interval.
                log.error("relay.retention_failed", extra={"error": str(exc)})
        if not self._stopping:
            try:
                if upkeep.reclaim_strays(counts, now):  # after a database failure, at once
                    self.claimer.claim_soon()
                self.claimer.claim(counts, now)
            except DatabaseUnavailable as exc:
                self._db_failed("claim", exc)
        if self.source is not None:
            self._read_log(self.source, counts, now)
        self.summary.add(counts)
        self._log_progress(counts, now)
        return counts

    def _read_log(self, source: Source, counts: Counts, now: float) -> None:
        """Take what the log has into its lease, as much as there is room for; write what waits
        for the table; move the slot past what is resolved."""
        publisher = self.publisher
        room = 0
        if not self._stopping and publisher.ready and not publisher.blocked:
            room = self.config.max_in_flight - self._leases.in_flight
            excluded = set(self.guard.exclude())  # the claims' view, refreshed by them
            naming = self.guard.naming

            def passed_by(exchange: str, routing_key: str) -> bool:
                return naming.part(exchange, routing_key) in excluded

            try:
                taken, more = source.intake(self._leases, room, passed_by if excluded else None)
            except SourceFailed as exc:
                # Drain what is held and stop: going on would skip what the source lost.
                log.error("relay.source_failed", extra={"error": str(exc)})
                self.failure = str(exc)
                self._handle(_STOP)
                taken, more, room = 0, False, 0
            if taken:
                counts.claimed += taken
                self.observer.claimed(taken)
                self.claimer.pump(now)
            if more:
                counts.full_batch = True  # the stream may hold more than its socket says
        source.flush()
        source.advance()
        # Woken by the log only while there is room to take what it has: else its socket
        # would end every wait at once.
        fileno = source.fileno() if room > 0 else None
        if fileno != self._watching:
            if self._watching is not None:
                publisher.unwatch(self._watching)
            if fileno is not None:
                publisher.watch(fileno, lambda: self._inbox.put(_LOG))
            self._watching = fileno

    def _log_progress(self, counts: Counts, now: float) -> None:
        progress = self._progress
        progress.add(counts)
        settled = progress.published + progress.retried + progress.deferred + progress.dead
        if not settled or now - self._progress_logged < PROGRESS_EVERY:
            return
        log.info(
            "relay.progress",
            extra={
                "published": progress.published,
                "retried": progress.retried,
                "deferred": progress.deferred,
                "dead": progress.dead,
                "in_flight": self.in_flight,
                "seconds": round(now - self._progress_from, 1),
            },
        )
        self._progress = Counts()
        self._progress_from = self._progress_logged = now

    def _settle(self, counts: Counts, now: float | None = None) -> None:
        """Take what the broker and the other threads said, then write every answered chunk;
        in a turn (`now` given), not while the database rests after a failure (the answers
        wait for its pause to run out, as the claims do)."""
        if not self._crashed:  # after a crash, no more IO: the publisher may be why
            self.publisher.wait(0)  # the broker's answers that have arrived, without waiting
        self._take_signals()
        answered = self._answered[:]  # the claimer appends to this very list
        self._answered.clear()
        for answer in answered:
            self._take(answer)
        if now is not None and self.claimer.resting(now):
            return
        try:
            if self.settler.settle(counts):
                # Settling can make new rows claimable (the next message of each key whose
                # head was just published), so claim again now rather than at the next poll.
                self.claimer.claim_soon()
        except DatabaseUnavailable as exc:
            self._db_failed("settle", exc)

    def _take(self, answer: Answer) -> None:
        lease = self._leases.get(answer.token)
        chunk = None if lease is None else lease.answer(answer.chunk)
        if lease is not None and chunk is not None:
            self.settler.add(chains.answered(lease, chunk, answer, self._clock()))
        # else: given up as overdue, or released, before the publisher answered: the answer
        # changes nothing.

    def _take_signals(self) -> None:
        while True:
            try:
                event = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(event)

    def _handle(self, event: object) -> None:
        if event is _STOP:
            if not self._stopping:
                log.info("relay.stopping", extra={"in_flight": self.in_flight})
            self._stopping = True
        elif event is _WAKE:
            self.claimer.notified()
        elif event is _DECLARED_DEAD:
            self._release_everything()

    def _give_up_overdue(self, now: float) -> None:
        """Settle as unconfirmed every chunk the publisher has held past max_batch_life.

        A chunk is normally answered within the confirm timeout; one that is not (a bug that
        lost its answer, a message queued on a channel that never opened) would otherwise keep its
        rows leased for ever, its lease extended at every upkeep. Not the messages' fault, so
        no attempt is charged; the publisher's late answer, if any, is ignored."""
        life = self.config.max_batch_life
        for lease in list(self._leases.values()):
            for number, chunk in chains.overdue_chunks(lease, now, life):
                lease.answer(number)
                why = f"no outcome from the publisher within {life:g} s"
                outcomes = [
                    Outcome(seq, Fate.UNCONFIRMED, why, connection_lost=True)
                    for seq in chunk.seqs
                    if seq in lease.rows
                ]
                log.error("relay.batch_overdue", extra={"messages": len(outcomes), "error": why})
                answer = Answer(lease.token, outcomes, number)
                self.settler.add(chains.answered(lease, chunk, answer, now))

    def _release_orphans(self) -> int:
        """Release rows a lease holds that nothing would ever settle: not waiting to be sent,
        not in a chunk the publisher has or is being written, not to be released. Only a bug
        makes one, but it would hold its lease, extended at every upkeep, and its key behind it
        for ever; so it is said loudly, and the row goes back (published again at worst, never
        lost)."""
        released = 0
        for lease in list(self._leases.values()):
            accounted = set(lease.unsent_seqs())
            for chunk in lease.chunks.values():
                accounted.update(chunk.seqs)
            orphans = [seq for seq in lease.rows if seq not in accounted]
            if orphans:
                ids = ",".join(lease.rows[seq].id for seq in orphans[:10])  # to look up
                log.error("relay.orphaned_rows", extra={"messages": len(orphans), "ids": ids})
                released += self._release(lease, orphans, ORPHANED)
        return released

    def _release_everything(self) -> None:
        """Another relay found this one's heartbeat stopped and took its leases (every one it
        could). Stop using them all: release what is still ours to give (the lease token
        guards the rest), forget them whatever the database says, then rejoin."""
        why = (
            f"relay {self.config.relay_id} was declared dead: its heartbeat stopped for "
            f"{self.config.dead_after:g} s"
        )
        log.warning("relay.declared_dead", extra={"in_flight": self.in_flight, "error": why})
        self.release_all(why, forget=True)
        self.pulse.rejoin()

    def _db_failed(self, what: str, exc: Exception) -> None:
        self.maintenance.database_failed()  # a claim may have been made unheard of
        wait = self.claimer.back_off()
        self._database_error = str(exc)
        extra = {"during": what, "error": str(exc), "attempt": self.claimer.db_attempt,
                 "retry_in": round(wait, 3)}  # fmt: skip
        log.error("relay.db_error", extra=extra)

    # ----------------------------------------------------------------- loop

    def run(self) -> Counts:
        """Relay until `request_stop()`; then drain in-flight confirms and return the summary."""
        log.info("relay.started", extra={"relay_id": self.config.relay_id})
        self.pulse.start()
        try:
            # While a statement runs, this thread reads the broker's answers and sends chains on.
            with self.store.while_waiting(self.publisher.wait_fd):
                while not self._stopping:
                    self.heartbeat = self._clock()
                    if self.run_once().full_batch:
                        continue  # backlog: claim the next batch at once
                    self._wait(self._wait_time())
                self._drain()
        except Exception:
            self._crashed = True  # one of the rows in flight may be why (release_all)
            raise
        finally:
            self.pulse.stop()
            if self.source is not None:
                self.source.close()  # the slot moves past what was resolved, and is let go
        with contextlib.suppress(DatabaseUnavailable):  # if so, its heartbeat just ages out
            self.store.forget_relay(self.config.relay_id)
        summary = self.summary
        log.info(
            "relay.stopped",
            extra={
                "published": summary.published,
                "retried": summary.retried,
                "deferred": summary.deferred,
                "dead": summary.dead,
                "released": summary.released,
                "drained": summary.drained,
            },
        )
        return summary

    def _wait_time(self) -> float:
        now = self._clock()
        until = min(self.claimer.next_turn(now), self.maintenance.next_upkeep)
        return max(0.0, min(until - now, self.config.poll_interval))

    def _wait(self, timeout: float) -> None:
        """Do the broker's IO for up to `timeout`: a chunk's answer, a wake-up or a stop ends
        it. Other IO (a confirm of part of a chunk, a chain's next send) needs no turn."""
        deadline = time.monotonic() + timeout
        while True:
            self.publisher.wait(max(0.0, deadline - time.monotonic()))
            if self._answered or not self._inbox.empty() or time.monotonic() >= deadline:
                break
        self._take_signals()

    def _drain(self) -> None:
        """Release what was never sent, wait for the confirms of what was (bounded), settle
        them, release anything left."""
        deadline = self._clock() + self.config.drain_timeout
        counts = Counts()
        counts.released += self._release_unsent("relay stopped before it sent them")
        while self._leases and self._clock() < deadline:
            self._settle(counts)
            if self._leases:
                self._wait(min(0.05, max(0.0, deadline - self._clock())))
        self.publisher.stop(5.0)
        self._settle(counts)  # outcomes the publisher reported while stopping
        self.summary.add(counts)
        if self._leases:
            self.summary.drained = False
            self.release_all("relay stopped before the broker confirmed")
        if self.source is not None:
            self.source.flush()

    def _release_unsent(self, why: str) -> int:
        """Release the rows claimed and never handed to the publisher (no attempt charged)."""
        released = 0
        for lease in list(self._leases.values()):
            seqs = lease.unsent_seqs()
            if seqs:
                released += self._release(lease, seqs, why)
        return released

    def _release_held_back(self, counts: Counts) -> None:
        """Release the rest of every chain that broke: unsent, behind the message that failed
        (no attempt charged). Kept for the next pass if the database fails."""
        for lease in list(self._leases.values()):
            if lease.to_release:
                counts.released += self._release(lease, list(lease.to_release), HELD_BACK)

    def _release(self, lease: Lease, seqs: list[int], why: str) -> int:
        """Release these unsent rows of `lease`, and forget them; 0 if the database fails."""
        try:
            holder = lease.holder or self.store
            released = holder.release(lease.token, seqs, delay_seconds=0.0, error=why)
        except DatabaseUnavailable as exc:
            log.error("relay.release_failed", extra={"error": str(exc)})
            return 0
        for span in lease.drop(seqs):
            self.observer.end_released(span, why)
        if not lease.rows:
            del self._leases[lease.token]
        return released

    def release_all(self, why: str, *, forget: bool = False) -> int:
        """Release every row this relay still holds (shutdown): others may take them at once.

        Rows released unsent cost no attempt. After a crash, the leases whose rows were sent
        are given up as their running out would (suspects.abandon). With `forget`, a lease the
        database could not take back is forgotten all the same (it expires, or was taken over
        already)."""
        counts = Counts()
        self._settle(counts)  # settle whatever did finish first
        counts.released += self._release_unsent(why)
        config = self.config
        for token, lease in list(self._leases.items()):
            holder = lease.holder or self.store
            try:
                if suspects.abandon(lease, crashed=self._crashed):
                    counts.released += holder.abandon(
                        token,
                        error=crash_reason(config.relay_id, why),
                        relay_id=config.relay_id,
                        max_attempts=config.policy.max_attempts,
                    )
                else:
                    counts.released += holder.release(
                        token, list(lease.rows), delay_seconds=0.0, error=why
                    )
            except DatabaseUnavailable as exc:
                log.error("relay.release_failed", extra={"error": str(exc)})
                if not forget:
                    continue
            for span in lease.spans.values():
                self.observer.end_released(span, why)
            del self._leases[token]
        self.summary.add(counts)
        return counts.released
