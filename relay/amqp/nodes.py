"""The broker's nodes as pika connection parameters: one per URL of --amqp (the nodes of one
cluster, in the order given), with the TLS options applied to amqps:// ones.

pika connects to one parameters object at a time; the publisher walks this list itself (it
must know which node it uses), and blocking connections take the list as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import pika

from relay.amqp.tls import TlsOptions
from relay.core.urls import node_name, redact, split_urls


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
