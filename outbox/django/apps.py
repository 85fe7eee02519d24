"""The Django app, `INSTALLED_APPS += ["outbox.django"]`: its migrations make the outbox tables."""

from __future__ import annotations

from django.apps import AppConfig  # type: ignore[import-untyped]


class OutboxConfig(AppConfig):  # type: ignore[misc]
    name = "outbox.django"
    label = "outbox"  # `manage.py migrate outbox`; "django", the module's own name, would mislead
    verbose_name = "Transactional outbox"
