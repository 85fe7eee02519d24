"""`outbox-relay sql [--dialect D] [NAME]`: the text of every statement the store runs, as the
database receives it, for one database and one store configuration (`--dead-key` and
`--circuit-scope` are written into some of them). It connects to nothing.

    outbox-relay sql --dialect mysql claim        one statement
    outbox-relay sql --dialect sqlite             all of them, each under a `-- name --` line

The statements are built from relay/store/sql/*.sql exactly as a relay builds them; the names are
the fields of the dialect's statements (relay/store/statements.py), and what runs on a driver
connection (begin, session settings).
"""

from __future__ import annotations

import argparse

from sqlalchemy.engine import make_url

from relay.cli.options import Commands, Handler, add_command_options
from relay.errors import ConfigError
from relay.runtime.config import RelayConfig
from relay.store.databases import DIALECTS, dialect_for


def add_parser(sub: Commands) -> None:
    p = sub.add_parser(
        "sql",
        help="print the SQL of the store's statements (connects to nothing)",
        description="Print the statements the store runs on a database, as the database receives "
        "them: every one, each under a `-- name --` line, or the one named. Values are bound, "
        "never part of the text (:name).",
    )
    p.add_argument(
        "--dialect",
        choices=sorted(DIALECTS),
        help="the database (default: the one --db names)",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="one statement's name")
    add_command_options(p, "sql")


def cmd_sql(config: RelayConfig, args: argparse.Namespace) -> int:
    # The URL was checked when the configuration was read: it parses, and names a DIALECTS one.
    backend = args.dialect or make_url(config.db_url).get_backend_name()
    dialect = dialect_for(backend, hold=config.hold_dead_keys, scope=config.circuit_scope)
    texts = dialect.texts()
    if args.name is None:
        print("\n\n".join(f"-- {name} --\n{sql}" for name, sql in texts.items()))
        return 0
    if args.name not in texts:
        raise ConfigError(f"sql: no statement named {args.name!r} on {backend} (one of: "
                          f"{', '.join(texts)})")  # fmt: skip
    print(texts[args.name])
    return 0


COMMANDS: dict[str, Handler] = {"sql": cmd_sql}
