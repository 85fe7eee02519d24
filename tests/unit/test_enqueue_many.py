"""`enqueue_many` checks every item with `enqueue`'s own `prepare` before any SQL, and writes the
list in order: runs without idempotency keys in bulk, each keyed message alone, in its place. No
database needed."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg, PGDialectAsync_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2

import outbox
from outbox import pg_insert
from outbox.async_enqueue import enqueue_many_async
from outbox.enqueue import enqueue
from outbox.many import ARGUMENTS, DEFAULTS, enqueue_many, prepare_many
from outbox.prepared import Prepared, chunks, runs

ARGS: dict[str, Any] = {"exchange": "orders", "routing_key": "order.created", "payload": {}}


def test_an_item_takes_exactly_enqueues_keyword_arguments_with_its_defaults() -> None:
    params = list(inspect.signature(enqueue).parameters.values())[1:]
    assert {p.name for p in params} == ARGUMENTS
    assert {p.name: p.default for p in params if p.default is not p.empty} == DEFAULTS


def test_the_sync_and_async_calls_take_the_same_arguments() -> None:
    sync = inspect.signature(enqueue_many)
    async_ = inspect.signature(enqueue_many_async)
    assert list(sync.parameters) == list(async_.parameters) == ["db", "messages"]
    assert sync.return_annotation == async_.return_annotation
    assert outbox.enqueue_many is enqueue_many
    assert outbox.enqueue_many_async is enqueue_many_async
    assert {"enqueue_many", "enqueue_many_async"} <= set(outbox.__all__)


def test_every_item_is_prepared_as_enqueue_prepares_it() -> None:
    prepared = prepare_many(
        [ARGS, {**ARGS, "payload": "hi", "key": "k", "priority": 3, "headers": {"a": 1}}]
    )
    first, second = prepared
    assert first.params["payload"] == b"{}"
    assert (second.params["payload"], second.params["content_type"]) == (
        b"hi",
        "text/plain; charset=utf-8",
    )
    assert (second.params["key"], second.params["priority"]) == ("k", 3)
    assert second.params["headers"] == {"a": 1}
    assert first.id != second.id


def test_any_iterable_of_mappings_is_taken() -> None:
    def items() -> Iterator[dict[str, Any]]:
        yield ARGS
        yield ARGS

    assert len(prepare_many(items())) == 2
    assert prepare_many([]) == []


@pytest.mark.parametrize(
    ("bad", "error", "says"),
    [
        ({"routing_key": "r", "payload": {}}, outbox.InvalidMessage, "exchange missing"),
        ({"payload": {}}, outbox.InvalidMessage, "exchange, routing_key missing"),
        ({**ARGS, "colour": 1, "size": 2}, outbox.InvalidMessage, "no argument 'colour', 'size'"),
        ({**ARGS, 7: 1}, outbox.InvalidMessage, "no argument 7"),  # type: ignore[misc]
        (["exchange", "x"], outbox.InvalidMessage, "must be a mapping of enqueue's keyword"),
        ({**ARGS, "payload": 1.5}, outbox.PayloadEncodingError, "float"),
        ({**ARGS, "headers": {"h": None}}, outbox.InvalidHeader, "'h'"),
        ({**ARGS, "headers": {"x-outbox-key": "k"}}, outbox.InvalidHeader, "reserved"),
        ({**ARGS, "priority": "high"}, outbox.InvalidOption, "priority"),
        ({**ARGS, "routing_key": None}, outbox.InvalidDestination, "routing_key"),
    ],
)
def test_a_bad_item_raises_enqueues_error_naming_its_index(
    bad: object, error: type[outbox.InvalidMessage], says: str
) -> None:
    with pytest.raises(error) as raised:
        prepare_many([ARGS, ARGS, bad, ARGS])  # type: ignore[list-item]
    assert type(raised.value) is error  # the subclass enqueue raises, not only its parent
    assert str(raised.value).startswith("messages[2]")
    assert says in str(raised.value)


def test_the_first_bad_item_is_the_one_named() -> None:
    with pytest.raises(outbox.InvalidOption, match=r"^messages\[1\]: delay"):
        prepare_many([ARGS, {**ARGS, "delay": -1}, {**ARGS, "priority": "x"}])


@pytest.mark.parametrize("messages", [ARGS, "exchange", b"x", 3, None])
def test_something_other_than_a_list_of_mappings_is_refused(messages: object) -> None:
    with pytest.raises(outbox.InvalidMessage, match="must be a list of mappings"):
        prepare_many(messages)  # type: ignore[arg-type]


def _run_names(prepared: list[Prepared]) -> list[list[object]]:
    names = {one.id: n for n, one in enumerate(prepared)}
    return [[names[one.id] for one in run] for run in runs(prepared, _has_key)]


def _has_key(prepared: Prepared) -> bool:
    return prepared.idempotency_key is not None


def test_keyed_messages_are_written_alone_in_their_place() -> None:
    keyed = {**ARGS, "idempotency_key": "k"}
    prepared = prepare_many([ARGS, ARGS, keyed, ARGS, keyed, keyed, ARGS])
    assert _run_names(prepared) == [[0, 1], [2], [3], [4], [5], [6]]
    assert _run_names(prepare_many([keyed])) == [[0]]
    assert _run_names(prepare_many([ARGS] * 3)) == [[0, 1, 2]]
    assert _run_names([]) == []


@pytest.mark.parametrize(
    ("dialect_class", "placeholder"),
    [
        (PGDialect_psycopg, "%(id)b::uuid[]"),
        (PGDialectAsync_psycopg, "%(id)b::uuid[]"),
        (PGDialect_psycopg2, "%(id)s::uuid[]"),
        (PGDialect_asyncpg, "$1::uuid[]"),
    ],
)
def test_one_statement_takes_a_chunk_in_one_parameter_per_column(
    dialect_class: Any, placeholder: str
) -> None:
    dialect = dialect_class()
    sql = pg_insert._many_sql(dialect)
    assert placeholder in sql
    assert sql.count("[]") == 12  # whatever the number of rows: no driver's limit is near
    assert sql.endswith("WITH ORDINALITY AS m(id, exchange, routing_key, payload, content_type, "
                        "headers, key, priority, max_attempts, traceparent, tracestate, delay, n) "
                        "ORDER BY m.n")  # fmt: skip
    if dialect.paramstyle == "numeric_dollar":
        assert "$12::interval[]" in sql


def test_a_chunks_arrays_hold_what_insert_message_sends_for_each_row() -> None:
    prepared = prepare_many([ARGS, {**ARGS, "headers": {"a": 1}, "delay": 2}])
    arrays = pg_insert._arrays(prepared, text_ids=True)
    for n, one in enumerate(prepared):
        values = pg_insert.driver_values(one)
        assert {name: column[n] for name, column in arrays.items()} == values
    assert pg_insert._arrays(prepared, text_ids=False)["id"] == [one.id for one in prepared]


def test_a_chunk_is_bounded_in_messages_and_in_bytes() -> None:
    small = {**ARGS, "payload": b"x" * 100}
    large = {**ARGS, "payload": b"x" * 5_000}
    prepared = prepare_many([small] * 7 + [large] + [small] * 3)

    def sizes(rows: int, size: int) -> list[int]:
        found = list(chunks(prepared, rows, size))
        assert [one for chunk in found for one in chunk] == prepared  # all, in order
        return [len(chunk) for chunk in found]

    assert sizes(1_000, 1 << 20) == [11]
    assert sizes(3, 1 << 20) == [3, 3, 3, 2]
    assert sizes(1_000, 300) == [3, 3, 1, 1, 3]  # the large message alone
    with_headers = prepare_many([{**small, "headers": {"h": "v" * 200}}] * 2)
    assert [len(c) for c in chunks(with_headers, 1_000, 400)] == [1, 1]
    assert list(chunks([], 10, 10)) == []
