"""The Invoice table, which the billing consumer writes (shop/handlers.py)."""

from __future__ import annotations

from django.db import migrations, models  # type: ignore[import-untyped]


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("shop", "0001_initial")]
    operations = [
        migrations.CreateModel(
            name="Invoice",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("order_id", models.IntegerField()),
                ("total", models.IntegerField()),
            ],
        ),
    ]
