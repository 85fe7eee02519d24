# mypy: disable-error-code="import-untyped,misc"
"""Run by `manage.py test shop` on the test database Django builds from the migrations
(docs/guides/django.md shows this module from its imports down)."""

from __future__ import annotations

from django.db import transaction
from django.test import TestCase

import outbox.django


class PlacingOrders(TestCase):
    def test_an_order_is_announced_with_its_note(self) -> None:
        response = self.client.post(
            "/orders", {"total": 5, "note": "gift"}, content_type="application/json"
        )
        order_id = response.json()["id"]
        outbox.django.assert_enqueued(
            routing_key="order.created", payload={"id": order_id, "total": 5}, key=str(order_id)
        )
        outbox.django.assert_enqueued(routing_key="order.noted", count=1)

    def test_a_rolled_back_savepoint_drops_only_its_message(self) -> None:
        self.client.post("/orders", {"total": 7}, content_type="application/json")
        outbox.django.assert_enqueued(routing_key="order.created", count=1)
        outbox.django.assert_not_enqueued(routing_key="order.noted")

    def test_a_refused_order_announces_nothing(self) -> None:
        response = self.client.post("/orders", {"total": -1}, content_type="application/json")
        assert response.status_code == 400
        assert outbox.django.enqueued() == []

    def test_the_inbox_takes_a_message_once(self) -> None:
        with transaction.atomic():
            assert outbox.django.process_once(consumer="billing", message_id="m-1")
            assert not outbox.django.process_once(consumer="billing", message_id="m-1")
