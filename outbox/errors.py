"""The one exception root of the `outbox` package and its subclasses.

Every invalid `enqueue` call raises one of these *before* anything is written, so a caller can
catch `OutboxError` and know the transaction holds no half-written message.
"""

from __future__ import annotations


class OutboxError(Exception):
    """Something went wrong in the outbox: the root of every error the `outbox` package raises.

    Errors of the database driver that are not about the outbox (a lost connection, a
    constraint of your own) reach the caller as SQLAlchemy raised them.
    """


class InvalidMessage(OutboxError, ValueError):
    """The message given to enqueue is not valid; nothing was written."""


class PayloadEncodingError(InvalidMessage):
    """The payload cannot be encoded to bytes."""


class PayloadTooLarge(InvalidMessage):
    """The encoded payload is larger than the configured limit."""


class PayloadTooDeep(PayloadEncodingError):
    """The JSON payload is nested deeper than the configured limit."""


class InvalidHeader(InvalidMessage):
    """A header name or value is not allowed."""


class HeadersTooLarge(InvalidHeader):
    """The headers encode to more AMQP bytes than the configured limit."""


class InvalidDestination(InvalidMessage):
    """The exchange or routing key cannot be published to."""


class InvalidOption(InvalidMessage):
    """An enqueue option (delay, priority, key, max_attempts, ...) is out of range."""


class IdempotencyConflict(OutboxError):
    """Another transaction holds the same idempotency key and its row is not visible to this one."""


class SchemaMissing(OutboxError):
    """The outbox tables do not exist: run `outbox-relay migrate` or `outbox.create_schema()`."""


class InvalidSession(OutboxError, TypeError):
    """The object given to write with is not a SQLAlchemy session or connection this call takes."""


class NotInTransaction(OutboxError):
    """The connection is in autocommit mode outside any transaction: a message written on it would
    commit alone, whatever became of the business transaction."""


class UnsupportedDatabase(OutboxError):
    """The database is not one the outbox runs on (PostgreSQL, MySQL/MariaDB, SQLite)."""


class SchemaConflict(OutboxError):
    """The database has an outbox table that `migrate` cannot complete."""


class CaptureNotSetUp(OutboxError):
    """Logical capture is on, and the database has no replication slot for the relay: PostgreSQL
    would keep the messages for no one, and they would be lost. Nothing was written. Create the
    slot (`outbox-relay capture setup`), or enqueue into the table (`OUTBOX_CAPTURE=table`)."""
