"""The one exception root of the relay, and the errors the CLI turns into exit codes."""

from __future__ import annotations


class RelayError(Exception):
    """The relay failed."""


class ConfigError(RelayError):
    """The configuration is invalid (bad flag, URL or environment variable); exit code 2."""


class DatabaseUnavailable(RelayError):
    """The database cannot be reached."""


class BrokerUnavailable(RelayError):
    """The broker cannot be reached."""


class SchemaNotFound(RelayError):
    """The outbox tables do not exist in this database."""
