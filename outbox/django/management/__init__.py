"""manage.py commands of the outbox app."""
