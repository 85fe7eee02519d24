"""Least privilege on PostgreSQL: login roles of this test's own get exactly what the
`outbox-relay grants ... | psql` of docs/guides/roles.md gives them (run as the tables' owner,
after migrating as it), and each does its work with that and no more: the application enqueues
(and cannot change, delete or read a message), the consumer uses its inbox, the relay publishes,
keeps its circuits and purges, the viewer reads and is refused every write in one line naming
the privilege, and the operator acts.

Roles are cluster-wide: each is named t_<random>_<kind>, and only those are dropped at teardown
(DROP OWNED, then DROP ROLE). The server trusts 127.0.0.1, so LOGIN roles need no password.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import shlex
import subprocess
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

import outbox
from outbox.schema import message
from relay.core.circuit import CircuitSettings
from relay.core.retention import RetentionPolicy
from relay.ports import RetentionFailed
from relay.store.retention import cutoff_id
from tests.docs_blocks import block
from tests.support.broker import Broker
from tests.support.cli import in_process
from tests.support.db import PG_ADMIN_URL, pg_schema, states
from tests.support.relays import RelayFactory
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

# "stranger" is granted nothing.
KINDS = ("owner", "app", "consumer", "relay", "viewer", "operator", "stranger")
# The page's command names each kind of role through its option.
OPTIONS = {"--app": "app", "--consumer": "consumer", "--relay": "relay", "--viewer": "viewer",
           "--operator": "operator"}  # fmt: skip


PAGE = "guides/roles.md"


def documented_pipeline() -> tuple[list[str], list[str]]:
    """The page's `outbox-relay grants ... | psql ...` command, as its two argv lists."""
    commands = block(PAGE, "grants-command")
    found = re.search(r"^outbox-relay grants .*?(?<!\\)$", commands, re.MULTILINE | re.DOTALL)
    assert found, f"{PAGE}'s grants-command block shows no `outbox-relay grants` command"
    left, _, right = found.group(0).replace("\\\n", " ").partition("|")
    return shlex.split(left), shlex.split(right)


@dataclasses.dataclass(frozen=True)
class Roles:
    """The roles of one test, on the schema of its pg_url."""

    schema: str
    names: dict[str, str]

    def url(self, kind: str) -> str:
        """A SQLAlchemy URL logging in as that role, with the test's schema on its search_path."""
        options = urllib.parse.quote(f"-csearch_path={self.schema}", safe="")
        base = make_url(PG_ADMIN_URL).set(username=self.names[kind], password=None, query={})
        return f"{base.render_as_string(hide_password=False)}?options={options}"

    def libpq(self, kind: str) -> str:
        """The same login as psql takes it."""
        url = make_url(PG_ADMIN_URL).set(
            drivername="postgresql", username=self.names[kind], password=None, query={}
        )
        return url.render_as_string(hide_password=False)

    def engine(self, kind: str) -> Engine:
        return create_engine(self.url(kind), pool_size=1, connect_args={"connect_timeout": 5})


@pytest.fixture
def roles(pg_admin: Engine, pg_url: str) -> Iterator[Roles]:
    """Login roles t_<random>_<kind>; the owner may create in (and grant use of) the schema."""
    tag = uuid.uuid4().hex[:8]
    made = Roles(pg_schema(pg_url), {kind: f"t_{tag}_{kind}" for kind in KINDS})
    created: list[str] = []
    try:
        with pg_admin.connect() as conn:
            for name in made.names.values():
                conn.exec_driver_sql(f'CREATE ROLE "{name}" LOGIN')
                created.append(name)
            conn.exec_driver_sql(
                f'GRANT USAGE, CREATE ON SCHEMA "{made.schema}" '
                f'TO "{made.names["owner"]}" WITH GRANT OPTION'
            )
        yield made
    finally:
        if created:
            quoted = ", ".join(f'"{name}"' for name in created)
            with pg_admin.connect() as conn:
                conn.exec_driver_sql("SET lock_timeout = '10s'")
                conn.exec_driver_sql(f"DROP OWNED BY {quoted}")  # the tables, every grant
                conn.exec_driver_sql(f"DROP ROLE {quoted}")


def documented_grants_argv(roles: Roles) -> tuple[list[str], list[str]]:
    """The page's `outbox-relay grants ... | psql ...` with this test's role and schema names
    and the owner's login in place of the page's."""
    left, right = documented_pipeline()
    names = {"--schema": roles.schema, **{o: roles.names[k] for o, k in OPTIONS.items()}}
    assert left[:2] == ["outbox-relay", "grants"], left
    assert set(names) <= set(left), f"the page's command should name every option: {left}"
    left = [names.get(before, arg) for before, arg in zip(["", *left], left, strict=False)]
    assert right[0] == "psql", right
    right = [roles.libpq("owner") if a.startswith("postgresql://") else a for a in right]
    return left, right


def apply_documented_grants(roles: Roles) -> None:
    """Migrate as the owner (so it owns the tables), then the page's pipeline with this test's
    names: the command in this process (tests/e2e/test_grants_cli.py runs it as a process),
    its output piped to psql as shown."""
    code, _, err = in_process("--db", roles.url("owner"), "migrate")
    assert code == 0, err
    left, right = documented_grants_argv(roles)
    code, sql, err = in_process(*left[1:])
    assert code == 0, err
    done = subprocess.run(
        right, input=sql, env=psql_environment(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "ERROR" not in done.stderr, done.stderr
    assert "WARNING" not in done.stderr, done.stderr


def psql_environment() -> dict[str, str]:
    """This environment without libpq's PG* variables (the URL says everything) or OUTBOX_*."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "PG"))}


@pytest.fixture
def granted(roles: Roles) -> Roles:
    """`roles`, with the outbox migrated by the owner and the page's grants applied."""
    apply_documented_grants(roles)
    return roles


def denied(engine: Engine, sql: str, **params: object) -> str:
    """Run `sql` as the engine's role; assert PostgreSQL refuses it for lack of a privilege."""
    with pytest.raises(ProgrammingError) as refused, engine.begin() as conn:
        conn.execute(text(sql), params)
    assert getattr(refused.value.orig, "sqlstate", None) == "42501", refused.value
    return str(refused.value.orig)


# --------------------------------------------------------------------------- the application


def test_the_application_enqueues_and_can_not_change_delete_or_read_messages(
    granted: Roles,
) -> None:
    app = granted.engine("app")
    owner = granted.engine("owner")
    try:

        def put(conn: Connection, n: int, idempotency_key: str | None = None) -> uuid.UUID:
            return outbox.enqueue(
                conn,
                exchange="orders",
                routing_key="r",
                payload={"n": n},
                idempotency_key=idempotency_key,
            )

        with app.begin() as conn:
            plain = put(conn, 1)
            first = put(conn, 2, "k-1")
            # The same key in the same transaction: ON CONFLICT finds the row, SELECT reads its id.
            assert put(conn, 3, "k-1") == first
        with app.begin() as conn:  # and from another transaction, after the commit
            assert put(conn, 4, "k-1") == first
        with owner.connect() as conn:
            ids = set(conn.execute(text("SELECT id FROM outbox_message")).scalars())
        assert ids == {plain, first}

        # The point of least privilege: what is queued stays as it was written.
        assert "outbox_message" in denied(
            app, "UPDATE outbox_message SET state = 'published' WHERE id = :id", id=plain
        )
        denied(app, "DELETE FROM outbox_message WHERE id = :id", id=plain)
        denied(app, "SELECT payload FROM outbox_message")
        denied(app, "SELECT * FROM outbox_attempt")
        denied(app, "TRUNCATE outbox_message")
        assert states(owner) == {"pending": 2}
    finally:
        app.dispose()
        owner.dispose()


def test_the_consumer_uses_its_inbox_and_nothing_else(granted: Roles) -> None:
    consumer = granted.engine("consumer")
    try:
        with consumer.begin() as conn:
            assert outbox.process_once(conn, consumer="billing", message_id="m-1")
        with consumer.begin() as conn:
            assert not outbox.process_once(conn, consumer="billing", message_id="m-1")
        # Purging deletes rows chosen FOR UPDATE SKIP LOCKED, per consumer and for all of them.
        assert outbox.purge_inbox(consumer, older_than=dt.timedelta(0), consumer="billing") == 1
        with consumer.begin() as conn:
            assert outbox.process_once(conn, consumer="billing", message_id="m-2")
        assert outbox.purge_inbox(consumer, older_than=dt.timedelta(0)) == 1
        denied(consumer, "SELECT id FROM outbox_message")
        with pytest.raises(ProgrammingError), consumer.begin() as conn:
            outbox.enqueue(conn, exchange="x", routing_key="r", payload={})
    finally:
        consumer.dispose()


# --------------------------------------------------------------------------- the relay


def test_the_relay_publishes_keeps_circuits_and_purges_without_ddl(
    granted: Roles, broker: Broker, relay_factory: RelayFactory
) -> None:
    owner = granted.engine("owner")
    relay_db = granted.engine("relay")
    missing = f"t.{uuid.uuid4().hex[:12]}.missing"  # never declared: its circuit opens
    try:
        with owner.begin() as conn:
            ids = [
                outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload={"i": i})
                for i in range(5)
            ]
            outbox.enqueue(conn, exchange=missing, routing_key="r", payload={"lost": True})
        relay = relay_factory(
            granted.url("relay"),
            circuit=CircuitSettings(threshold=1, cooldown=60.0),
            rate_limits={broker.exchange: 10_000.0},  # the bucket lives in outbox_resource too
        )
        broker.collect_ids(ids)

        def circuit_open() -> bool:
            with owner.connect() as conn:
                found = conn.execute(
                    text("SELECT state FROM outbox_resource WHERE resource LIKE :r"),
                    {"r": f"%/{missing}"},
                ).scalar()
            return found == "open"

        wait_until(circuit_open, what="the missing exchange's circuit to open")
        wait_until(lambda: states(owner).get("published") == len(ids), what="rows marked")
        wait_until(
            lambda: relay.config.relay_id in {r for r, _, _ in relay.store.relays(60.0)},
            what="the relay's heartbeat",
        )

        # Retention, as the relay runs it (a day from now, everything published has expired).
        later = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
        assert relay.store.purge_expired(RetentionPolicy(published_after=60.0), later) == len(ids)
        wait_until(lambda: states(owner) == {"pending": 1}, what="only the unsent message left")
        # Denied DELETE, retention fails on its own (the loop logs it and goes on publishing).
        with owner.begin() as conn:
            conn.exec_driver_sql(f'REVOKE DELETE ON outbox_message FROM "{granted.names["relay"]}"')
        with pytest.raises(RetentionFailed, match="permission denied for table outbox_message"):
            relay.store.purge_expired(RetentionPolicy(published_after=60.0), later)

        # The relay neither invents messages nor changes the schema.
        denied(
            relay_db,
            "INSERT INTO outbox_message (id, exchange, routing_key, payload, content_type, "
            "available_at, created_at) VALUES (:id, 'x', 'r', '', 'text/plain', now(), now())",
            id=uuid.uuid4(),
        )
        denied(relay_db, "CREATE TABLE outbox_extra (a int)")
        denied(relay_db, "ALTER TABLE outbox_message ADD COLUMN extra int")
    finally:
        owner.dispose()
        relay_db.dispose()


# --------------------------------------------------------------------------- operators


def _seed_for_operators(owner: Engine) -> dict[str, uuid.UUID]:
    """A dead message, a pending one, a published one old enough to purge, an open circuit."""
    with owner.begin() as conn:
        dead = outbox.enqueue(conn, exchange="orders", routing_key="r", payload={"n": 1})
        pending = outbox.enqueue(conn, exchange="orders", routing_key="r", payload={"n": 2})
        old = outbox.enqueue(conn, exchange="orders", routing_key="r", payload={"n": 3})
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    aged = cutoff_id(long_ago)  # an id as old as the row, as retention walks ids
    with owner.begin() as conn:
        conn.execute(
            message.update()
            .where(message.c.id == dead)
            .values(state="dead", last_error="rejected", last_failed_at=long_ago)
        )
        conn.execute(
            message.update()
            .where(message.c.id == old)
            .values(id=aged, state="published", published_at=long_ago, created_at=long_ago)
        )
        conn.execute(
            text(
                "INSERT INTO outbox_resource (resource, state, failures, opens, open_until, "
                "changed_at, last_error) VALUES ('broker/orders', 'open', 5, 1, "
                "now() + interval '1 hour', now(), 'NOT_FOUND')"
            )
        )
    return {"dead": dead, "pending": pending, "old": aged}


def one_line_failure(result: tuple[int, str, str]) -> str:
    code, out, err = result
    assert code == 1, (code, out, err)
    assert out == "", out
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_the_viewer_reads_and_each_write_is_refused_naming_the_privilege(granted: Roles) -> None:
    owner = granted.engine("owner")
    try:
        seeded = _seed_for_operators(owner)
        url, viewer = granted.url("viewer"), granted.names["viewer"]
        for argv in (["status"], ["status", "--json"], ["messages", "--state", "dead"],
                     ["show", str(seeded["dead"])], ["circuits"],
                     ["replay", "--state", "dead", "--dry-run"],
                     ["purge", "--older-than", "1d", "--dry-run"]):  # fmt: skip
            code, out, err = in_process("--db", url, *argv)
            assert code == 0, (argv, err)
            assert out, argv

        hint = f". `outbox-relay grants --operator {viewer}` prints the GRANT statements"
        change = (
            f"permission denied: role {viewer} lacks UPDATE on table outbox_message; "
            "INSERT on table outbox_attempt; USAGE on sequence outbox_attempt_id_seq" + hint
        )
        for verb, target in (("replay", "dead"), ("discard", "dead"), ("cancel", "pending")):
            line = one_line_failure(in_process("--db", url, verb, str(seeded[target])))
            assert line == f"outbox-relay: {verb} failed: {change}"
        line = one_line_failure(in_process("--db", url, "purge", "--older-than", "1d"))
        assert line == (
            f"outbox-relay: purge failed: permission denied: role {viewer} lacks UPDATE, DELETE "
            f"on table outbox_message; DELETE on table outbox_attempt{hint}"
        )
        line = one_line_failure(in_process("--db", url, "circuits", "reset", "orders"))
        assert line == (
            f"outbox-relay: circuits failed: permission denied: role {viewer} lacks INSERT, "
            f"UPDATE on table outbox_resource{hint}"
        )
        # Nothing changed.
        assert states(owner) == {"dead": 1, "pending": 1, "published": 1}
    finally:
        owner.dispose()


def test_the_operator_replays_discards_cancels_purges_and_resets(granted: Roles) -> None:
    owner = granted.engine("owner")
    try:
        seeded = _seed_for_operators(owner)
        url = granted.url("operator")
        for argv in (
            ["discard", str(seeded["dead"])],
            ["replay", str(seeded["dead"])],
            ["cancel", str(seeded["pending"])],
            ["purge", "--older-than", "1d"],
            ["circuits", "reset", "orders"],
            ["status"],
        ):
            code, _, err = in_process("--db", url, *argv)
            assert code == 0, (argv, err)
        assert states(owner) == {"pending": 1, "cancelled": 1}
        with owner.connect() as conn:
            circuit = conn.execute(text("SELECT state FROM outbox_resource")).scalar_one()
            actions = conn.execute(text("SELECT outcome FROM outbox_attempt ORDER BY id")).scalars()
            assert list(actions) == ["discarded", "replayed", "cancelled"]
        assert circuit == "closed"
    finally:
        owner.dispose()


def test_a_role_without_usage_on_the_schema_sees_no_outbox(granted: Roles) -> None:
    line = one_line_failure(in_process("--db", granted.url("stranger"), "status"))
    assert "the outbox tables do not exist" in line, line
