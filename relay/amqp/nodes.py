"""The broker's nodes as pika connection parameters: one per URL of --amqp (the nodes of one
cluster, in the order given), with the TLS options applied to amqps:// ones.

pika connects to one parameters object at a time; the publisher walks this list itself (it
must know which node it uses; `Rounds` says which is next, and how soon), and blocking
connections take the list as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pika

from relay.amqp.tls import TlsOptions
from relay.core.urls import node_name, redact, split_urls
from relay.errors import plain_broker_error
from relay.reconnect import Backoff

# The first round's wait is at most this; each failed round doubles it up to the cap.
FIRST_WAIT = 0.1
# The shortest wait between rounds: never a busy loop against a node that refuses at once.
MIN_WAIT = 0.05


@dataclass(frozen=True, slots=True)
class Node:
    name: str  # host:port, as logs and /readyz show it
    url: str  # the URL, password masked
    params: pika.URLParameters


def broker_nodes(amqp_url: str, tls: TlsOptions | None = None) -> list[Node]:
    """One Node per URL of `amqp_url` (validated by the configuration), in order."""
    options = ssl_options(tls)
    nodes = []
    for url in split_urls(amqp_url):
        params = pika.URLParameters(url)
        if options is not None and params.ssl_options is not None:
            params.ssl_options = options
        nodes.append(Node(node_name(url), redact(url), params))
    return nodes


def ssl_options(tls: TlsOptions | None) -> pika.SSLOptions | None:
    """pika's TLS settings for amqps:// nodes, or None when no TLS option is given (pika's
    default then: the system's CAs, each URL's host checked). One context for every node:
    a cluster's nodes share a CA, and the server name when one is given."""
    if tls is None or not tls.given:
        return None
    return pika.SSLOptions(tls.context(), tls.server_name)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed connect or a lost connection, and where it leads."""

    node: Node  # the node that failed
    round_over: bool  # every node failed since the last connection: back off before the next
    next_node: str | None  # the node tried next, when there are several


class Rounds:
    """Which node to connect to: after a failure, the next one in order at once (another node of
    the cluster may answer); once every node failed since the last connection, the round is
    over, and the next one begins after a backoff (relay/reconnect.py)."""

    def __init__(self, nodes: list[Node], reconnect_max: float) -> None:
        self.nodes = nodes
        self._index = 0  # the node connected to, or being tried
        self._tried = 0  # nodes of this round that failed; every one failed: back off
        cap = max(MIN_WAIT, reconnect_max)
        self._backoff = Backoff(first=min(FIRST_WAIT, cap), cap=cap, floor=MIN_WAIT)

    @property
    def current(self) -> Node:
        """The node connected to, or being tried."""
        return self.nodes[self._index]

    def connected(self) -> None:
        """The current node answered: the next failure starts a new round, with no backoff."""
        self._backoff.succeeded()
        self._tried = 0

    @property
    def attempt(self) -> int:
        """Rounds that failed since the last connection."""
        return self._backoff.attempt

    def failed(self) -> Failure:
        """The current node failed: move on to the next."""
        failed = self.nodes[self._index]
        self._index = (self._index + 1) % len(self.nodes)
        self._tried += 1
        round_over = self._tried >= len(self.nodes)
        if round_over:
            self._tried = 0
        next_node = self.current.name if len(self.nodes) > 1 else None
        return Failure(failed, round_over, next_node)

    def backoff(self, failure: Failure) -> float:
        """Seconds to wait before trying the next node: none within a round; after a whole
        round, a window doubling with each round that failed up to the cap, with full jitter so
        that several relays losing the same broker do not reconnect in lockstep."""
        if not failure.round_over:
            return 0.0
        return self._backoff.failed()


def lost_fields(
    node: Node, why: str, retry_in: float, next_node: str | None, attempt: int = 0
) -> dict[str, Any]:
    """broker.lost's fields: the node, why, which node is tried next, how soon, and how many
    rounds have failed since the last connection."""
    fields: dict[str, Any] = {"node": node.name, "broker": node.url, "error": why}
    if next_node is not None:
        fields["next"] = next_node
    fields["retry_in"] = round(retry_in, 3)
    fields["attempt"] = attempt
    return fields


def plain(node: Node, why: str) -> str:
    """`node: why` in an operator's words (relay.errors), without pika's "connection failed:"
    prefix, so that only the last node's error is left for plain_broker_error to read."""
    return plain_broker_error(f"{node.name}: {why}").replace(": connection failed: ", ": ", 1)
