"""`outbox-relay grants`: the GRANT statements that give each role of a deployment what it needs of
the outbox tables on PostgreSQL, and nothing more (relay/store/grants.py says what, and why).

    outbox-relay grants [--schema S] [--app ROLE] [--consumer ROLE] [--relay ROLE]
                        [--viewer ROLE] [--operator ROLE]

Prints SQL for the owner of the tables (the role that ran `outbox-relay migrate`) to run, again
after each migrate; it connects to nothing. SQLite has no roles: there is nothing to grant.

Also here: what a command's "permission denied" means, in the privileges its role lacks.
"""

from __future__ import annotations

import argparse

from sqlalchemy.exc import SQLAlchemyError

from relay.cli.options import Commands, Handler, argparse_type
from relay.errors import ConfigError, PermissionDenied, RelayError
from relay.runtime.config import RelayConfig
from relay.store import command_engine
from relay.store import grants as store_grants
from relay.store.grants import ROLE_KINDS, Capability, RoleKind

DEFAULT_SCHEMA = "public"


def _dest(kind: RoleKind) -> str:
    return "grant_" + kind.option.removeprefix("--")


def add_parser(sub: Commands) -> None:
    p = sub.add_parser(
        "grants",
        help="print the PostgreSQL GRANT statements each role needs (least privilege)",
        description="Print the GRANT statements that give each role what it needs of the outbox "
        "tables and nothing more. Run them as the tables' owner (the role that ran "
        "`outbox-relay migrate`), again after each migrate. PostgreSQL only: SQLite has no roles.",
    )
    p.add_argument(
        "--schema",
        default=DEFAULT_SCHEMA,
        metavar="SCHEMA",
        type=argparse_type(store_grants.check_identifier),
        help=f"the schema holding the outbox tables (default {DEFAULT_SCHEMA})",
    )
    helps = {
        "--app": "writes messages with outbox.enqueue",
        "--consumer": "runs outbox.Consumer or process_once (the inbox)",
        "--relay": "runs `outbox-relay run`",
        "--viewer": "runs status, messages, show, circuits",
        "--operator": (
            "also runs replay, discard, cancel, reschedule, prioritize, purge, circuits reset"
        ),
    }
    for kind in ROLE_KINDS:
        p.add_argument(
            kind.option,
            dest=_dest(kind),
            action="append",
            default=[],
            type=argparse_type(store_grants.check_role),
            metavar="ROLE",
            help=f"a role that {helps[kind.option]}; repeatable",
        )


def cmd_grants(config: RelayConfig, args: argparse.Namespace) -> int:
    roles = [(kind, role) for kind in ROLE_KINDS for role in getattr(args, _dest(kind))]
    if not roles:
        flags = ", ".join(k.option for k in ROLE_KINDS)
        raise ConfigError(f"grants: name at least one role ({flags})")
    print(
        f"-- outbox-relay grants, schema {store_grants.quote(args.schema)}: run as the owner of "
        "the outbox tables, again after each migrate"
    )
    print("\n".join(store_grants.grant_statements(args.schema, roles)))
    return 0


# What each command needs; `grants` names the option whose role has it.
_NEEDS: dict[str, tuple[tuple[Capability, ...], str]] = {
    "run": ((store_grants.RELAY_RUN,), "--relay"),
    "status": ((store_grants.VIEW,), "--viewer"),
    "messages": ((store_grants.VIEW,), "--viewer"),
    "show": ((store_grants.VIEW,), "--viewer"),
    "circuits": ((store_grants.VIEW,), "--viewer"),
    "circuits reset": ((store_grants.RESET,), "--operator"),
    "replay": ((store_grants.CHANGE,), "--operator"),
    "discard": ((store_grants.CHANGE,), "--operator"),
    "cancel": ((store_grants.CHANGE,), "--operator"),
    "reschedule": ((store_grants.CHANGE,), "--operator"),
    "prioritize": ((store_grants.CHANGE,), "--operator"),
    "console": ((store_grants.VIEW,), "--viewer"),
    "purge": ((store_grants.PURGE,), "--operator"),
}


def explain_denied(config: RelayConfig, args: argparse.Namespace, exc: PermissionDenied) -> str:
    """The command's "permission denied" as the privileges its role lacks and the `grants`
    option that prints them; the database's own words when they cannot be worked out."""
    command = args.command
    if command == "circuits" and getattr(args, "circuits_action", None) == "reset":
        command = "circuits reset"
    needs = _NEEDS.get(command)
    if needs is None:
        return str(exc)
    capabilities, option = needs
    try:
        with command_engine(config.db_url) as engine, engine.connect() as conn:
            role = store_grants.current_role(conn)
            lacking = store_grants.missing(conn, capabilities)
    except (RelayError, SQLAlchemyError):
        return str(exc)
    hint = f"`outbox-relay grants {option} {store_grants.quote(role)}` prints the GRANT statements"
    if not lacking:
        return f"{exc} (role {role}; {hint})"
    return f"permission denied: role {role} lacks {store_grants.describe(lacking)}. {hint}"


COMMANDS: dict[str, Handler] = {"grants": cmd_grants}
