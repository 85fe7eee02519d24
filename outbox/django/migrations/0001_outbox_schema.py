"""The outbox tables, made by the relay's own migration code on Django's connection: the schema is
the one `outbox-relay migrate` makes and `outbox-relay migrate --check` accepts, its version
recorded. A later outbox version adds a migration that runs the same upgrade again (it closes every
gap between the tables and that version), so `manage.py migrate` keeps them current."""

from __future__ import annotations

from django.db import migrations  # type: ignore[import-untyped]

from outbox.django.schema import drop, upgrade


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(upgrade, drop, elidable=False)]
