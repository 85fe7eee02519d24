"""The Django app, `INSTALLED_APPS += ["outbox.django"]`: its migrations make the outbox tables."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig  # type: ignore[import-untyped]
from django.db.models.signals import pre_migrate  # type: ignore[import-untyped]


class OutboxConfig(AppConfig):  # type: ignore[misc]
    name = "outbox.django"
    label = "outbox"  # `manage.py migrate outbox`; "django", the module's own name, would mislead
    verbose_name = "Transactional outbox"

    def ready(self) -> None:
        pre_migrate.connect(_without_migrations, sender=self)


def _without_migrations(sender: AppConfig, using: str, **kwargs: Any) -> None:
    """With the app's migrations turned off (`"TEST": {"MIGRATE": False}`, or
    `MIGRATION_MODULES = {"outbox": None}`), Django would create its tables from the models,
    which only name them (outbox/django/models.py). Make the real ones first, as the migrations
    do: Django then finds them there and leaves them alone."""
    from django.db.migrations.loader import MigrationLoader  # type: ignore[import-untyped]

    from outbox.django.schema import create

    module, _ = MigrationLoader.migrations_module(sender.label)
    if module is None:
        create(using)
