# mypy: disable-error-code="import-untyped,misc"
"""Run by `manage.py test shop`: what a `TestCase` hides, what a `TransactionTestCase` leaves
behind (nothing: the outbox tables are flushed after each test), and Django's error for an
enqueue in a block whose query failed (docs/guides/django.md shows CommittedMessages)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, InternalError, connection, transaction
from django.test import TestCase, TransactionTestCase

import outbox.django


class CommittedMessages(TransactionTestCase):
    # Each test commits, and Django empties every table after it, the outbox's included: the
    # second test (they run in name order) finds neither the first one's message nor its id.
    def test_1_an_order_commits_its_message_and_an_inbox_row(self) -> None:
        self.client.post("/orders", {"total": 5}, content_type="application/json")
        outbox.django.assert_enqueued(routing_key="order.created", count=1)
        with transaction.atomic():
            assert outbox.django.process_once(consumer="billing", message_id="m-1")

    def test_2_the_next_test_starts_from_empty_tables(self) -> None:
        outbox.django.assert_not_enqueued()
        with transaction.atomic():
            assert outbox.django.process_once(consumer="billing", message_id="m-1")


class WhatATestCaseHides(TestCase):
    def test_an_enqueue_outside_atomic_passes_inside_the_tests_transaction(self) -> None:
        # Refused in production (NotInTransaction): here the test's own transaction is open.
        outbox.django.enqueue(exchange="orders", routing_key="lone", payload={})
        outbox.django.assert_enqueued(routing_key="lone", count=1)


class ABrokenBlock(TestCase):
    def test_an_enqueue_after_a_failed_query_raises_djangos_error(self) -> None:
        def enqueue_after_a_failed_query() -> None:
            with transaction.atomic():
                try:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT * FROM no_such_table")
                except DatabaseError:
                    pass  # caught without a savepoint of its own
                outbox.django.enqueue(exchange="orders", routing_key="after", payload={})

        if connection.vendor != "postgresql":  # only PostgreSQL aborts the block
            enqueue_after_a_failed_query()
            outbox.django.assert_enqueued(routing_key="after", count=1)
            return
        with pytest.raises(InternalError) as caught:
            enqueue_after_a_failed_query()
        message = str(caught.value)
        assert message.startswith("outbox.django.enqueue: current transaction is aborted")
        assert "transaction.atomic()" in message
        assert type(caught.value.__cause__).__module__ == "sqlalchemy.exc"
        outbox.django.assert_not_enqueued()


class ManyAtOnce(TestCase):
    def test_enqueue_many_writes_all_in_order_or_none(self) -> None:
        orders: list[dict[str, object]] = [
            {"exchange": "orders", "routing_key": "order.imported", "payload": {"n": n},
             "key": "import"}
            for n in range(3)
        ]  # fmt: skip
        with transaction.atomic():
            ids = outbox.django.enqueue_many(orders)
        found = outbox.django.enqueued(routing_key="order.imported")
        assert [m.id for m in found] == ids
        assert [m.payload for m in found] == [{"n": 0}, {"n": 1}, {"n": 2}]
        bad: list[dict[str, object]] = [orders[0], {"exchange": "orders"}]
        with pytest.raises(outbox.InvalidMessage, match=r"messages\[1\]"), transaction.atomic():
            outbox.django.enqueue_many(bad)
        outbox.django.assert_enqueued(routing_key="order.imported", count=3)
