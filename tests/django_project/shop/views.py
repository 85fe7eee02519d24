"""Placing an order saves it and announces it in one atomic block."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction  # type: ignore[import-untyped]
from django.http import JsonResponse  # type: ignore[import-untyped]
from django.views.decorators.csrf import csrf_exempt  # type: ignore[import-untyped]

import outbox.django

from .models import Order


class Refused(Exception):
    """An order the shop does not take: its block rolls back, the order and its message with it."""


@csrf_exempt  # type: ignore[untyped-decorator]
def place_order(request: Any) -> Any:
    body = json.loads(request.body)
    exchange = body.get("exchange", "orders")
    try:
        with transaction.atomic():
            order = Order.objects.create(total=body["total"], note=body.get("note", ""))
            outbox.django.enqueue(
                exchange=exchange,
                routing_key="order.created",
                payload={"id": order.id, "total": order.total},
                key=str(order.id),
            )
            try:
                with transaction.atomic():  # a savepoint: the note is announced only if given
                    outbox.django.enqueue(
                        exchange=exchange, routing_key="order.noted", payload={"id": order.id}
                    )
                    if not order.note:
                        raise ValueError("no note")
            except ValueError:
                pass
            if order.total < 0:
                raise Refused
    except Refused:
        return JsonResponse({"error": "refused"}, status=400)
    return JsonResponse({"id": order.id}, status=201)
