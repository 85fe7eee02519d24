"""`outbox.enqueue` against real databases: invalid input writes nothing; idempotency keys."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

import outbox
from outbox.config import settings
from tests.support.db import row_count
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

LIMIT = 64  # the payload limit while `small_limit` is in force


@pytest.fixture
def small_limit() -> Iterator[int]:
    """Lower the process-wide payload limit to LIMIT bytes; restore the previous one after."""
    before = settings().max_payload_bytes
    outbox.configure(max_payload_bytes=LIMIT)
    yield LIMIT
    outbox.configure(max_payload_bytes=before)


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def base(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"exchange": "orders", "routing_key": "order.created", "payload": {}}
    args.update(overrides)
    return args


INVALID: list[tuple[str, dict[str, Any], type[outbox.OutboxError], str]] = [
    ("set-in-dict", base(payload={"tags": {1, 2}}), outbox.PayloadEncodingError, "JSON"),
    ("nan-in-dict", base(payload={"x": float("nan")}), outbox.PayloadEncodingError, "JSON"),
    ("inf-in-list", base(payload=[float("inf")]), outbox.PayloadEncodingError, "JSON"),
    ("bare-float", base(payload=1.5), outbox.PayloadEncodingError, "float"),
    ("lone-surrogate", base(payload="\ud800"), outbox.PayloadEncodingError, "UTF-8"),
    ("header-none", base(headers={"h": None}), outbox.InvalidHeader, "'h'"),
    ("header-list", base(headers={"h": [1]}), outbox.InvalidHeader, "'h'"),
    ("header-bytes", base(headers={"h": b"x"}), outbox.InvalidHeader, "'h'"),
    ("header-dict", base(headers={"h": {"a": 1}}), outbox.InvalidHeader, "'h'"),
    ("empty-target", base(exchange="", routing_key=""), outbox.InvalidDestination, "empty"),
    ("negative-delay", base(delay=-1), outbox.InvalidOption, "negative"),
    (
        "negative-timedelta",
        base(delay=dt.timedelta(milliseconds=-1)),
        outbox.InvalidOption,
        "negative",
    ),
    ("nan-delay", base(delay=float("nan")), outbox.InvalidOption, "delay"),
    # What could not be delivered: too deep, too large for a frame, too long for AMQP, NUL.
    ("json-5000-deep", base(payload=nested(5000)), outbox.PayloadEncodingError, "nested"),
    ("json-65-deep", base(payload={"a": nested(64)}), outbox.PayloadEncodingError, "64 levels"),
    (
        "headers-over-16-KiB",
        base(headers={"big": "x" * 16 * 1024}),
        outbox.InvalidHeader,
        "headers encode to",
    ),
    ("content-type-200-e", base(content_type="é" * 200), outbox.InvalidOption, "content_type"),
    ("nul-routing-key", base(routing_key="order.\x00evil"), outbox.InvalidDestination, "NUL"),
    ("nul-header-value", base(headers={"h": "a\x00"}), outbox.InvalidHeader, "NUL"),
    ("nul-key", base(key="k\x00"), outbox.InvalidOption, "NUL"),
]


@pytest.mark.parametrize(
    ("args", "error", "says"),
    [pytest.param(args, error, says, id=name) for name, args, error, says in INVALID],
)
@pytest.mark.parametrize("form", ["session", "connection"])
def test_invalid_input_raises_and_writes_nothing(
    app_engine: Engine,
    form: str,
    args: dict[str, Any],
    error: type[outbox.OutboxError],
    says: str,
) -> None:
    # The transaction stays usable after the error (nothing reached the database, so even
    # PostgreSQL has not aborted it) and commits with no outbox row in it.
    if form == "session":
        with (
            Session(app_engine) as session,
            session.begin(),
            pytest.raises(error, match=says) as raised,
        ):
            outbox.enqueue(session, **args)
    else:
        with app_engine.begin() as conn, pytest.raises(error, match=says) as raised:
            outbox.enqueue(conn, **args)
    assert isinstance(raised.value, outbox.OutboxError)
    assert row_count(app_engine) == 0


def test_payload_over_the_size_limit_raises_and_writes_nothing(
    app_engine: Engine, small_limit: int
) -> None:
    with app_engine.begin() as conn:
        outbox.enqueue(conn, **base(payload=b"x" * small_limit))  # at the limit: accepted
        with pytest.raises(outbox.PayloadTooLarge, match=f"{small_limit + 1} bytes"):
            outbox.enqueue(conn, **base(payload=b"x" * (small_limit + 1)))
        # The limit is on the encoded size: ["..."] is 4 bytes, "é" is 2 bytes in UTF-8.
        outbox.enqueue(conn, **base(payload=["é" * 30]))  # 64 bytes: accepted
        with pytest.raises(outbox.PayloadTooLarge, match="66 bytes"):
            outbox.enqueue(conn, **base(payload=["é" * 31]))  # 35 characters, 66 bytes
    assert row_count(app_engine) == 2


def test_the_transaction_writes_on_after_every_refusal(app_engine: Engine) -> None:
    """Each refusal happens before any SQL: on PostgreSQL the transaction is not aborted, and
    the caller's later writes in it commit."""
    with Session(app_engine) as session, session.begin():
        for name, args, error, _ in INVALID:
            with pytest.raises(error):
                outbox.enqueue(session, **args)
            outbox.enqueue(session, **base(payload={"after": name}))
    assert row_count(app_engine) == len(INVALID)


def test_an_invalid_call_leaves_earlier_rows_of_the_transaction_alone(app_engine: Engine) -> None:
    with Session(app_engine) as session, session.begin():
        kept = outbox.enqueue(session, **base())
        with pytest.raises(outbox.InvalidHeader):
            outbox.enqueue(session, **base(headers={"ok": 1, "bad": None}))
    assert row_count(app_engine) == 1
    assert row_count(app_engine, id=kept) == 1


# --------------------------------------------------------------------------- idempotency


def enqueue_keyed(conn: Connection | Session, key: str = "order-42/created") -> uuid.UUID:
    return outbox.enqueue(conn, **base(payload={"n": 1}), idempotency_key=key)


def test_a_repeated_idempotency_key_returns_the_first_id_and_writes_nothing(
    app_engine: Engine,
) -> None:
    with app_engine.begin() as conn:
        first = enqueue_keyed(conn)
    with Session(app_engine) as session, session.begin():
        again = enqueue_keyed(session)
        # In the same transaction too: still the one row.
        assert enqueue_keyed(session) == first
    assert again == first
    assert row_count(app_engine) == 1
    with app_engine.begin() as conn:
        other = enqueue_keyed(conn, key="another key")
    assert other != first
    assert row_count(app_engine) == 2


def test_rolling_back_frees_the_idempotency_key(app_engine: Engine) -> None:
    with app_engine.connect() as conn:
        with conn.begin() as tx:
            lost = enqueue_keyed(conn)
            tx.rollback()
        with conn.begin():
            kept = enqueue_keyed(conn)
    assert kept != lost
    assert row_count(app_engine) == 1
    assert row_count(app_engine, id=kept) == 1


def backend_pid(conn: Connection) -> int:
    return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def wait_until_blocked(admin: Engine, pid: int) -> None:
    """Wait until backend `pid` waits on a lock (the other transaction's unique-index entry)."""

    def blocked() -> bool:
        with admin.connect() as conn:
            event = conn.execute(
                text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar()
        return event == "Lock"

    wait_until(blocked, timeout=10, what=f"backend {pid} to wait on a lock")


class Racer:
    """Runs `enqueue_keyed(conn)` in a thread and keeps what it returned or raised."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.result: uuid.UUID | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = enqueue_keyed(self.conn)
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self.thread.join(10)
        assert not self.thread.is_alive(), "the second enqueue is still blocked"


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_racing_idempotency_keys_on_postgresql_never_make_two_rows(
    pg_engine: Engine, pg_admin: Engine, first_commits: bool
) -> None:
    with pg_engine.connect() as first, pg_engine.connect() as second:
        first_id = enqueue_keyed(first)  # the first transaction holds the key, uncommitted
        pid = backend_pid(second)
        racer = Racer(second)
        # The second INSERT waits on the first transaction's unique-index entry...
        wait_until_blocked(pg_admin, pid)
        # ...and learns the outcome when that transaction ends.
        if first_commits:
            first.commit()
        else:
            first.rollback()
        racer.join()
        assert racer.error is None, f"second enqueue raised {racer.error!r}"
        second.commit()
    if first_commits:
        assert racer.result == first_id
    else:
        assert racer.result is not None
        assert racer.result != first_id
    assert row_count(pg_engine) == 1
    assert row_count(pg_engine, id=racer.result) == 1


def test_racing_idempotency_key_under_repeatable_read_gets_the_id_or_a_conflict(
    pg_engine: Engine, pg_admin: Engine
) -> None:
    # The second transaction's snapshot predates the first one's commit, so the winner's row
    # is invisible to it: it cannot return the winner's id, and must say so as an OutboxError
    # (never write a second row).
    with pg_engine.connect() as first, pg_engine.connect() as second:
        first_id = enqueue_keyed(first)
        second = second.execution_options(isolation_level="REPEATABLE READ")
        pid = backend_pid(second)  # the first statement takes the snapshot
        racer = Racer(second)
        wait_until_blocked(pg_admin, pid)
        first.commit()
        racer.join()
        second.rollback()
    if racer.error is None:
        assert racer.result == first_id
    else:
        assert isinstance(racer.error, outbox.IdempotencyConflict), repr(racer.error)
    assert row_count(pg_engine) == 1
    assert row_count(pg_engine, id=first_id) == 1
