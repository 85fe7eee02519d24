"""Declaring a topology (relay/core/topology.py) on the broker, and checking it is there.

`apply` runs the plan's declarations in order (each is idempotent, so applying twice changes
nothing). `check` changes nothing: a passive declare says whether each exchange and queue
exists; for one that does, the same declaration made again is compared by the broker itself,
which refuses one with other arguments (PRECONDITION_FAILED, naming the argument) and otherwise
leaves it as it is. Bindings are not visible over AMQP: `check` says so rather than guess.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika
from pika.exceptions import AMQPError, ChannelClosedByBroker, ConnectionClosedByBroker

from relay.amqp.connect_errors import tls_problem
from relay.amqp.nodes import broker_nodes
from relay.amqp.tls import TlsOptions
from relay.core.topology import (
    Bind,
    Binding,
    Declaration,
    DeclareExchange,
    DeclareQueue,
    Exchange,
    Queue,
    Topology,
    plan,
)
from relay.core.urls import redact
from relay.errors import BrokerUnavailable, RelayError

PLUGIN = "rabbitmq_consistent_hash_exchange"
_NOT_FOUND, _PRECONDITION_FAILED, _COMMAND_INVALID = 404, 406, 503


class TopologyRefused(RelayError):
    """The broker refused a declaration; the message names the object and why."""


@dataclass(frozen=True, slots=True)
class CheckReport:
    problems: list[str]  # one line per object missing or declared differently
    checked: int  # exchanges and queues compared
    unchecked_bindings: int  # bindings AMQP cannot show


def _connect(amqp_url: str, tls: TlsOptions | None) -> Any:
    nodes = broker_nodes(amqp_url, tls)
    for node in nodes:
        node.params.socket_timeout = 3
        node.params.connection_attempts = 1
    try:
        # pika tries the nodes in order.
        return pika.BlockingConnection([node.params for node in nodes])
    except AMQPError as exc:
        problem = tls_problem(exc)
        if problem is not None:
            raise BrokerUnavailable(
                f"cannot reach RabbitMQ at {redact(amqp_url)}: {problem}"
            ) from None
        raise BrokerUnavailable(
            f"cannot reach RabbitMQ at {redact(amqp_url)} ({type(exc).__name__}); start one with "
            "`docker compose up -d rabbitmq` (or `rabbitmq-server -detached`), or pass --amqp URL"
        ) from None


def _declare(channel: Any, d: Declaration, *, passive: bool = False) -> None:
    if isinstance(d, DeclareExchange):
        x = d.exchange
        channel.exchange_declare(
            x.name, x.type, passive=passive, durable=x.durable, auto_delete=x.auto_delete,
            arguments=dict(x.arguments),
        )  # fmt: skip
    elif isinstance(d, DeclareQueue):
        if passive:
            channel.queue_declare(d.name, passive=True)
        else:
            channel.queue_declare(
                d.name, durable=d.durable, auto_delete=d.auto_delete, arguments=dict(d.arguments)
            )
    elif d.to_exchange:
        channel.exchange_bind(d.destination, d.source, d.routing_key, dict(d.arguments))
    else:
        channel.queue_bind(d.destination, d.source, d.routing_key, dict(d.arguments))


def _refusal(d: Declaration, exc: ChannelClosedByBroker | ConnectionClosedByBroker) -> str:
    """What the broker's refusal means for `d`, in one line."""
    text = exc.reply_text
    if exc.reply_code == _PRECONDITION_FAILED:
        return f"{d} exists on the broker with other settings: {text}"
    if exc.reply_code == _NOT_FOUND and isinstance(d, Bind):
        return f"{d}: {text} (declare it in [[exchanges]], or apply its own topology first)"
    if exc.reply_code == _COMMAND_INVALID and "x-consistent-hash" in text:
        return (
            f"{d}: the broker has no consistent-hash exchange type; partitions need its plugin: "
            f"rabbitmq-plugins enable {PLUGIN}"
        )
    return f"{d}: refused by the broker: {exc.reply_code} {text}"


def _lost(amqp_url: str, exc: AMQPError) -> BrokerUnavailable:
    return BrokerUnavailable(
        f"lost the connection to RabbitMQ at {redact(amqp_url)} while declaring "
        f"({type(exc).__name__}); applying again declares what is missing"
    )


def apply(
    amqp_url: str,
    topology: Topology,
    *,
    tls: TlsOptions | None = None,
    done: Callable[[Declaration], None] | None = None,
) -> int:
    """Declare everything `topology` describes, in order; return how many declarations were
    made. TopologyRefused at the first the broker refuses (nothing after it is declared)."""
    declarations = plan(topology)
    conn = _connect(amqp_url, tls)
    try:
        channel = conn.channel()
        for d in declarations:
            try:
                _declare(channel, d)
            except (ChannelClosedByBroker, ConnectionClosedByBroker) as exc:
                raise TopologyRefused(f"{topology.source}: {_refusal(d, exc)}") from None
            except AMQPError as exc:
                raise _lost(amqp_url, exc) from None
            if done is not None:
                done(d)
    finally:
        if conn.is_open:
            conn.close()
    return len(declarations)


def check(amqp_url: str, topology: Topology, *, tls: TlsOptions | None = None) -> CheckReport:
    """What of `topology` is missing or declared differently on the broker; changes nothing."""
    declarations = plan(topology)
    problems: list[str] = []
    conn = _connect(amqp_url, tls)
    checked = unchecked = 0
    try:
        channel = conn.channel()
        for d in declarations:
            if isinstance(d, Bind):
                unchecked += 1
                continue
            checked += 1
            try:
                _declare(channel, d, passive=True)
            except ChannelClosedByBroker as exc:
                missing = exc.reply_code == _NOT_FOUND
                problems.append(f"missing: {d}" if missing else f"unreadable: {_refusal(d, exc)}")
                channel = conn.channel()
                continue
            try:
                # It exists: the same declaration again is a comparison the broker makes and
                # refuses when anything differs; when nothing does, it changes nothing.
                _declare(channel, d)
            except ChannelClosedByBroker as exc:
                problems.append(f"different: {_refusal(d, exc)}")
                channel = conn.channel()
    except ConnectionClosedByBroker as exc:
        problems.append(f"the broker closed the connection: {exc.reply_code} {exc.reply_text}")
    except AMQPError as exc:
        raise _lost(amqp_url, exc) from None
    finally:
        if conn.is_open:
            conn.close()
    return CheckReport(problems, checked, unchecked)


def declare(
    amqp_url: str,
    exchange: str,
    queue: str,
    binding: str,
    *,
    durable: bool,
    tls: TlsOptions | None = None,
) -> None:
    """A topic exchange and a queue bound to it (auto-deleted unless `durable`): the demo's."""
    temporary = not durable
    topology = Topology(
        (Exchange(exchange, "topic", durable, temporary),),
        (Queue(queue, "classic", durable, temporary, {}, (Binding(exchange, binding),)),),
        source="the demo's topology",
    )
    apply(amqp_url, topology, tls=tls)
