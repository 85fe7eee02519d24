"""The console's actions on messages: replay, discard, cancel, reschedule, priority, each on one
message, a selection of ids, or every message a filter matches; each with a dry run and a summary
in words of what will (or did) change.

The changes are the store's (relay/store/admin.py): each UPDATE names the states it may leave, so
an action racing a relay either wins or changes nothing (reschedule, priority and cancel touch
only pending rows, which no relay holds), and each change is recorded in the message's attempt
history with who made it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine

from outbox.states import State
from relay.console.filters import BadRequest, describe, kept, message_filter, only
from relay.core.durations import parse_duration, parse_moment
from relay.runtime.message_filter import FILTERS
from relay.store import admin

MAX_SELECTION = 1000  # ids in one request
BATCH = 500  # ids per statement when a whole group changes


@dataclass(frozen=True, slots=True)
class Action:
    name: str  # as in the URL
    verb: str  # "Replay"
    past: str  # "replayed"
    states: tuple[str, ...]  # the states it changes
    allowed: str  # which messages it may change, in words


UNCLAIMED_WORDS = "pending messages (not yet claimed by a relay)"
ACTIONS: Mapping[str, Action] = {
    a.name: a
    for a in (
        Action(
            "replay",
            "Replay",
            "replayed",
            admin.REPLAYABLE,
            "dead, discarded or cancelled messages",
        ),
        Action("discard", "Discard", "discarded", (State.DEAD.value,), "dead messages"),
        Action("cancel", "Cancel", "cancelled", admin.UNCLAIMED, UNCLAIMED_WORDS),
        Action("reschedule", "Reschedule", "rescheduled", admin.UNCLAIMED, UNCLAIMED_WORDS),
        Action("priority", "Reprioritize", "reprioritized", admin.UNCLAIMED, UNCLAIMED_WORDS),
    )
}


@dataclass(frozen=True, slots=True)
class Order:
    """An action with its values, as a request asked for it."""

    action: Action
    at: dt.datetime | None = None  # reschedule
    priority: int | None = None  # priority
    dry_run: bool = False

    def sentence(self, count: str, *, done: bool = False) -> str:
        """'Reschedule 3 messages to YYYY-MM-DD HH:MM:SS UTC' (or 'Rescheduled ...')."""
        head = self.action.past.capitalize() if done else self.action.verb
        if self.at is not None:
            return f"{head} {count} to {self.at:%Y-%m-%d %H:%M:%S} UTC"
        if self.priority is not None:
            return f"{head} {count} to priority {self.priority}"
        return f"{head} {count}"

    def apply(
        self, engine: Engine, ids: Sequence[uuid.UUID], now: dt.datetime, by: str
    ) -> set[uuid.UUID]:
        """Make the change; the ids that changed."""
        name, ids = self.action.name, list(ids)
        if name == "cancel":
            states = admin.cancel(engine, ids, now=now, by=by)
            return {i for i, s in states.items() if s == State.CANCELLED.value}
        if name == "reschedule":
            assert self.at is not None
            return set(admin.reschedule(engine, ids, at=self.at, now=now, by=by))
        if name == "priority":
            assert self.priority is not None
            return set(admin.prioritize(engine, ids, priority=self.priority, now=now, by=by))
        change: Callable[..., list[uuid.UUID]] = admin.replay if name == "replay" else admin.discard
        return set(change(engine, ids, now=now, by=by))


def order(name: str, body: Mapping[str, Any], now: dt.datetime, *, target: Sequence[str]) -> Order:
    """The order a request's JSON body makes of action `name`; `target` names the body's keys
    that choose the messages (ids, filter), which the caller reads."""
    action = ACTIONS.get(name)
    if action is None:
        raise BadRequest(f"no action {name!r} (actions: {', '.join(ACTIONS)})")
    values = {"reschedule": ("at", "in"), "priority": ("priority",)}.get(name, ())
    only(body, ("dry_run", *values, *target))
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise BadRequest("dry_run must be true or false")
    if name == "reschedule":
        return Order(action, at=_due(body, now), dry_run=dry_run)
    if name == "priority":
        return Order(action, priority=_priority(body.get("priority")), dry_run=dry_run)
    return Order(action, dry_run=dry_run)


def _due(body: Mapping[str, Any], now: dt.datetime) -> dt.datetime:
    at, due_in = body.get("at"), body.get("in")
    if (at is None) == (due_in is None):
        raise BadRequest("reschedule needs one of at (an ISO time) or in (a duration: 10m, 2h)")
    raw = at if at is not None else due_in
    if not isinstance(raw, str):
        raise BadRequest(f"{'at' if at is not None else 'in'} must be text, not {raw!r}")
    if due_in is not None:
        try:
            return now + dt.timedelta(seconds=parse_duration(raw))
        except ValueError as exc:
            raise BadRequest(f"in: {exc}") from None
    try:
        parse_duration(raw)
    except ValueError:
        pass
    else:
        raise BadRequest(f"at: {raw!r} is a duration: for a time from now, use in")
    try:
        return parse_moment(raw, now)
    except ValueError as exc:
        raise BadRequest(f"at: {exc}") from None


def _priority(raw: Any) -> int:
    if isinstance(raw, str):
        # A form's number field arrives as text: ASCII digits only (int() would take "٣", and
        # raise for "²" or 5,000 digits).
        text = raw.strip()
        digits = text[1:] if text.startswith("-") else text
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 10):
            raise BadRequest(f"priority: {raw[:20]!r} is not an integer")
        raw = int(text)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise BadRequest(f"priority must be an integer, not {raw!r}")
    if raw not in admin.PRIORITIES:
        low, high = admin.PRIORITIES[0], admin.PRIORITIES[-1]
        raise BadRequest(f"priority {raw} is out of range ({low} to {high})")
    return raw


def ids_of(raw: Any) -> list[uuid.UUID]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("ids must be a list of message ids")
    if len(raw) > MAX_SELECTION:
        raise BadRequest(f"at most {MAX_SELECTION} ids at once; act on a filter for more")
    try:
        return list(dict.fromkeys(uuid.UUID(str(i)) for i in raw))
    except ValueError:
        raise BadRequest("ids must be message ids (UUIDs)") from None


def _unchanged(states: Mapping[uuid.UUID, str], ids: Sequence[uuid.UUID]) -> dict[str, str]:
    return {str(i): states.get(i, "not found") for i in ids}


def _tally(states: Mapping[str, str]) -> str:
    counts = Counter(states.values())
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


# --------------------------------------------------------------------------- one message


def run_one(
    engine: Engine, o: Order, message_id: uuid.UUID, now: dt.datetime, by: str
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of an order on one message: 404 if there is none, 409 when it is not
    in a state the action changes (a relay claimed it first: too late)."""
    a = o.action
    state = admin.states_of(engine, [message_id]).get(message_id)
    if state is None:
        return 404, {"error": f"no message {message_id}"}
    noun = f"message {message_id}"
    refusal = f"only {a.allowed} can be {a.past}"
    if o.dry_run:
        if state in a.states:
            return 200, {"dry_run": True, "would_change": 1, "summary": o.sentence(noun) + "."}
        return 200, {
            "dry_run": True,
            "would_change": 0,
            "unchanged": {str(message_id): state},
            "summary": f"Nothing would change: {noun} is {state}; {refusal}.",
        }
    if o.apply(engine, [message_id], now, by):
        return 200, {"changed": [str(message_id)], "summary": o.sentence(noun, done=True) + "."}
    after = admin.states_of(engine, [message_id]).get(message_id, "not found")
    late = "too late: " if after in (State.IN_FLIGHT.value, State.PUBLISHED.value) else ""
    return 409, {
        "changed": [],
        "unchanged": {str(message_id): after},
        "error": f"{late}{noun} is {after}; {refusal}; nothing changed",
    }


# --------------------------------------------------------------------------- a selection


def run_selection(
    engine: Engine, o: Order, ids: Sequence[uuid.UUID], now: dt.datetime, by: str
) -> dict[str, Any]:
    a = o.action
    states = admin.states_of(engine, ids)
    if o.dry_run:
        would = [i for i in ids if states.get(i) in a.states]
        others = _unchanged(states, [i for i in ids if i not in set(would)])
        noun = f"{len(would)} of the {len(ids)} selected messages"
        summary = o.sentence(noun) + "."
        if others:
            summary += f" {len(others)} will not change ({_tally(others)}): only {a.allowed}."
        return {
            "dry_run": True,
            "would_change": len(would),
            "unchanged": others,
            "summary": summary,
        }
    changed = o.apply(engine, ids, now, by)
    rest = [i for i in ids if i not in changed]
    unchanged = _unchanged(admin.states_of(engine, rest), rest)
    summary = o.sentence(f"{len(changed)} of the {len(ids)} selected messages", done=True) + "."
    if unchanged:
        summary += f" {len(unchanged)} did not change ({_tally(unchanged)})."
    return {
        "changed": [str(i) for i in ids if i in changed],
        "unchanged": unchanged,
        "summary": summary,
    }


# --------------------------------------------------------------------------- a filtered group


def group_filter(raw: Any, now: dt.datetime) -> tuple[admin.MessageFilter, str]:
    """The filter of a group action's body, and its description."""
    if not isinstance(raw, Mapping):
        raise BadRequest("filter must be an object of filters (state, exchange, ...)")
    params: dict[str, list[str]] = {}
    for name, value in raw.items():
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            raise BadRequest(f"filter {name} must be text or a list of text")
        said = kept(str(name), values)
        if said:
            params[str(name)] = said
    only(params, FILTERS)
    if not params:
        # As `outbox-relay replay` wants --state: "everything" is never an accident.
        raise BadRequest('a filtered group needs at least one filter (e.g. {"state": "dead"})')
    return message_filter(params, now), describe(params)


@dataclass(frozen=True, slots=True)
class Bound:
    """What a group's dry run counted: `count` messages up to seq `last` (None: none), the
    filter's relative times read at `at`. A confirmation carrying it acts on those alone."""

    count: int
    last: int | None
    at: dt.datetime

    def json(self) -> dict[str, Any]:
        return {"count": self.count, "last_seq": self.last, "at": self.at.isoformat()}


def bound_of(raw: Any) -> Bound:
    """The bound a confirmation sends back, as its dry run gave it."""
    wrong = BadRequest('bound: give it back as the dry run gave it ({"count", "last_seq", "at"})')
    if not isinstance(raw, Mapping) or set(raw) != {"count", "last_seq", "at"}:
        raise wrong
    count, last, at = raw["count"], raw["last_seq"], raw["at"]
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 2**63:
        raise wrong
    if last is not None and (isinstance(last, bool) or not isinstance(last, int)
                             or not 0 <= last < 2**63):  # fmt: skip
        raise wrong
    try:
        when = dt.datetime.fromisoformat(at) if isinstance(at, str) else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise wrong
    return Bound(count, last, when)


def run_group(
    engine: Engine,
    o: Order,
    flt: admin.MessageFilter,
    described: str,
    now: dt.datetime,
    by: str,
    bound: Bound | None = None,
) -> tuple[int, dict[str, Any]]:
    """Every message `flt` matches that the action can change, in batches (never all ids in
    memory, nor in one statement). A dry run returns its Bound; given one, only the messages
    it counted change, and none if they are no longer what it counted (409)."""
    a = o.action
    states = [s for s in (flt.states or a.states) if s in a.states]
    noun = f"messages matching {described}"
    if not states:
        return 200, {
            "dry_run": o.dry_run,
            "would_change" if o.dry_run else "changed": 0,
            "summary": f"Nothing to do: only {a.allowed} can be {a.past}.",
        }
    target = replace(flt, states=states)
    if o.dry_run:
        n, last = admin.count_and_last(engine, target)
        return 200, {
            "dry_run": True,
            "would_change": n,
            "bound": Bound(n, last, now).json(),
            "summary": o.sentence(f"{n} {noun}") + f" (only {a.allowed} change).",
        }
    acted = target
    if bound is not None:
        acted = replace(target, max_seq=-1 if bound.last is None else bound.last)
        now_counted = admin.count_messages(engine, acted)
        if now_counted != bound.count:
            return 409, {
                "changed": 0,
                "would_change": now_counted,
                "error": f"{now_counted} messages match now, {bound.count} when counted: "
                "nothing changed; look again before acting",
            }
    seen = done = 0
    for batch in admin.matching_batches(engine, acted, BATCH):
        seen += len(batch)
        done += len(o.apply(engine, batch, now, by))
    summary = o.sentence(f"{done} {noun}", done=True) + "."
    if seen > done:
        summary += f" {seen - done} changed state meanwhile and were left alone."
    if bound is not None:
        newer = admin.count_messages(engine, target)
        if newer:
            summary += f" {newer} more match now and were left alone."
    return 200, {"changed": done, "skipped": seen - done, "summary": summary}
