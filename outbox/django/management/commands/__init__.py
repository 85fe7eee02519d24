"""manage.py commands of the outbox app: `outbox_consume`."""
