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


class PermissionDenied(RelayError):
    """The database role lacks a privilege a statement needs (SQLSTATE 42501); `outbox-relay
    grants` prints what each role needs."""


class MigrationDenied(RelayError):
    """The database role may not create or change the outbox tables; the message names the
    missing privilege."""


# What pika's connection errors mean, in the words an operator needs (first match wins). pika
# hands the publisher its errors as text such as "AMQPConnectionWorkflowFailed: 1 exceptions in
# all; last exception - ConnectionRefusedError(111, ...); first exception - None".
_BROKER_MEANINGS = (
    ("ConnectionRefusedError", "connection refused: is RabbitMQ running and listening there?"),
    ("gaierror", "the host name does not resolve: check the host in --amqp"),
    ("ACCESS_REFUSED", "login refused: check the user name and password in --amqp"),
    ("vhost", "the virtual host does not exist or this user may not use it: check the path "
              "in --amqp (%2F is the default vhost)"),
    ("Timeout", "timed out: is the host right, and is a firewall dropping the connection?"),
    ("timed out", "timed out: is the host right, and is a firewall dropping the connection?"),
    ("SSL", "the TLS handshake failed: check amqps:// and the port (5671 for TLS)"),
    ("IncompatibleProtocolError", "the server there does not speak AMQP 0-9-1: check the port"),
    ("StreamLostError", "the connection was closed during the handshake: check the port and "
                        "whether the server expects TLS"),
)  # fmt: skip


def plain_broker_error(text: str) -> str:
    """A broker connection error as an operator reads it: what failed, then what it means,
    instead of pika's "1 exceptions in all; last exception - ...; first exception - None"."""
    head, sep, detail = text.partition(": connection failed: ")
    for marker, meaning in _BROKER_MEANINGS:
        if marker in (detail if sep else text):
            return f"{head}: {meaning}" if sep else f"{text.split(': ')[0]}: {meaning}"
    return text
