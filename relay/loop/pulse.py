"""The relay's heartbeat, and the other relays': who is alive decides whose leases are taken back
early (relay/store/sql/common.sql, beat).

A thread of its own beats every `heartbeat_interval` seconds, whatever the loop is doing (a long
claim or settlement does not stop it), and after each beat takes back the leases of every relay
whose heartbeat is older than `dead_after`, at once rather than when their leases run out. A
killed relay's rows are published again within seconds, the lease stays long for the relays
that are only slow to settle.

Safety. Another relay can declare this one dead only `dead_after` seconds after its last beat
reached the database, and that beat was sent after the clock time it started at. So while less
than half of `dead_after` has passed since the last beat that succeeded started, nothing this
relay holds can have been taken: only then does it claim and hand rows to the publisher (`fresh`).
A relay that was only slow (a pause, a stalled database) finds at its next beat that its row is
gone: it releases whatever it still holds (the loop, on `declared_dead`), then registers anew
and goes on. Its lease-guarded writes would have changed nothing taken over anyway.

A database outage that every relay sees would make each of them look dead to whichever beats
first when it ends. So a relay that failed to beat itself judges the others again only after
`dead_after` of its own beats have gone through since: long enough for every live relay to beat.

Defaults: a beat every 0.5 s, dead after 3 s (six beats missed). A garbage-collection pause (tens
of milliseconds) or a slow statement of a second or two does not reach that; a relay killed
mid-drain has its rows taken over within 3-3.5 s.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import threading
from collections.abc import Callable

from relay.errors import DatabaseUnavailable
from relay.loop.settings import LoopSettings
from relay.ports import Store

log = logging.getLogger("relay")


class Pulse:
    def __init__(
        self,
        store: Store,
        config: LoopSettings,
        *,
        clock: Callable[[], float],
        declared_dead: Callable[[], None],  # called on the pulse's thread
        wake: Callable[[], None],  # rows came back, or claims may go on again
    ) -> None:
        self._store = store
        self._config = config
        self._clock = clock
        self._declared_dead = declared_dead
        self._wake = wake
        self._started_at: dt.datetime | None = None  # this run's row, once registered
        self._last_ok: float | None = None  # clock time the last good beat began
        self._first = True  # the first registration takes back what an earlier run left
        self._dead = False  # declared dead: no beat until the loop has given everything back
        self._doubt = False  # declared dead since the last good beat
        self._judge_from: float | None = None  # no relay is taken for dead before this time
        self._failing = False  # the last turn failed (said once)
        self._error: str | None = None  # why, when the last turn failed other than by an outage
        self._running = False
        self._stop = threading.Event()
        self._nudge = threading.Event()  # beat now rather than at the end of the interval
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- the loop's side

    def start(self) -> None:
        """Register (before anything is claimed), then beat on a thread until `stop`."""
        self._running = True
        self._stop.clear()
        self._nudge.clear()
        self.beat_once()
        self._thread = threading.Thread(
            # in the context it was made in: its log lines name the same database
            target=contextvars.copy_context().run,
            args=(self._run,),
            name="relay-heartbeat",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._nudge.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        self._running = False

    def fresh(self, now: float) -> bool:
        """Whether this relay may claim and send: no one can have taken its leases yet. Always
        while the pulse is not running (a loop driven pass by pass, in tests)."""
        if not self._running:
            return True
        last = self._last_ok
        return last is not None and now - last < self._config.dead_after / 2

    def problem(self, now: float) -> str | None:
        """Why this relay cannot work (for /healthz): its heartbeat has failed for longer than
        it takes others to declare it dead."""
        last, error = self._last_ok, self._error
        if not self._running or not self._failing or error is None:
            return None
        if last is not None and now - last < self._config.dead_after:
            return None
        return f"the heartbeat has failed for over {self._config.dead_after:g} s: {error}"

    def rejoin(self) -> None:
        """The loop gave back what it held after being declared dead: register anew."""
        self._dead = False
        self._nudge.set()

    # ----------------------------------------------------------------- one turn

    def beat_once(self) -> None:
        """Register or beat, then take back the leases of dead relays."""
        if self._dead:
            return
        config, store = self._config, self._store
        began = self._clock()
        try:
            if self._started_at is None:
                if self._first:
                    self._take_back_earlier_run()
                self._started_at = store.register_relay(config.relay_id)
            elif not store.beat(config.relay_id, self._started_at):
                self._started_at, self._last_ok, self._dead = None, None, True
                self._doubt = True
                self._declared_dead()
                return
            self._beat_ok(began)
            relays: list[str] = []
            rows = 0
            if self._judge_from is None or began >= self._judge_from:
                relays, rows = store.reclaim_dead(
                    relay_id=config.relay_id,
                    dead_after=config.dead_after,
                    max_attempts=config.policy.max_attempts,
                )
        except Exception as exc:
            # An outage is waited out (so is anything else), but an error that is not one (a
            # bug, a privilege taken away) also fails /healthz once it has stopped the relay's
            # claims for long (problem()).
            outage = isinstance(exc, DatabaseUnavailable)
            why = str(exc) if outage else f"{type(exc).__name__}: {exc}"
            if not self._failing:
                log.error("relay.heartbeat_failed", extra={"error": why})
            self._failing = True
            self._error = None if outage else why
            return
        if self._failing:
            log.info("relay.heartbeat_recovered", extra={"relay_id": config.relay_id})
            self._failing, self._error = False, None
        if relays:
            extra = {"relays": ",".join(relays), "count": rows, "dead_after": config.dead_after}
            log.warning("relay.dead_relays_reclaimed", extra=extra)
        if rows:
            self._wake()

    def _take_back_earlier_run(self) -> None:
        """Rows still leased to this relay id were left by an earlier run of it (a restart in
        place keeps the id): this run holds none yet, so they are taken back now."""
        config = self._config
        taken = self._store.reclaim_owner(config.relay_id, max_attempts=config.policy.max_attempts)
        self._first = False
        if taken:
            log.warning(
                "relay.earlier_run_reclaimed", extra={"relay_id": config.relay_id, "count": taken}
            )

    def _beat_ok(self, began: float) -> None:
        if self._failing or self._doubt:
            # This relay could not beat for a while itself (the database was out, or it was
            # too slow): so could the others, for all it knows. It judges them again only once
            # it has seen `dead_after` of heartbeats go through, in which every live relay
            # beats too; until then a shared outage would look like everyone else dying.
            self._judge_from = began + self._config.dead_after
            self._doubt = False
        was_fresh = self.fresh(began)
        self._last_ok = began
        if not was_fresh:
            self._wake()  # claims and sends were held back: go on

    # ----------------------------------------------------------------- the thread

    def _run(self) -> None:
        while True:
            self._nudge.wait(self._config.heartbeat_interval)
            self._nudge.clear()
            if self._stop.is_set():
                return
            self.beat_once()
