"""Topology as code: the TOML file that describes exchanges, queues, bindings and partitioned
queues, read into values, and the declarations that make it on a broker, in order.

Pure: `read_topology` parses and checks the text (ValueError naming the key and the problem);
`plan` turns a Topology into declarations, a partitioned queue expanded into its partitions and
the exchanges that spread keys over them (relay/amqp/topology.py runs them).

A partitioned queue `<name>` with `partitions = N`:

    source exchange --bindings--> <name>.partitions (headers; alternate exchange <name>.unkeyed)
        x-outbox-key present  --> <name>.keyed   (x-consistent-hash on the x-outbox-key header)
        no key (the alternate) --> <name>.unkeyed (x-consistent-hash on the message_id)
    each of <name>.keyed and <name>.unkeyed --weight 1--> <name>.0 ... <name>.<N-1>
                                                           (x-single-active-consumer each)

One consistent-hash exchange cannot do both: on a missing header it hashes one constant, so every
unkeyed message would land in one partition. The headers exchange's `all-with-x` match with a
void value matches on the header's presence.
"""

from __future__ import annotations

import datetime as dt
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

KEY_HEADER = "x-outbox-key"  # what the relay sets on a keyed message (outbox/shape.py)
EXCHANGE_TYPES = ("direct", "topic", "fanout", "headers")
QUEUE_TYPES = ("classic", "quorum", "stream")
MAX_PARTITIONS = 1024
_EXCHANGE_KEYS = frozenset({"name", "type", "durable", "auto_delete", "arguments"})
_QUEUE_KEYS = frozenset(
    {"name", "type", "durable", "auto_delete", "arguments", "bindings", "partitions"}
)
_BINDING_KEYS = frozenset({"exchange", "routing_key", "arguments"})


@dataclass(frozen=True, slots=True)
class Binding:
    exchange: str  # the source
    routing_key: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Exchange:
    name: str
    type: str = "topic"
    durable: bool = True
    auto_delete: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Queue:
    name: str
    type: str = "classic"
    durable: bool = True
    auto_delete: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)
    bindings: tuple[Binding, ...] = ()
    partitions: int | None = None


@dataclass(frozen=True, slots=True)
class Topology:
    exchanges: tuple[Exchange, ...] = ()
    queues: tuple[Queue, ...] = ()
    source: str = "topology"  # the file it was read from, for messages


# ---- the declarations, in the order they are made


@dataclass(frozen=True, slots=True)
class DeclareExchange:
    exchange: Exchange

    def __str__(self) -> str:
        return f"exchange {self.exchange.name!r}"


@dataclass(frozen=True, slots=True)
class DeclareQueue:
    name: str
    durable: bool
    auto_delete: bool
    arguments: Mapping[str, Any]  # x-queue-type included

    def __str__(self) -> str:
        return f"queue {self.name!r}"


@dataclass(frozen=True, slots=True)
class Bind:
    destination: str
    source: str
    routing_key: str
    arguments: Mapping[str, Any]
    to_exchange: bool  # an exchange-to-exchange binding

    def __str__(self) -> str:
        kind = "exchange" if self.to_exchange else "queue"
        return (
            f"binding {self.source!r} -> {kind} {self.destination!r} "
            f"(routing key {self.routing_key!r})"
        )


Declaration = DeclareExchange | DeclareQueue | Bind


def partition_names(name: str, partitions: int) -> list[str]:
    """The queues of a partitioned queue, in the order the hash exchanges bind them."""
    return [f"{name}.{i}" for i in range(partitions)]


def plan(topology: Topology) -> list[Declaration]:
    """Exchanges first (bindings need both ends), then each queue with its bindings."""
    out: list[Declaration] = [DeclareExchange(x) for x in topology.exchanges]
    for q in topology.queues:
        args = {**q.arguments, "x-queue-type": q.type}
        if q.partitions is None:
            out.append(DeclareQueue(q.name, q.durable, q.auto_delete, args))
            out += [Bind(q.name, b.exchange, b.routing_key, b.arguments, False) for b in q.bindings]
            continue
        out += _partitioned(q, args)
    return out


def _partitioned(q: Queue, args: Mapping[str, Any]) -> list[Declaration]:
    assert q.partitions is not None
    entry, keyed, unkeyed = f"{q.name}.partitions", f"{q.name}.keyed", f"{q.name}.unkeyed"

    def exchange(name: str, type_: str, arguments: Mapping[str, Any]) -> DeclareExchange:
        return DeclareExchange(Exchange(name, type_, q.durable, q.auto_delete, arguments))

    out: list[Declaration] = [
        exchange(unkeyed, "x-consistent-hash", {"hash-property": "message_id"}),
        exchange(keyed, "x-consistent-hash", {"hash-header": KEY_HEADER}),
        exchange(entry, "headers", {"alternate-exchange": unkeyed}),
        # None is AMQP's void: the binding matches on the header's presence.
        Bind(keyed, entry, "", {"x-match": "all-with-x", KEY_HEADER: None}, True),
    ]
    single = {**args, "x-single-active-consumer": True}
    for name in partition_names(q.name, q.partitions):
        out.append(DeclareQueue(name, q.durable, q.auto_delete, single))
        # The routing key of a consistent-hash binding is the queue's weight.
        out += [Bind(name, keyed, "1", {}, False), Bind(name, unkeyed, "1", {}, False)]
    out += [Bind(entry, b.exchange, b.routing_key, b.arguments, True) for b in q.bindings]
    return out


# ---- reading the file


def read_topology(text: str, source: str = "topology") -> Topology:
    """The topology a TOML text describes; ValueError naming the line or key and the problem."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"is not TOML: {exc}") from None
    _only(table, frozenset({"exchanges", "queues"}), "the file")
    exchanges = tuple(
        _exchange(f"exchanges[{i}]", item) for i, item in enumerate(_tables(table, "exchanges"))
    )
    queues = tuple(_queue(f"queues[{i}]", item) for i, item in enumerate(_tables(table, "queues")))
    if not exchanges and not queues:
        raise ValueError("declares nothing: give [[exchanges]] or [[queues]]")
    _unique("exchange", [x.name for x in exchanges] + _made_exchanges(queues))
    _unique("queue", [n for q in queues for n in _made_queues(q)])
    return Topology(exchanges, queues, source)


def _made_exchanges(queues: tuple[Queue, ...]) -> list[str]:
    return [
        f"{q.name}.{part}"
        for q in queues
        if q.partitions is not None
        for part in ("partitions", "keyed", "unkeyed")
    ]


def _made_queues(q: Queue) -> list[str]:
    return [q.name] if q.partitions is None else partition_names(q.name, q.partitions)


def _unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"declares {kind} {name!r} twice")
        seen.add(name)


def _tables(table: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = table.get(key, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError(f"{key} must be an array of tables: [[{key}]]")
    return items


def _only(table: Mapping[str, Any], keys: frozenset[str], where: str) -> None:
    unknown = sorted(set(table) - keys)
    if unknown:
        raise ValueError(
            f"{where}: unknown key {', '.join(unknown)} (expected {', '.join(sorted(keys))})"
        )


def _name(where: str, table: Mapping[str, Any], key: str = "name") -> str:
    if key not in table:
        raise ValueError(f"{where}: {key} is missing")
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}.{key}: must be a non-empty string, got {value!r}")
    if len(value.encode()) > 255:
        raise ValueError(f"{where}.{key}: longer than AMQP's 255 bytes")
    return value


def _flag(where: str, table: Mapping[str, Any], key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key}: must be true or false, got {value!r}")
    return value


def _arguments(where: str, table: Mapping[str, Any]) -> dict[str, Any]:
    value = table.get("arguments", {})
    if not isinstance(value, dict):
        raise ValueError(f'{where}.arguments: must be a table, e.g. {{ "x-max-length" = 1000 }}')
    for key, item in value.items():
        _argument(f"{where}.arguments.{key}", item)
    return dict(value)


def _argument(where: str, value: Any) -> None:
    # Dates and times have no AMQP field type RabbitMQ's arguments would read.
    if isinstance(value, dt.date | dt.time):
        raise ValueError(f"{where}: dates and times are not AMQP argument values")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _argument(f"{where}[{i}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _argument(f"{where}.{key}", item)


def _exchange(where: str, table: Mapping[str, Any]) -> Exchange:
    _only(table, _EXCHANGE_KEYS, where)
    name = _name(where, table)
    where = f"{where} ({name})"
    type_ = table.get("type", "topic")
    # x-... types come from plugins (x-delayed-message, x-consistent-hash): the broker checks.
    if not isinstance(type_, str) or not (type_ in EXCHANGE_TYPES or type_.startswith("x-")):
        raise ValueError(
            f"{where}.type: {type_!r} is not one of {', '.join(EXCHANGE_TYPES)} "
            "(or a plugin's x-... type)"
        )
    return Exchange(
        name,
        type_,
        _flag(where, table, "durable", True),
        _flag(where, table, "auto_delete", False),
        _arguments(where, table),
    )


def _queue(where: str, table: Mapping[str, Any]) -> Queue:
    _only(table, _QUEUE_KEYS, where)
    name = _name(where, table)
    where = f"{where} ({name})"
    type_ = table.get("type", "classic")
    if type_ not in QUEUE_TYPES:
        raise ValueError(f"{where}.type: {type_!r} is not one of {', '.join(QUEUE_TYPES)}")
    arguments = _arguments(where, table)
    if "x-queue-type" in arguments:
        raise ValueError(f"{where}.arguments: give the type as type = ..., not x-queue-type")
    durable = _flag(where, table, "durable", True)
    auto_delete = _flag(where, table, "auto_delete", False)
    if type_ != "classic" and (not durable or auto_delete):
        raise ValueError(f"{where}: {type_} queues are durable and not auto-deleted")
    partitions = table.get("partitions")
    if partitions is not None:
        if type_ == "stream":
            raise ValueError(f"{where}.partitions: a stream has no single active consumer")
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise ValueError(f"{where}.partitions: must be an integer, got {partitions!r}")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"{where}.partitions: must be 1 to {MAX_PARTITIONS}, got {partitions}")
    bindings = table.get("bindings", [])
    if not isinstance(bindings, list) or not all(isinstance(b, dict) for b in bindings):
        raise ValueError(
            f'{where}.bindings: must be an array of tables: [{{ exchange = "orders", '
            'routing_key = "order.*" }]'
        )
    return Queue(
        name,
        type_,
        durable,
        auto_delete,
        arguments,
        tuple(_binding(f"{where}.bindings[{i}]", b) for i, b in enumerate(bindings)),
        partitions,
    )


def _binding(where: str, table: Mapping[str, Any]) -> Binding:
    _only(table, _BINDING_KEYS, where)
    key = table.get("routing_key", "")
    if not isinstance(key, str):
        raise ValueError(f"{where}.routing_key: must be a string, got {key!r}")
    return Binding(_name(where, table, "exchange"), key, _arguments(where, table))
