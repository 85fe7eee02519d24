"""The topology file's rules: what it declares, in what order, and each mistake named in one line
by its key (relay/core/topology.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from relay.core.topology import Bind, DeclareExchange, DeclareQueue, plan, read_topology
from tests.support.cli import in_process

FILE = """
[[exchanges]]
name = "orders"
type = "topic"

[[queues]]
name = "billing.orders"
type = "quorum"
arguments = { "x-delivery-limit" = 5 }
bindings = [{ exchange = "orders", routing_key = "order.*" }]

[[queues]]
name = "shipping"
bindings = [{ exchange = "orders", routing_key = "order.paid" }]
partitions = 3
"""


def test_a_plain_queue_is_declared_with_its_type_and_bound() -> None:
    steps = plan(read_topology(FILE))
    assert steps[0] == DeclareExchange(read_topology(FILE).exchanges[0])
    billing = steps[1]
    assert isinstance(billing, DeclareQueue)
    assert billing.arguments == {"x-delivery-limit": 5, "x-queue-type": "quorum"}
    assert steps[2] == Bind("billing.orders", "orders", "order.*", {}, False)


def test_partitions_are_queues_with_a_single_active_consumer_behind_two_hash_exchanges() -> None:
    steps = plan(read_topology(FILE))[3:]
    exchanges = {s.exchange.name: s.exchange for s in steps if isinstance(s, DeclareExchange)}
    assert exchanges["shipping.keyed"].arguments == {"hash-header": "x-outbox-key"}
    assert exchanges["shipping.unkeyed"].arguments == {"hash-property": "message_id"}
    assert exchanges["shipping.partitions"].arguments == {"alternate-exchange": "shipping.unkeyed"}
    queues = [s for s in steps if isinstance(s, DeclareQueue)]
    assert [q.name for q in queues] == ["shipping.0", "shipping.1", "shipping.2"]
    assert all(q.arguments["x-single-active-consumer"] is True for q in queues)
    binds = [s for s in steps if isinstance(s, Bind)]
    # Each partition weighs 1 in both hash exchanges; the source feeds the entry exchange.
    assert sum(1 for b in binds if b.routing_key == "1") == 6
    assert binds[-1] == Bind("shipping.partitions", "orders", "order.paid", {}, True)
    # The keyed path is taken only when the header is there (void: presence).
    presence = {"x-match": "all-with-x", "x-outbox-key": None}
    assert Bind("shipping.keyed", "shipping.partitions", "", presence, True) in binds


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[queues]]\nname = 'q'\ntype = 'fast'", "queues[0] (q).type: 'fast' is not one of"),
        ("[[queues]]\nname = 'q'\npartitions = 0", "queues[0] (q).partitions: must be 1 to"),
        ("[[queues]]\nname = 'q'\npartitions = 2\ntype = 'stream'", "a stream has no single"),
        ("[[queues]]\nnam = 'q'", "queues[0]: unknown key nam"),
        ("[[queues]]\ntype = 'classic'", "queues[0]: name is missing"),
        ("[[exchanges]]\nname = 'x'\ntype = 'round'", "exchanges[0] (x).type: 'round' is not"),
        ("[[queues]]\nname = 'q'\nbindings = [{ routing_key = 'a' }]", "bindings[0]: exchange is"),
        ("[[queues]]\nname = 'q'\n[[queues]]\nname = 'q'", "declares queue 'q' twice"),
        ("[[queues]]\nname = 'q'\narguments = { x-queue-type = 'quorum' }", "not x-queue-type"),
        ("[[queues]]\nname = 'q'\ntype = 'quorum'\ndurable = false", "quorum queues are durable"),
        ("[[queues]]\nname = 'q'\narguments = { at = 07:30:00 }", "dates and times"),
        ("queues = 3", "queues must be an array of tables"),
        ("", "declares nothing"),
        ("[[queues]\n", "is not TOML: "),
    ],
)
def test_each_mistake_is_named_by_its_key(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        read_topology(text)


def test_a_bad_file_exits_2_in_one_line_naming_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "topology.toml"
    path.write_text("[[queues]]\nname = 'q'\npartitions = = 2\n")
    code, out, err = in_process("topology", "check", str(path))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert str(path) in err
    assert "line 3" in err
    code, _, err = in_process("run", "--topology", str(tmp_path / "absent.toml"))
    assert code == 2
    assert "does not exist" in err
    assert err.count("\n") == 1, err
