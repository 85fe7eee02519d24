"""Operator commands: messages, show, replay, discard, cancel, reschedule, prioritize (and
per-exchange status).

Each prints a readable table, or JSON with --json; bad usage exits 2 with one line. Given several
databases (relay/cli/each.py), `messages` lists them all, each row naming its database, and `show`
finds the one that holds the id; the commands that change messages take one database.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import getpass
import json
import socket
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine
from tqdm import tqdm

from outbox.states import State
from relay.cli import each
from relay.cli.options import Commands, Handler, argparse_type
from relay.core.durations import parse_duration, parse_moment
from relay.errors import ConfigError
from relay.runtime import message_filter as filters
from relay.runtime.config import RelayConfig
from relay.runtime.logs import printable
from relay.runtime.message_rows import cell, jsonable, message_cells
from relay.runtime.readers import positive_int
from relay.store import admin, command_engine

BULK_CHUNK = 500


def _uuid(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a message id (a UUID)") from None


def _states(raw: str) -> list[str]:
    try:
        names = filters.states([raw])
    except filters.UnknownState as exc:
        bad = ", ".join(exc.unknown)
    else:
        if names:
            return names
        bad = repr(raw)
    raise argparse.ArgumentTypeError(
        f"unknown state {bad} (known: {', '.join(filters.KNOWN_STATES)})"
    )


def _add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", type=_states, action="extend", default=[],
                   help="state(s), comma-separated or repeated")  # fmt: skip
    p.add_argument("--exchange", help='exchange, exactly ("" is the default exchange)')
    p.add_argument("--routing-key", help="routing key, exactly")
    p.add_argument("--key", help="ordering key")
    for name in ("created-since", "created-until", "failed-since", "failed-until"):
        p.add_argument(f"--{name}", metavar="WHEN",
                       help="a duration ago (2h, 7d) or an ISO timestamp")  # fmt: skip
    p.add_argument("--error-contains", metavar="TEXT", help="last error contains TEXT")


def add_parsers(sub: Commands) -> None:
    messages = sub.add_parser("messages", help="list messages, newest first, with filters")
    _add_filters(messages)
    messages.add_argument("--limit", type=argparse_type(positive_int), default=50,
                          help="at most this many (default 50)")  # fmt: skip
    messages.add_argument("--json", action="store_true", help="print JSON")

    show = sub.add_parser("show", help="one message: fields, headers and attempt history")
    show.add_argument("id", type=_uuid, metavar="ID", help="the message id enqueue returned")
    show.add_argument("--json", action="store_true", help="print JSON")

    for name, what in (
        ("replay", "send dead (or discarded, cancelled) messages again, same message id"),
        ("discard", "dead to discarded: never sent, kept for audit until retention"),
    ):
        p = sub.add_parser(name, help=what)
        p.add_argument("ids", nargs="*", type=_uuid, metavar="ID",
                       help="message ids; or select by the filters")  # fmt: skip
        _add_filters(p)
        p.add_argument(
            "--dry-run", action="store_true", help="say what would change, change nothing"
        )
        p.add_argument("--json", action="store_true", help="print JSON")

    cancel = sub.add_parser("cancel", help="stop pending messages from being sent")
    cancel.add_argument("ids", nargs="+", type=_uuid, metavar="ID", help="message ids")
    cancel.add_argument("--json", action="store_true", help="print JSON")

    reschedule = sub.add_parser(
        "reschedule", help="pending messages due at another time, earlier or later"
    )
    reschedule.add_argument("ids", nargs="*", type=_uuid, metavar="ID",
                            help="message ids; or select by the filters")  # fmt: skip
    when = reschedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", metavar="TIME", help="an ISO timestamp (UTC unless it has an offset)")
    when.add_argument("--in", dest="due_in", metavar="DURATION",
                      help="this long from now: 0, 90s, 10m, 2h, 7d")  # fmt: skip
    prioritize = sub.add_parser(
        "prioritize", help="pending messages claimed at another priority (higher first)"
    )
    prioritize.add_argument("ids", nargs="*", type=_uuid, metavar="ID",
                            help="message ids; or select by the filters")  # fmt: skip
    prioritize.add_argument("priority", type=argparse_type(_priority), metavar="N",
                            help="the new priority (enqueue's default is 0)")  # fmt: skip
    for p in (reschedule, prioritize):
        _add_filters(p)
        p.add_argument(
            "--dry-run", action="store_true", help="say what would change, change nothing"
        )
        p.add_argument("--json", action="store_true", help="print JSON")


def _priority(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not an integer priority") from None
    if value not in admin.PRIORITIES:
        low, high = admin.PRIORITIES[0], admin.PRIORITIES[-1]
        raise ValueError(f"priority {raw} is out of range ({low} to {high})")
    return value


# The filters' flags (_add_filters), by the names relay/runtime/message_filter.py reads.
_FILTER_FLAGS = ("exchange", "routing_key", "key", "error_contains", *filters.TIME_FILTERS)


def _filter(args: argparse.Namespace, now: dt.datetime) -> admin.MessageFilter:
    values = {n: [getattr(args, n)] for n in _FILTER_FLAGS if getattr(args, n) is not None}
    try:
        return filters.message_filter({"state": args.state, **values}, now)
    except filters.FilterError as exc:
        raise ConfigError(f"--{exc.name.replace('_', '-')}: {exc.problem}") from None


def operator() -> str:
    """Who runs this command, for the attempt record of each change it makes."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        user = "unknown"
    return f"operator:{user}@{socket.gethostname()}"[:255]


def operator_engine(config: RelayConfig) -> AbstractContextManager[Engine]:
    """An engine for one command, behind the store's one driver-error boundary."""
    return command_engine(config.db_url)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def table(cells: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    rows = [[printable(c) for c in r] for r in cells]  # stored text reaches the terminal escaped
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


# The columns of `messages` (relay/runtime/message_rows.py), and the widths a terminal allows.
_COLUMNS = ("id", "state", "attempts", "exchange", "routing_key", "created", "last_error")
_WIDTHS = {"exchange": 24, "routing_key": 24, "last_error": 60}


def cmd_messages(config: RelayConfig, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ConfigError("--limit must be at least 1")
    flt = _filter(args, utc_now())
    found = each.targets(config)
    if len(found) > 1:
        return _messages_each(found, args, flt)
    rows = _listed(found[0].config, flt, args.limit)
    if args.json:
        print(json.dumps([jsonable(r) for r in rows], default=str))
        return 0
    print(_messages_table(rows, []))
    if len(rows) == args.limit:
        print(f"(first {args.limit}; raise --limit for more)", file=sys.stderr)
    return 0


def _listed(config: RelayConfig, flt: admin.MessageFilter, limit: int) -> list[dict[str, Any]]:
    with operator_engine(config) as engine:
        return admin.list_messages(engine, flt, limit)


def _messages_table(rows: list[dict[str, Any]], first: list[str]) -> str:
    """The rows as `messages` prints them; the fields in `first` (`database`) before the rest."""
    cells = [message_cells(r, _WIDTHS) for r in rows]
    return table(
        [[*(str(r[f]) for f in first), *(c[column] for column in _COLUMNS)]
         for r, c in zip(rows, cells, strict=True)],
        [*first, "id", "state", "att", "exchange", "routing key", "created", "last error"],
    )  # fmt: skip


def _messages_each(
    found: list[each.Target], args: argparse.Namespace, flt: admin.MessageFilter
) -> int:
    """`messages` with several databases: the filters on each, the newest --limit of them all
    in one list, each row naming its database; a database that failed is said on stderr."""
    answers = list(each.each_database(found, args, lambda c: _listed(c, flt, args.limit)))
    rows, full = [], False
    for answer in answers:
        if isinstance(answer.value, each.Failed):
            print(each.failure_line("messages", answer.name, answer.value), file=sys.stderr)
            continue
        rows += [{"database": answer.name, **row} for row in answer.value]
        full = full or len(answer.value) == args.limit
    # Newest first across databases, by creation time: seq is each database's own. Stable, so
    # ties keep each database's order.
    rows.sort(key=_created, reverse=True)
    shown = rows[: args.limit]
    if args.json:
        print(json.dumps([jsonable(r) for r in shown], default=str))
    else:
        print(_messages_table(shown, ["database"]))
        if full or len(rows) > args.limit:
            print(f"(first {args.limit}; raise --limit for more)", file=sys.stderr)
    return each.exit_code(answers)


def _created(row: dict[str, Any]) -> dt.datetime:
    created = row.get("created_at")
    # A hand-edited row may hold anything there: it sorts last.
    return created if isinstance(created, dt.datetime) else _NEVER


_NEVER = dt.datetime.min.replace(tzinfo=dt.UTC)


def _bytes(value: Any) -> bytes:
    # A hand-edited row (SQLite) may hold TEXT, or NULL, where the payload's bytes belong.
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return bytes(value)


def cmd_show(config: RelayConfig, args: argparse.Namespace) -> int:
    found = each.targets(config)
    if len(found) > 1:
        return _show_each(found, args)
    message = _message(found[0].config, args.id)
    if message is None:
        print(f"outbox-relay: show: no message with id {args.id}", file=sys.stderr)
        return 1
    _show(message, args)
    return 0


def _message(config: RelayConfig, message_id: uuid.UUID) -> dict[str, Any] | None:
    with operator_engine(config) as engine:
        return admin.get_message(engine, message_id)


def _show_each(found: list[each.Target], args: argparse.Namespace) -> int:
    """`show` with several databases: the message from the one that holds it (ids are unique:
    the first found is the one), which `database` names."""
    failures = []
    for answer in each.each_database(found, args, lambda c: _message(c, args.id)):
        if isinstance(answer.value, each.Failed):
            failures.append(each.failure_line("show", answer.name, answer.value))
        elif answer.value is not None:
            _show(answer.value, args, answer.name)
            return 0
    for line in failures:  # the message may be in one of these
        print(line, file=sys.stderr)
    where = " in the databases that answered" if failures else ""
    print(f"outbox-relay: show: no message with id {args.id}{where}", file=sys.stderr)
    return 1


def _show(found: dict[str, Any], args: argparse.Namespace, database: str = "") -> None:
    """The message, as `show` prints it; named by its `database` when one is given."""
    named = {"database": database} if database else {}
    payload = _bytes(found.pop("payload"))
    if args.json:
        out = {**named, **jsonable(found)}
        try:
            out["payload"] = payload.decode("utf-8")
        except UnicodeDecodeError:
            out["payload"] = None
        out["payload_bytes"] = len(payload)
        print(json.dumps(out, default=str))  # a hand-corrupted row may hold any type
        return
    history = found.pop("attempt_history")
    row = {**named, **found}
    fields = [
        *named, "id", "state", "exchange", "routing_key", "key", "content_type", "priority",
        "attempts", "max_attempts", "created_at", "available_at", "published_at", "last_failed_at",
        "last_error", "replay_count", "replayed_at", "idempotency_key", "traceparent",
        "lease_owner", "lease_expires_at",
    ]  # fmt: skip
    width = max(len(f) for f in fields)
    for f in fields:
        print(f"{f:<{width}}  {cell(row.get(f))}")
    headers = found.get("headers") or {}
    # json.dumps escapes control characters itself; a row whose headers are not a mapping is
    # shown as stored, escaped.
    shown = json.dumps(headers, default=str) if isinstance(headers, dict) else cell(headers)
    print(f"{'headers':<{width}}  " + (shown if headers else "-"))
    try:
        text = payload.decode("utf-8")
        preview = text if len(text) <= 2000 else text[:2000] + f"… ({len(payload)} bytes)"
    except UnicodeDecodeError:
        preview = f"<{len(payload)} bytes of binary>"
    print(f"{'payload':<{width}}  {printable(preview, keep=chr(10) + chr(9))}")
    print()
    print(table(
        [[str(h["attempt"]), cell(h["at"]), h["outcome"], h["failure_class"],
          cell(h["relay_id"], 24), cell(h["next_attempt_at"]), cell(h["error"], 70)]
         for h in history],
        ["attempt", "at", "outcome", "class", "by", "next attempt", "error"],
    ) if history else "no failed attempts")  # fmt: skip


def _has_filter(args: argparse.Namespace) -> bool:
    return any(getattr(args, n) is not None for n in _FILTER_FLAGS) or bool(args.state)


def _bulk(
    config: RelayConfig,
    args: argparse.Namespace,
    verb: str,
    action: Callable[..., list[uuid.UUID]],
    default_states: Sequence[str],
) -> int:
    if args.ids and _has_filter(args):
        raise ConfigError(f"{verb}: give message ids or filters, not both")
    if not args.ids and not args.state:
        raise ConfigError(f"{verb}: give message ids, or --state {default_states[0]} [filters]")
    now = utc_now()
    flt = admin.MessageFilter(ids=tuple(args.ids)) if args.ids else _filter(args, now)
    past = PAST[verb]
    with operator_engine(config) as engine:
        if args.dry_run:
            # What would change: the matches still in a state this command changes.
            states = [s for s in (flt.states or default_states) if s in default_states]
            would = _JsonIds({"dry_run": True}, f"would_{verb}") if args.json else None
            n = 0
            if states:
                for batch in admin.matching_batches(
                    engine, replace(flt, states=states), BULK_CHUNK
                ):
                    n += len(batch)
                    if would is not None:
                        would.add(batch)
            if would is not None:
                would.close({})
            else:
                print(f"would {verb} {n} message(s) (dry run; nothing changed)")
            return 0
        # Streamed: a whole state is never held in memory, nor bound into one statement.
        batches: Iterator[Sequence[uuid.UUID]] = (
            (args.ids[i : i + BULK_CHUNK] for i in range(0, len(args.ids), BULK_CHUNK))
            if args.ids
            else admin.matching_batches(engine, flt, BULK_CHUNK)
        )
        show = sys.stderr.isatty()
        # Counting costs a query, so only for a bar someone is watching.
        total = (len(args.ids) if args.ids else admin.count_messages(engine, flt)) if show else 0
        changed = _JsonIds({}, past) if args.json else None
        seen = done = 0
        with tqdm(total=total, desc=verb, unit="msg", file=sys.stderr,
                  disable=not show or total <= BULK_CHUNK) as bar:  # fmt: skip
            for chunk in batches:
                result = action(engine, list(chunk), now=now, by=operator())
                seen, done = seen + len(chunk), done + len(result)
                if changed is not None:
                    changed.add(result)
                bar.update(len(chunk))
    skipped = seen - done
    if changed is not None:
        changed.close({"skipped": skipped})
    else:
        note = f" ({skipped} skipped: not in a state this command changes)" if skipped else ""
        print(f"{past} {done} message(s){note}")
    return 0


class _JsonIds:
    """One JSON object whose `key` lists ids, written as they come (a bulk command's ids are
    never all in memory): `{...head, key: [ids...], ...tail}`."""

    def __init__(self, head: dict[str, Any], key: str) -> None:
        opening = json.dumps(head)[:-1]
        sys.stdout.write(f"{opening}{', ' if head else ''}{json.dumps(key)}: [")
        self._first = True

    def add(self, ids: Sequence[uuid.UUID]) -> None:
        for i in ids:
            sys.stdout.write(("" if self._first else ", ") + json.dumps(str(i)))
            self._first = False

    def close(self, tail: dict[str, Any]) -> None:
        rest = json.dumps(tail)[1:]
        sys.stdout.write("]" + (", " + rest if tail else "}") + "\n")


def cmd_replay(config: RelayConfig, args: argparse.Namespace) -> int:
    return _bulk(config, args, "replay", admin.replay, admin.REPLAYABLE)


def cmd_discard(config: RelayConfig, args: argparse.Namespace) -> int:
    return _bulk(config, args, "discard", admin.discard, (State.DEAD.value,))


def cmd_cancel(config: RelayConfig, args: argparse.Namespace) -> int:
    ids: list[uuid.UUID] = list(dict.fromkeys(args.ids))  # each once, in the order given
    results: dict[uuid.UUID, str] = {}
    with operator_engine(config) as engine:
        for i in range(0, len(ids), BULK_CHUNK):  # a bounded IN list per statement
            chunk = ids[i : i + BULK_CHUNK]
            results.update(admin.cancel(engine, chunk, now=utc_now(), by=operator()))
    if args.json:
        print(json.dumps({str(k): v for k, v in results.items()}))
    else:
        for message_id, state in results.items():
            if state == "cancelled":
                print(f"{message_id}  cancelled: it will not be sent")
            elif state == "not found":
                print(f"{message_id}  not found")
            else:
                print(f"{message_id}  too late: the message is {printable(state)}")
    return 0 if all(s == "cancelled" for s in results.values()) else 1


PAST = {
    "replay": "replayed",
    "discard": "discarded",
    "reschedule": "rescheduled",
    "prioritize": "prioritized",
}


def _due(args: argparse.Namespace, now: dt.datetime) -> dt.datetime:
    """The time `reschedule --at` or `--in` names."""
    if args.due_in is not None:
        try:
            return now + dt.timedelta(seconds=parse_duration(args.due_in))
        except ValueError as exc:
            raise ConfigError(f"--in: {exc}") from None
    try:
        parse_duration(args.at)
    except ValueError:
        pass
    else:  # parse_moment would read a duration as that long *ago*
        raise ConfigError(
            f"--at: {args.at!r} is a duration: use --in {args.at} for a time from now"
        )
    try:
        return parse_moment(args.at, now)
    except ValueError as exc:
        raise ConfigError(f"--at: {exc}") from None


def cmd_reschedule(config: RelayConfig, args: argparse.Namespace) -> int:
    at = _due(args, utc_now())
    action = functools.partial(admin.reschedule, at=at)
    return _pending_change(config, args, "reschedule", action, f"due at {cell(at)} UTC")


def cmd_prioritize(config: RelayConfig, args: argparse.Namespace) -> int:
    action = functools.partial(admin.prioritize, priority=args.priority)
    return _pending_change(config, args, "prioritize", action, f"priority {args.priority}")


def _pending_change(
    config: RelayConfig,
    args: argparse.Namespace,
    verb: str,
    action: Callable[..., list[uuid.UUID]],
    what: str,
) -> int:
    """reschedule and prioritize: a group (filters) or a dry run as `replay` does them; given
    ids, a line for each, saying why a message did not change (exit 1 then), as `cancel` does."""
    if args.dry_run or not args.ids or _has_filter(args):
        return _bulk(config, args, verb, action, admin.UNCLAIMED)
    ids: list[uuid.UUID] = list(dict.fromkeys(args.ids))
    changed: set[uuid.UUID] = set()
    with operator_engine(config) as engine:
        for i in range(0, len(ids), BULK_CHUNK):
            chunk = ids[i : i + BULK_CHUNK]
            changed.update(action(engine, chunk, now=utc_now(), by=operator()))
        states = admin.states_of(engine, [i for i in ids if i not in changed])
    results = {i: PAST[verb] if i in changed else states.get(i, "not found") for i in ids}
    if args.json:
        print(json.dumps({str(k): v for k, v in results.items()}))
    else:
        for message_id, state in results.items():
            print(f"{message_id}  {_said(state, PAST[verb], what)}")
    return 0 if len(changed) == len(ids) else 1


def _said(state: str, past: str, what: str) -> str:
    if state == past:
        return f"{past}: {what}"
    if state == "not found":
        return "not found"
    if state in (State.IN_FLIGHT.value, State.PUBLISHED.value):
        return f"too late: the message is {printable(state)}"
    return f"not pending: the message is {printable(state)}"


def per_exchange(config: RelayConfig) -> list[dict[str, Any]]:
    with operator_engine(config) as engine:
        return admin.per_exchange(engine, utc_now())


COMMANDS: dict[str, Handler] = {
    "messages": cmd_messages,
    "show": cmd_show,
    "replay": cmd_replay,
    "discard": cmd_discard,
    "cancel": cmd_cancel,
    "reschedule": cmd_reschedule,
    "prioritize": cmd_prioritize,
}
