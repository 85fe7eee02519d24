"""The Order table."""

from __future__ import annotations

from django.db import migrations, models  # type: ignore[import-untyped]


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    dependencies = [("outbox", "0001_outbox_schema")]
    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("total", models.IntegerField()),
                ("note", models.CharField(blank=True, max_length=100)),
            ],
        ),
    ]
