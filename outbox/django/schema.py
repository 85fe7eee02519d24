"""The outbox schema on a Django database, for the app's migrations (RunPython functions)."""

from __future__ import annotations

from typing import Any

from django.db import connections, router, transaction  # type: ignore[import-untyped]

from outbox import migrate, schema
from outbox.django.connection import lent


def upgrade(apps: Any, schema_editor: Any) -> None:
    """Create or upgrade the outbox tables as `outbox-relay migrate` does, recording the
    version. In the migration's transaction where the database has transactional DDL
    (PostgreSQL, SQLite); statement by statement on MySQL and MariaDB, as any migration there.
    A database the project's routers keep the app out of is left alone."""
    if router.allow_migrate(schema_editor.connection.alias, "outbox"):
        with lent(schema_editor.connection) as conn:
            migrate.upgrade(conn)


def drop(apps: Any, schema_editor: Any) -> None:
    """`manage.py migrate outbox zero`: drop the outbox tables, and the messages in them."""
    if router.allow_migrate(schema_editor.connection.alias, "outbox"):
        with lent(schema_editor.connection) as conn:
            schema.metadata.drop_all(conn)


def create(using: str) -> None:
    """`upgrade` on the `using` database outside any migration (see outbox/django/apps.py): in
    a transaction of its own where the database has transactional DDL."""
    if router.allow_migrate(using, "outbox"):
        with transaction.atomic(using=using), lent(connections[using]) as conn:
            migrate.upgrade(conn)
