"""The outbox tables as models in Django's state (outbox/django/models.py), so that `manage.py
flush` and `TransactionTestCase` empty them. State only: the tables are the ones 0001 and 0002
made, and this migration changes nothing in the database, either way."""

from __future__ import annotations

from django.db import migrations, models  # type: ignore[import-untyped]


def _table(name: str, table: str, key: str, field: models.Field) -> migrations.CreateModel:
    return migrations.CreateModel(
        name=name,
        fields=[(key, field)],
        options={"db_table": table, "default_permissions": ()},
    )


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("outbox", "0002_outbox_schema_7")]
    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                _table(
                    "OutboxMessage",
                    "outbox_message",
                    "seq",
                    models.BigAutoField(primary_key=True, serialize=False),
                ),
                _table(
                    "OutboxAttempt",
                    "outbox_attempt",
                    "id",
                    models.BigAutoField(primary_key=True, serialize=False),
                ),
                _table(
                    "OutboxResource",
                    "outbox_resource",
                    "resource",
                    models.CharField(max_length=1024, primary_key=True, serialize=False),
                ),
                _table(
                    "OutboxRelay",
                    "outbox_relay",
                    "relay_id",
                    models.CharField(max_length=255, primary_key=True, serialize=False),
                ),
                _table(
                    "OutboxInbox",
                    "outbox_inbox",
                    "consumer",
                    models.CharField(max_length=255, primary_key=True, serialize=False),
                ),
            ],
            database_operations=[],
        )
    ]
