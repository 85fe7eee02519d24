"""The shop's models: orders it takes, and the invoices its billing consumer writes."""

from __future__ import annotations

from django.db import models  # type: ignore[import-untyped]


class Order(models.Model):  # type: ignore[misc]
    total = models.IntegerField()
    note = models.CharField(max_length=100, blank=True)


class Invoice(models.Model):  # type: ignore[misc]
    # Not unique on purpose: the tests count invoices per order, so a message handled twice
    # would show as two rows rather than as a constraint error.
    order_id = models.IntegerField()
    total = models.IntegerField()
