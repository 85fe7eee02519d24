"""The outbox tables as Django models, so that Django knows them: `manage.py flush`, and
`TransactionTestCase` after each test, empty every table of a model Django manages, and no other.

The tables themselves are made and upgraded by the app's migrations, with the relay's own code
(outbox/django/schema.py); these models only name them (migration 0003 adds them to Django's
state, and changes nothing in the database). Each declares its table's primary key and nothing
more: query the tables with the outbox's helpers (`outbox.django.enqueued`, `outbox-relay
messages`), not through these models.

`outbox_schema_version` is left out on purpose: like `django_migrations`, it records what the
migrations did, and a flush must keep it (the relay checks it before it starts).
"""

from __future__ import annotations

from django.db import models  # type: ignore[import-untyped]


class OutboxMessage(models.Model):  # type: ignore[misc]
    seq = models.BigAutoField(primary_key=True)

    class Meta:
        db_table = "outbox_message"
        default_permissions = ()  # never edited through Django's admin


class OutboxAttempt(models.Model):  # type: ignore[misc]
    id = models.BigAutoField(primary_key=True)

    class Meta:
        db_table = "outbox_attempt"
        default_permissions = ()


class OutboxResource(models.Model):  # type: ignore[misc]
    resource = models.CharField(max_length=1024, primary_key=True)

    class Meta:
        db_table = "outbox_resource"
        default_permissions = ()


class OutboxRelay(models.Model):  # type: ignore[misc]
    relay_id = models.CharField(max_length=255, primary_key=True)

    class Meta:
        db_table = "outbox_relay"
        default_permissions = ()


class OutboxInbox(models.Model):  # type: ignore[misc]
    # The table's key is (consumer, message_id); Django before 5.2 takes a one-column key, and
    # a flush needs only the table's name.
    consumer = models.CharField(max_length=255, primary_key=True)

    class Meta:
        db_table = "outbox_inbox"
        default_permissions = ()
