"""Resource names: what fails together, and so shares a circuit breaker and a rate limit.

A name is the broker endpoint and vhost, then the row's part for the chosen scope:

    broker       127.0.0.1:5672/%2F                    every destination on that broker
    exchange     127.0.0.1:5672/%2F/orders             the default
    routing_key  127.0.0.1:5672/%2F/orders/order.paid  each exchange and routing key

Relays on one database that publish to different brokers get different names, so their
circuits never mix. Every relay of one deployment must use the same scope.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

# The scopes, coarsest first. The store turns each into the SQL expression of a row's part.
SCOPES: tuple[str, ...] = ("broker", "exchange", "routing_key")


def broker_id(amqp_url: str) -> str:
    """host:port/vhost of an AMQP URL, without credentials (the vhost percent-encoded).

    The URL was validated with the configuration; this only takes it apart."""
    parts = urllib.parse.urlsplit(amqp_url)
    host = (parts.hostname or "").lower()
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    vhost = urllib.parse.unquote(path) if path else "/"
    return f"{host}:{port}/{urllib.parse.quote(vhost, safe='')}"


@dataclass(frozen=True, slots=True)
class Naming:
    broker: str  # broker_id()
    scope: str = "exchange"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"unknown resource scope {self.scope!r}")

    def part(self, exchange: str, routing_key: str) -> str:
        """The row's part, as the claim statement's resource expression computes it."""
        if self.scope == "broker":
            return ""
        if self.scope == "exchange":
            return exchange
        return f"{exchange}/{routing_key}"

    def name(self, part: str) -> str:
        return self.broker if self.scope == "broker" else f"{self.broker}/{part}"

    def part_of(self, name: str) -> str | None:
        """The part of a full name, or None when the name belongs to another broker or scope."""
        if self.scope == "broker":
            return "" if name == self.broker else None
        prefix = self.broker + "/"
        if not name.startswith(prefix):
            return None
        return name[len(prefix) :]
