"""Helpers for an application's own tests: did this transaction enqueue that message?

No broker and no relay: these read the outbox table through the caller's own handle (anything
`outbox.enqueue` takes: a Session, scoped_session or Connection, a DB-API connection), so rows the
transaction has not committed yet are seen, exactly as the relay will see them once it commits.

    from outbox.testing import assert_enqueued, enqueued

    def test_placing_an_order_announces_it(session: Session) -> None:
        place_order(session, order_id=17)           # calls outbox.enqueue(session, ...)
        assert_enqueued(session, exchange="orders", routing_key="order.created",
                        payload={"id": 17}, key="17")

    def test_a_refused_order_announces_nothing(session: Session) -> None:
        refuse_order(session, order_id=18)
        assert enqueued(session, exchange="orders") == []

Filters compare for equality and combine with AND; one left out matches anything:
- `exchange`, `routing_key`, `key` (`key=None` asks for messages without an ordering key),
  `content_type`, `idempotency_key`;
- `payload`: compared with the payload decoded as a consumer reads it (`EnqueuedMessage.payload`:
  JSON content types as `json.loads` returns them, `text/*` as a string, anything else as bytes);
  a bytes value is compared with the body as sent;
- `headers`: every header given is present with that value (others may be there too). These are
  the caller's headers; the relay adds `x-outbox-key` and the trace context only on the wire.

Every message the caller's transaction can see is considered, committed ones from before the test
included: give each test a database of its own, or filter narrowly enough. Matches come back in
enqueue order.

With an async handle (anything `outbox.enqueue_async` takes), await the `_async` forms
(`enqueued_async`, `assert_enqueued_async`, `assert_not_enqueued_async`): the same helpers, run on
the async connection's sync face.

In logical capture mode (`OUTBOX_CAPTURE=logical`) on PostgreSQL, enqueue writes messages into the
write-ahead log, where no query of the transaction can read them: the helpers raise `OutboxError`
rather than report nothing. Run tests in table mode (`outbox.configure(capture="table")`): the
messages enqueued are the same.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from sqlalchemy import Connection, RowMapping, select

from outbox.config import LOGICAL, settings
from outbox.databases import database_named
from outbox.errors import OutboxError
from outbox.schema import message
from outbox.sessions import Db, sync_connection

if TYPE_CHECKING:  # loaded by the async helpers when called: sync tests never load it
    from sqlalchemy.ext.asyncio import AsyncConnection

    from outbox.async_enqueue import AsyncDb

__all__ = [
    "EnqueuedMessage",
    "Filters",
    "assert_enqueued",
    "assert_enqueued_async",
    "assert_not_enqueued",
    "assert_not_enqueued_async",
    "decode_payload",
    "enqueued",
    "enqueued_async",
]


@dataclass(frozen=True, slots=True)
class EnqueuedMessage:
    """One row of the outbox table, as a test wants to look at it.

    Attributes:
        id: The message id `enqueue` returned, also the AMQP `message_id`.
        exchange: The exchange it will be published to.
        routing_key: The routing key it will be published with.
        payload: The body decoded as a consumer reads it: JSON content types as `json.loads`
            returns them, `text/*` as a string, anything else as bytes.
        body: Exactly what will be published.
        content_type: The AMQP content type.
        key: The ordering key, or None.
        headers: The caller's headers (`{}` when none); the relay adds its own on the wire.
        idempotency_key: The idempotency key, or None.
        priority: The priority given to `enqueue`.
        max_attempts: The attempts given to `enqueue`, or None for the relay's default.
        state: The message's state (`pending` until a relay claims it).
        available_at: When it is due (the enqueue time plus any delay), in UTC.
        created_at: When it was enqueued, in UTC.
    """

    id: uuid.UUID  # also the AMQP message_id
    exchange: str
    routing_key: str
    payload: Any  # decoded by content type: dict/list (JSON), str (text/*), else bytes
    body: bytes  # exactly what will be published
    content_type: str
    key: str | None
    headers: Mapping[str, Any]  # the caller's headers ({} when none)
    idempotency_key: str | None
    priority: int
    max_attempts: int | None
    state: str
    available_at: dt.datetime
    created_at: dt.datetime

    def describe(self) -> str:
        """One line for an assertion message."""
        return (
            f"{self.exchange!r} / {self.routing_key!r} key={self.key!r} "
            f"payload={self.payload!r} headers={dict(self.headers)!r} ({self.state}, id {self.id})"
        )


class Filters(TypedDict, total=False):
    """What `enqueued` and the assertions filter on; a filter left out matches anything.

    Attributes:
        exchange: The exchange, exactly.
        routing_key: The routing key, exactly.
        payload: Equal to the payload decoded as a consumer reads it (see
            `EnqueuedMessage.payload`); a bytes value is compared with the body as sent.
        key: The ordering key; None asks for messages without one.
        headers: Each header given is present with that value (others may be there too).
        content_type: The AMQP content type, exactly.
        idempotency_key: The idempotency key; None asks for messages without one.
    """

    exchange: str
    routing_key: str
    payload: Any
    key: str | None  # None: messages without an ordering key
    headers: Mapping[str, Any]  # each given header present with that value
    content_type: str
    idempotency_key: str | None


_COLUMN_FILTERS = ("exchange", "routing_key", "key", "content_type", "idempotency_key")


def enqueued(db: Db, **filters: Unpack[Filters]) -> list[EnqueuedMessage]:
    """The messages `db`'s transaction can see that match every filter given, in enqueue order.

    Args:
        db: The transaction under test: anything `outbox.enqueue` takes.
        **filters: Any of `Filters`; each compares for equality, and a filter left out
            matches anything.

    Returns:
        The matching messages, oldest first; an empty list when none matches.

    Raises:
        TypeError: A filter name is not one of `Filters`.
        OutboxError: Logical capture is on and `db` is on PostgreSQL: the messages are in the
            log, which these helpers cannot read.
    """
    unknown = set(filters) - set(Filters.__annotations__)
    if unknown:
        raise TypeError(
            f"unknown filter(s) {sorted(unknown)}; filters are {sorted(Filters.__annotations__)}"
        )
    given: Mapping[str, Any] = filters
    stmt = select(message).order_by(message.c.seq)
    for column in _COLUMN_FILTERS:
        if column in given:
            value = given[column]
            condition = message.c[column].is_(None) if value is None else message.c[column] == value
            stmt = stmt.where(condition)
    with _sync_connection(db, "enqueued") as conn:
        _refuse_logical(conn)
        found = [_message(row) for row in conn.execute(stmt).mappings()]
    return [m for m in found if _payload_matches(m, given) and _headers_match(m, given)]


def assert_enqueued(
    db: Db, *, count: int | None = None, **filters: Unpack[Filters]
) -> list[EnqueuedMessage]:
    """Fail unless a message matching the filters was enqueued (exactly `count` of them, if
    given); return the matches.

    Args:
        db: The transaction under test: anything `outbox.enqueue` takes.
        count: How many matches there must be; None: at least one.
        **filters: Any of `Filters` (see `enqueued`).

    Returns:
        The matching messages, oldest first.

    Raises:
        AssertionError: No message matches, or not `count` of them; the message lists every
            message that was enqueued.
    """
    with _sync_connection(db, "assert_enqueued") as conn:
        matches = enqueued(conn, **filters)
        if matches and (count is None or len(matches) == count):
            return matches
        everything = enqueued(conn)
    wanted = f"{count} message(s)" if count is not None else "a message"
    found = f"{len(matches)} match" if matches else "none matches"
    raise AssertionError(
        f"expected {wanted} enqueued with {_describe(filters)}; {found}.\n" + _listing(everything)
    )


def assert_not_enqueued(db: Db, **filters: Unpack[Filters]) -> None:
    """Fail if any message matching the filters was enqueued (no filter: any message at all).

    Args:
        db: The transaction under test: anything `outbox.enqueue` takes.
        **filters: Any of `Filters` (see `enqueued`).

    Raises:
        AssertionError: A message matches; the message lists the matches.
    """
    with _sync_connection(db, "assert_not_enqueued") as conn:
        matches = enqueued(conn, **filters)
    if matches:
        raise AssertionError(
            f"expected no message enqueued with {_describe(filters)}; {len(matches)} found.\n"
            + _listing(matches)
        )


async def enqueued_async(db: AsyncDb, **filters: Unpack[Filters]) -> list[EnqueuedMessage]:
    """`enqueued`, for anything `outbox.enqueue_async` takes."""
    async with _async_connection(db, "enqueued") as conn:
        return await conn.run_sync(lambda sync: enqueued(sync, **filters))


async def assert_enqueued_async(
    db: AsyncDb, *, count: int | None = None, **filters: Unpack[Filters]
) -> list[EnqueuedMessage]:
    """`assert_enqueued`, for anything `outbox.enqueue_async` takes."""
    async with _async_connection(db, "assert_enqueued") as conn:
        return await conn.run_sync(lambda sync: assert_enqueued(sync, count=count, **filters))


async def assert_not_enqueued_async(db: AsyncDb, **filters: Unpack[Filters]) -> None:
    """`assert_not_enqueued`, for anything `outbox.enqueue_async` takes."""
    async with _async_connection(db, "assert_not_enqueued") as conn:
        await conn.run_sync(lambda sync: assert_not_enqueued(sync, **filters))


def _refuse_logical(conn: Connection) -> None:
    """Raise when enqueue on `conn` writes to the log, not the table these helpers read."""
    database = database_named(conn.dialect.name)
    if database is not None and database.has_log and settings().capture == LOGICAL:
        raise OutboxError(
            "outbox.testing reads the outbox table, and in logical capture mode "
            "(OUTBOX_CAPTURE=logical) enqueue writes the messages into PostgreSQL's write-ahead "
            "log, where these helpers cannot see them. Run your tests in table mode: "
            "outbox.configure(capture='table') or OUTBOX_CAPTURE=table (the messages your code "
            "enqueues are the same)"
        )


def _sync_connection(db: object, name: str) -> AbstractContextManager[Connection]:
    """The connection of the transaction under test; an async one is refused with the name of
    the helper's `_async` form. Reading needs no transaction: autocommit connections are fine."""
    call = f"outbox.testing.{name}"
    return sync_connection(db, call=call, async_call=f"{call}_async", writes=False)


def _async_connection(db: object, name: str) -> AbstractAsyncContextManager[AsyncConnection]:
    """The async connection of the transaction under test; a sync one is refused with the name
    of the helper's sync form."""
    from outbox.async_enqueue import async_connection  # loads SQLAlchemy's asyncio extension

    call = f"outbox.testing.{name}"
    return async_connection(db, call=f"{call}_async", sync_call=call, writes=False)


def decode_payload(body: bytes, content_type: str) -> Any:
    """A body as a consumer reads it, by its content type: JSON, text, or the bytes unchanged.

    JSON content types (`application/json`, `*+json`) decode with `json.loads`, `text/*` with
    its charset (UTF-8 by default); anything else, or a body that does not decode, comes back
    as bytes.
    """
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    if media == "application/json" or media.endswith("+json"):
        try:
            return json.loads(body)
        except ValueError:
            return body
    if media.startswith("text/"):
        charset = "utf-8"
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "charset" and value.strip():
                charset = value.strip().strip('"')
        try:
            return body.decode(charset)
        except (LookupError, UnicodeDecodeError):
            return body
    return body


def _message(row: RowMapping) -> EnqueuedMessage:
    body = bytes(row["payload"])
    headers = row["headers"]
    if isinstance(headers, str):  # a driver that leaves JSON as text (asyncpg on its own)
        headers = json.loads(headers)
    return EnqueuedMessage(
        # A driver whose uuid typecaster is not registered (psycopg2 on its own) gives text.
        id=row["id"] if isinstance(row["id"], uuid.UUID) else uuid.UUID(str(row["id"])),
        exchange=row["exchange"],
        routing_key=row["routing_key"],
        payload=decode_payload(body, row["content_type"]),
        body=body,
        content_type=row["content_type"],
        key=row["key"],
        headers=dict(headers or {}),
        idempotency_key=row["idempotency_key"],
        priority=row["priority"],
        max_attempts=row["max_attempts"],
        state=row["state"],
        available_at=row["available_at"],
        created_at=row["created_at"],
    )


def _payload_matches(found: EnqueuedMessage, filters: Mapping[str, Any]) -> bool:
    if "payload" not in filters:
        return True
    expected = filters["payload"]
    if isinstance(expected, bytes | bytearray | memoryview):
        return found.body == bytes(expected)
    return bool(found.payload == expected)


def _headers_match(found: EnqueuedMessage, filters: Mapping[str, Any]) -> bool:
    expected: Mapping[str, Any] = filters.get("headers") or {}
    return all(name in found.headers and found.headers[name] == v for name, v in expected.items())


def _describe(filters: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in filters.items()) or "no filter"


def _listing(messages: list[EnqueuedMessage]) -> str:
    if not messages:
        return "Nothing was enqueued."
    lines = [f"{len(messages)} enqueued:"] + [f"  {m.describe()}" for m in messages]
    return "\n".join(lines)
