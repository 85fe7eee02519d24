# mypy: disable-error-code="import-untyped,untyped-decorator"
"""Placing an order saves it and announces it in one atomic block (docs/guides/django.md shows
this module from its imports down)."""

from __future__ import annotations

import json

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

import outbox.django

from .models import Order


class Refused(Exception):
    """An order the shop does not take: its block rolls back, and the order's message with it."""


@csrf_exempt
def place_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(total=body["total"], note=body.get("note", ""))
            outbox.django.enqueue(
                exchange=settings.ORDERS_EXCHANGE,
                routing_key="order.created",
                payload={"id": order.id, "total": order.total},
                key=str(order.id),
            )
            try:
                with transaction.atomic():  # a savepoint: the note is announced only if given
                    outbox.django.enqueue(
                        exchange=settings.ORDERS_EXCHANGE,
                        routing_key="order.noted",
                        payload={"id": order.id},
                    )
                    if not order.note:
                        raise ValueError("no note")  # rolls back to the savepoint, and only it
            except ValueError:
                pass
            if order.total < 0:
                raise Refused  # rolls the whole block back: the order and both messages
    except Refused:
        return JsonResponse({"error": "refused"}, status=400)
    return JsonResponse({"id": order.id}, status=201)
