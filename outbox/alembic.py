"""Alembic and the outbox tables, for an application whose own schema Alembic manages.

Either Alembic owns the outbox tables too: list `outbox.metadata` in `target_metadata`, and
autogenerate creates them (then upgrades them when a new version of `outbox` changes them); call
`apply_storage_settings(op)` in the migration that creates them. Or `outbox-relay migrate` owns
them: pass `include_object` (or `excluding_outbox(your_filter)`) to `context.configure`, and
autogenerate leaves them alone instead of proposing to drop them. The documentation's Alembic
guide (docs/guides/alembic.md) has both env.py files.

Nothing here imports Alembic: it is the application's dependency, not the outbox's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from outbox.migrate import storage_settings_sql, suspect_marks
from outbox.schema import metadata

if TYPE_CHECKING:
    from alembic.operations import Operations

# Alembic's include_object hook: (object, name, type_, reflected, compare_to) -> include it?
IncludeObject = Callable[[Any, str | None, str, bool, Any | None], bool]

TABLES: frozenset[str] = frozenset(metadata.tables)


def is_outbox_object(obj: Any, name: str | None, type_: str) -> bool:
    """Whether an object autogenerate compares is an outbox table or part of one (a column,
    index or constraint), whether it was reflected from the database or read from metadata."""
    if type_ == "table":
        return name in TABLES
    table = getattr(obj, "table", None)  # what a column, index or constraint belongs to
    return getattr(table, "name", None) in TABLES


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any | None
) -> bool:
    """`context.configure(include_object=...)`: autogenerate ignores the outbox tables, so an
    env.py listing only the application's models does not propose to drop them."""
    return not is_outbox_object(obj, name, type_)


def excluding_outbox(include: IncludeObject | None = None) -> IncludeObject:
    """`include_object` composed with the application's own filter, which decides the rest."""

    def hook(
        obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any | None
    ) -> bool:
        if is_outbox_object(obj, name, type_):
            return False
        return include is None or include(obj, name, type_, reflected, compare_to)

    return hook


def apply_storage_settings(op: Operations) -> None:
    """In an Alembic migration: give the outbox tables the autovacuum settings
    `outbox-relay migrate` gives them (PostgreSQL; nothing on other databases). Works offline
    (`alembic upgrade --sql`) too: the statements are emitted, not run here."""
    for statement in storage_settings_sql(op.get_context().dialect.name):
        op.execute(statement)


def mark_suspects(op: Operations) -> None:
    """In the Alembic migration that adds `outbox_message.suspect` (schema 7): give the rows
    that relays of schema 6 left as suspects, or in flight as such, their mark, as
    `outbox-relay migrate` does when it adds the column. Run it right after the column is added;
    it also works offline (`alembic upgrade --sql`)."""
    for statement in suspect_marks():
        op.execute(statement)
