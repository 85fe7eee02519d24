"""`manage.py place_orders`: three orders through the view (one with a note, one without, one
refused) and an enqueue outside any atomic block; prints what happened as JSON."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand  # type: ignore[import-untyped]
from django.test import Client  # type: ignore[import-untyped]

import outbox
import outbox.django


class Command(BaseCommand):  # type: ignore[misc]
    def handle(self, *args: Any, **options: Any) -> None:
        client = Client()
        placed = []
        for order in ({"total": 5, "note": "gift"}, {"total": 7}, {"total": -1}):
            response = client.post("/orders", order, content_type="application/json")
            placed.append([response.status_code, response.json()])
        try:
            outbox.django.enqueue(exchange="orders", routing_key="lone", payload={})
            refused = ""
        except outbox.NotInTransaction as exc:
            refused = str(exc)
        self.stdout.write(json.dumps({"placed": placed, "refused": refused}))
