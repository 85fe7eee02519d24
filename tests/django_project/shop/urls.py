"""One endpoint: POST /orders."""

from __future__ import annotations

from django.urls import path  # type: ignore[import-untyped]

from . import views

urlpatterns = [path("orders", views.place_order)]
