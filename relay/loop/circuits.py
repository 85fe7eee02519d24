"""The relay's side of the shared circuits and rate limits.

It keeps a view of the resource table (re-read every `circuit_refresh` seconds, and updated at
once by this relay's own changes), tells the claim which resources to pass by, wins probes,
draws rate-limit tokens and records publish results. Every change goes through the store's
locked read-modify-write with a pure transition, so relays agree whatever their timing.
Each transition is logged once, by the relay that made it.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Callable, Mapping, Sequence

from relay.core import bucket, circuit
from relay.core.circuit import Circuit, CircuitState, Transition
from relay.core.resources import Naming, broker_id
from relay.loop.settings import LoopSettings
from relay.ports import ResourceRow, Store

log = logging.getLogger("relay")

IDLE_TOKEN_WAIT = 0.25  # seconds before drawing tokens again for a resource with nothing waiting

_EVENTS = {
    CircuitState.OPEN: "circuit.opened",
    CircuitState.HALF_OPEN: "circuit.half_open",
    CircuitState.CLOSED: "circuit.closed",
}
REOPENED = "circuit.reopened"  # half-open, and the probe failed
EVENTS = (*_EVENTS.values(), REOPENED)  # every event log_transition logs


def log_transition(t: Transition) -> None:
    event = _EVENTS[t.after]
    if t.before is CircuitState.HALF_OPEN and t.after is CircuitState.OPEN:
        event = REOPENED
    level = logging.WARNING if t.after is CircuitState.OPEN else logging.INFO
    extra: dict[str, object] = {"resource": t.resource, "reason": t.reason}
    if t.until is not None:
        extra["until"] = t.until.isoformat(timespec="seconds")
    log.log(level, event, extra=extra)


class ResourceGuard:
    def __init__(
        self,
        store: Store,
        config: LoopSettings,
        *,
        clock: Callable[[], float],
        wall: Callable[[], dt.datetime],
        rng: random.Random,
        on_transition: Callable[[Transition], None] = lambda _t: None,  # e.g. a metric
    ) -> None:
        self._store = store
        self._settings = config.circuit
        self._owner = config.relay_id
        self._refresh_every = config.circuit_refresh
        self._rates = dict(config.rate_limits)
        self.naming = Naming(broker_id(config.amqp_url), config.circuit_scope)
        self._clock = clock
        self._wall = wall
        self._rng = rng
        self._view: dict[str, Circuit] = {}  # part -> circuit, this broker and scope only
        self._next_refresh = 0.0
        self._tokens_due: dict[str, float] = dict.fromkeys(self._rates, 0.0)
        self._on_transition = on_transition

    # ----------------------------------------------------------------- view

    def refresh(self, force: bool = False) -> None:
        """Re-read the shared table when due. May raise DatabaseUnavailable."""
        now = self._clock()
        if not force and now < self._next_refresh:
            return
        rows = self._store.resources()
        self._next_refresh = now + self._refresh_every
        view: dict[str, Circuit] = {}
        for row in rows:
            part = self.naming.part_of(row.circuit.resource)
            if part is not None:
                view[part] = row.circuit
        self._view = view

    def circuit(self, part: str) -> Circuit:
        return self._view.get(part) or Circuit(self.naming.name(part))

    def states(self) -> dict[str, CircuitState]:
        """Every known circuit of this broker and scope, by full resource name (for metrics)."""
        return {c.resource: c.state for c in list(self._view.values())}

    def exclude(self) -> list[str]:
        """Parts the main claim passes by: open circuits, and rate-limited parts (claimed on
        their own, as their tokens allow)."""
        blocked = {part for part, c in self._view.items() if c.blocks}
        return sorted(blocked | set(self._rates))

    def probes_due(self) -> list[str]:
        now = self._wall()
        return [part for part, c in self._view.items() if c.probe_due(now)]

    # ----------------------------------------------------------------- changes

    def _change(
        self, part: str, fn: Callable[[Circuit, dt.datetime], tuple[Circuit, list[Transition]]]
    ) -> list[Transition]:
        """Apply `fn` to the part's circuit under the row lock; adopt and log the result."""
        written: list[Circuit] = []

        def change(row: ResourceRow, now: dt.datetime) -> tuple[ResourceRow, list[Transition]]:
            new, changes = fn(row.circuit, now)
            written[:] = [new]
            return ResourceRow(new, row.bucket), changes

        changes = self._store.change_resource(self.naming.name(part), change)
        self._view[part] = written[0]  # act on it now, before the next refresh
        for t in changes:
            log_transition(t)
            self._on_transition(t)
        return changes

    def try_probe(self, part: str) -> bool:
        """Take the probe for `part` if this relay is first; True when it did."""

        def fn(c: Circuit, now: dt.datetime) -> tuple[Circuit, list[Transition]]:
            new, t = circuit.begin_probe(c, now, self._owner, self._settings)
            return new, [t] if t else []

        return bool(self._change(part, fn))

    def probe_found_nothing(self, part: str) -> None:
        def fn(c: Circuit, now: dt.datetime) -> tuple[Circuit, list[Transition]]:
            new, t = circuit.nothing_to_probe(c, now, self._owner)
            return new, [t] if t else []

        self._change(part, fn)

    def record(
        self,
        results: Mapping[str, Sequence[str | None]],
        burns: dict[str, list[bool]] | None = None,
    ) -> dict[str, list[bool]]:
        """Record publish results per part (None: confirmed; text: a resource failure).

        Returns, per part, whether each failure burns an attempt. Parts whose circuit is
        closed with nothing counted and that only succeeded are not written at all: the
        common case costs no database round trip. `burns` collects the answers as each part
        is written: a part already in it is skipped, so a call that failed half way (the
        database) can be repeated without counting the earlier parts twice.
        """
        burns = {} if burns is None else burns
        for part, outcomes in results.items():
            if part in burns:
                continue  # counted by an earlier call for the same batch
            failed = any(r is not None for r in outcomes)
            if not failed and self.circuit(part).pristine:
                burns[part] = []
                continue
            part_burns: list[bool] = []

            def fn(
                c: Circuit,
                now: dt.datetime,
                outcomes: Sequence[str | None] = outcomes,
                part_burns: list[bool] = part_burns,
            ) -> tuple[Circuit, list[Transition]]:
                new, b, changes = circuit.record(c, outcomes, now, self._settings, self._rng)
                part_burns[:] = b
                return new, changes

            self._change(part, fn)
            burns[part] = part_burns
        return burns

    # ----------------------------------------------------------------- rate limits

    def rate_parts_due(self) -> list[str]:
        now = self._clock()
        return [
            part
            for part, due in self._tokens_due.items()
            if due <= now and not self.circuit(part).blocks
        ]

    def next_token_due(self) -> float | None:
        """When the loop should next draw tokens (None: no rate-limited resource is open)."""
        return min(
            (due for part, due in self._tokens_due.items() if not self.circuit(part).blocks),
            default=None,
        )

    def take_tokens(self, part: str, want: int) -> int:
        rate = self._rates[part]
        burst = max(1.0, rate)
        got: list[tuple[int, float]] = []

        def change(row: ResourceRow, now: dt.datetime) -> tuple[ResourceRow, None]:
            b, granted = bucket.take(row.bucket, now, rate=rate, burst=burst, want=want)
            got.append((granted, bucket.wait_for(b, rate=rate)))
            return ResourceRow(row.circuit, b), None

        self._store.change_resource(self.naming.name(part), change)
        granted, wait = got[0]
        # Come back when the next token is there (not sooner: that would only poll the row).
        self._tokens_due[part] = self._clock() + (wait if granted < want else 0.0)
        return granted

    def refund(self, part: str, n: int) -> None:
        if n <= 0:
            return
        burst = max(1.0, self._rates[part])

        def change(row: ResourceRow, _now: dt.datetime) -> tuple[ResourceRow, None]:
            return ResourceRow(row.circuit, bucket.refund(row.bucket, n, burst=burst)), None

        self._store.change_resource(self.naming.name(part), change)
        # Fewer messages were waiting than the tokens allowed: drawing again at once would only
        # poll the row, so look again shortly (a rate-limited destination is not latency-bound).
        self._tokens_due[part] = self._clock() + IDLE_TOKEN_WAIT
