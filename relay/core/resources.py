"""Resource names: what fails together, and so shares a circuit breaker and a rate limit.

A name is the broker endpoint and vhost, then the row's part for the chosen scope:

    broker       127.0.0.1:5672/%2F                    every destination on that broker
    exchange     127.0.0.1:5672/%2F/orders             the default
    routing_key  127.0.0.1:5672/%2F/orders/order.paid  each exchange and routing key

A cluster (several URLs) is named by its nodes, sorted: `a:5672,b:5672/%2F/orders`. Relays on
one database that publish to different brokers get different names, so their circuits never mix.
Every relay of one deployment must use the same scope.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from relay.core.urls import split_urls

# The scopes, coarsest first. The store turns each into the SQL expression of a row's part.
SCOPES: tuple[str, ...] = ("broker", "exchange", "routing_key")


def broker_id(amqp_url: str) -> str:
    """host:port/vhost of an AMQP URL, without credentials (the vhost percent-encoded).

    A cluster's nodes (a comma-separated list, one vhost) are named together, sorted: relays
    that list the same nodes in another order still share their circuits. The URL was
    validated with the configuration; this only takes it apart."""
    urls = split_urls(amqp_url)
    nodes = sorted({_endpoint(urllib.parse.urlsplit(url)) for url in urls})
    path = urllib.parse.urlsplit(urls[0]).path
    path = path[1:] if path.startswith("/") else path
    vhost = urllib.parse.unquote(path) if path else "/"
    return f"{','.join(nodes)}/{urllib.parse.quote(vhost, safe='')}"


def _endpoint(parts: urllib.parse.SplitResult) -> str:
    host = (parts.hostname or "").lower()
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    return f"{host}:{port}"


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
