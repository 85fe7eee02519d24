"""The shop's one model."""

from __future__ import annotations

from django.db import models  # type: ignore[import-untyped]


class Order(models.Model):  # type: ignore[misc]
    total = models.IntegerField()
    note = models.CharField(max_length=100, blank=True)
