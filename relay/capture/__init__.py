"""Logical capture: outbox messages read from a PostgreSQL replication slot in commit order."""
