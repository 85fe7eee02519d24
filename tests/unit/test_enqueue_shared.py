"""`enqueue` and `enqueue_async` share one implementation: the same arguments, the same `prepare`,
and errors that name the right call for the wrong kind of session. No database needed."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import json
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
from outbox import testing
from outbox.async_enqueue import enqueue_async
from outbox.enqueue import enqueue
from outbox.prepared import prepare

ARGS: dict[str, Any] = {"exchange": "orders", "routing_key": "order.created", "payload": {}}
# Every keyword of `prepare` at enqueue's defaults.
DEFAULTS: dict[str, Any] = {
    "key": None,
    "headers": None,
    "idempotency_key": None,
    "delay": None,
    "priority": 0,
    "max_attempts": None,
    "content_type": None,
}


def test_enqueue_async_takes_exactly_enqueues_arguments() -> None:
    sync = inspect.signature(enqueue)
    async_ = inspect.signature(enqueue_async)
    assert list(async_.parameters)[1:] == list(sync.parameters)[1:]
    for name, param in list(sync.parameters.items())[1:]:
        other = async_.parameters[name]
        assert (other.kind, other.default, other.annotation) == (
            param.kind,
            param.default,
            param.annotation,
        ), name
    assert async_.return_annotation == sync.return_annotation
    # prepare takes every one of them (none left to a default of its own).
    assert set(inspect.signature(prepare).parameters) == set(list(sync.parameters)[1:])
    assert {n: p.default for n, p in sync.parameters.items() if n in DEFAULTS} == DEFAULTS


def test_prepare_builds_the_row_without_the_clock() -> None:
    prepared = prepare(**ARGS, **DEFAULTS)
    assert prepared.params["id"] == prepared.id
    assert prepared.params["payload"] == b"{}"
    assert prepared.params["content_type"] == "application/json"
    assert prepared.wait is None
    assert "created_at" not in prepared.params  # the clock is the database's or write()'s
    keyed = prepare(
        **{**ARGS, **DEFAULTS, "idempotency_key": "k", "delay": 1.5, "headers": {"a": 1}}
    )
    assert keyed.idempotency_key == "k"
    assert keyed.wait == dt.timedelta(seconds=1.5)
    assert keyed.params["headers"] == {"a": 1}
    assert keyed.id != prepared.id


def test_prepare_refuses_before_building_anything() -> None:
    with pytest.raises(outbox.InvalidOption, match="negative"):
        prepare(**{**ARGS, **DEFAULTS, "delay": -1})
    with pytest.raises(outbox.InvalidDestination, match="empty"):
        prepare(**{**ARGS, **DEFAULTS, "exchange": "", "routing_key": ""})


def test_prepare_reads_the_trace_context_of_the_calling_task() -> None:
    """OpenTelemetry keeps the current span in contextvars: a task preparing a message while
    another task is inside a span gets no trace; the task in the span gets its own."""
    tracer = TracerProvider().get_tracer("test")

    async def both() -> tuple[tuple[str, Any], Any]:
        entered, other_done = asyncio.Event(), asyncio.Event()

        async def traced() -> tuple[str, Any]:
            with tracer.start_as_current_span("handler") as span:
                entered.set()
                await other_done.wait()
                context = span.get_span_context()
                ids = f"{context.trace_id:032x}-{context.span_id:016x}"
                return ids, prepare(**ARGS, **DEFAULTS).params["traceparent"]

        async def untraced() -> Any:
            await entered.wait()
            try:
                return prepare(**ARGS, **DEFAULTS).params["traceparent"]
            finally:
                other_done.set()

        traced_result, untraced_result = await asyncio.gather(traced(), untraced())
        return traced_result, untraced_result

    (ids, traceparent), other = asyncio.run(both())
    assert isinstance(traceparent, str)
    assert traceparent[3:-3] == ids  # 00-<trace id>-<span id>-<flags>
    assert other is None


# --------------------------------------------------------------------------- the wrong object


def test_enqueue_given_an_async_session_names_enqueue_async() -> None:
    engine = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(outbox.InvalidSession, match=r"use `await outbox\.enqueue_async\(\.\.\.\)`"):
        enqueue(AsyncSession(engine), **ARGS)  # type: ignore[arg-type]


def test_enqueue_async_given_a_session_names_enqueue() -> None:
    session = Session(create_engine("sqlite://"))
    with pytest.raises(
        outbox.InvalidSession, match=r"use `outbox\.enqueue\(\.\.\.\)` \(no await\)"
    ):
        asyncio.run(enqueue_async(session, **ARGS))  # type: ignore[arg-type]
    with (
        create_engine("sqlite://").connect() as conn,
        pytest.raises(TypeError, match=r"given a sqlalchemy\.Connection, which is synchronous"),
    ):
        asyncio.run(enqueue_async(conn, **ARGS))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("db", "says"),
    [
        (None, "not a NoneType"),
        ("sqlite://", "not a str"),
        (create_engine("sqlite://"), "not a sqlalchemy.Engine (an engine is not a transaction"),
    ],
    ids=["none", "url", "engine"],
)
def test_anything_else_says_what_was_expected(db: object, says: str) -> None:
    with pytest.raises(
        outbox.InvalidSession, match="needs a SQLAlchemy Session or Connection"
    ) as e:
        enqueue(db, **ARGS)  # type: ignore[arg-type]
    assert says in str(e.value)
    with pytest.raises(outbox.InvalidSession, match="needs a SQLAlchemy AsyncSession or Async"):
        asyncio.run(enqueue_async(db, **ARGS))  # type: ignore[arg-type]


def test_the_wrong_object_is_refused_before_the_arguments_are_checked() -> None:
    with pytest.raises(outbox.InvalidSession):
        enqueue(None, **{**ARGS, "delay": -1})  # type: ignore[arg-type]


def test_the_testing_helpers_name_their_other_form() -> None:
    async_session = AsyncSession(create_async_engine("sqlite+aiosqlite://"))
    with pytest.raises(
        outbox.InvalidSession, match=r"await outbox\.testing\.assert_enqueued_async\("
    ):
        testing.assert_enqueued(async_session)  # type: ignore[arg-type]
    with pytest.raises(outbox.InvalidSession, match=r"await outbox\.testing\.enqueued_async\("):
        testing.enqueued(async_session)  # type: ignore[arg-type]
    session = Session(create_engine("sqlite://"))
    with pytest.raises(outbox.InvalidSession, match=r"`outbox\.testing\.assert_not_enqueued\("):
        asyncio.run(testing.assert_not_enqueued_async(session))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- imports

ASYNC_MODULES = """
import json, sys

def async_modules():
    return sorted(
        m for m in sys.modules
        if m.split(".")[0] in ("asyncpg", "aiosqlite", "greenlet") or m == "sqlalchemy.ext.asyncio"
    )

import outbox
outbox.enqueue, outbox.testing.enqueued
before = async_modules()
assert callable(outbox.enqueue_async)
print(json.dumps([before, async_modules()]))
"""


def test_import_outbox_loads_no_async_driver_and_the_async_enqueue_only_on_use() -> None:
    # A fresh interpreter: this test process has long since imported all of them.
    done = subprocess.run(
        [sys.executable, "-c", ASYNC_MODULES],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == []
    assert "sqlalchemy.ext.asyncio" in after
    assert [m for m in after if m.split(".")[0] in ("asyncpg", "aiosqlite")] == []
