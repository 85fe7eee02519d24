"""Schema 7: outbox_message.suspect, the crash suspects' own column, made as `outbox-relay migrate`
makes it (the same upgrade, which also gives the rows relays left as suspects their mark).
Reversing it changes nothing: a rollback changes the relays, not the schema
(docs/operations/upgrading.md)."""

from __future__ import annotations

from django.db import migrations  # type: ignore[import-untyped]

from outbox.django.schema import upgrade


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("outbox", "0001_outbox_schema")]
    operations = [migrations.RunPython(upgrade, migrations.RunPython.noop, elidable=False)]
