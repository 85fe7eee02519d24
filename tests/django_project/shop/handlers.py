# mypy: disable-error-code="import-untyped"
"""The billing consumer's handler: `manage.py outbox_consume billing --handler
shop.handlers.bill` (docs/guides/django.md shows this module from its imports down)."""

from __future__ import annotations

import outbox

from .models import Invoice


class Flaky(Exception):
    """A failure after the handler's write: the write rolls back with the inbox row."""


def bill(message: outbox.Message) -> None:
    order = message.json()
    Invoice.objects.create(order_id=order["id"], total=order["total"])
    if order.get("fail_first") and message.attempt == 1:
        raise Flaky("failed after its write")  # retried: the invoice is written once
