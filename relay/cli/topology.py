"""`outbox-relay topology`: declare the exchanges and queues a TOML file describes, or check
that the broker has them (relay/core/topology.py reads the file, relay/amqp/topology.py talks
to the broker).

    outbox-relay topology apply FILE   declare everything (idempotent); exit 0
    outbox-relay topology check FILE   exit 0 when the broker has it all, 1 listing what is
                                       missing or declared differently; declares nothing
"""

from __future__ import annotations

import argparse
import sys

from relay.cli.options import Commands, Handler, argparse_type
from relay.runtime.config import RelayConfig
from relay.runtime.readers import topology_file


def add_parser(sub: Commands) -> None:
    p = sub.add_parser(
        "topology",
        help="apply FILE or check FILE: declare, or check, the exchanges and queues of a TOML file",
    )
    actions = p.add_subparsers(dest="topology_action", metavar="ACTION")
    actions.required = True
    read = argparse_type(topology_file)
    apply = actions.add_parser("apply", help="declare what FILE describes (idempotent)")
    apply.add_argument("file", metavar="FILE", type=read, help="the topology (TOML)")
    check = actions.add_parser(
        "check", help="exit 1 listing what FILE describes that the broker lacks; changes nothing"
    )
    check.add_argument("file", metavar="FILE", type=read, help="the topology (TOML)")


def cmd_topology(config: RelayConfig, args: argparse.Namespace) -> int:
    # Here, not at the top: the broker adapter loads pika, which no other command needs.
    from relay.amqp import topology

    if args.topology_action == "apply":
        made = topology.apply(config.amqp_url, args.file, tls=config.amqp_tls)
        print(f"applied {args.file.source}: {made} declarations")
        return 0
    report = topology.check(config.amqp_url, args.file, tls=config.amqp_tls)
    for problem in report.problems:
        print(problem)
    if report.unchecked_bindings:
        # AMQP has no way to list bindings; the management API does, and is not assumed.
        print(
            f"not checked: {report.unchecked_bindings} bindings (AMQP cannot list them; "
            "`topology apply` declares any that are missing)",
            file=sys.stderr,
        )
    if report.problems:
        print(f"{args.file.source}: {len(report.problems)} missing or different", file=sys.stderr)
        return 1
    print(f"{args.file.source}: the broker has all {report.checked} exchanges and queues")
    return 0


COMMANDS: dict[str, Handler] = {"topology": cmd_topology}
