"""Operator commands at their edges, in process: replay/discard over a state larger than one
statement may bind, `show` of a hostile row, `migrate` as a role that may not create."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, update

import outbox
from outbox.schema import message
from relay.cli.main import main
from relay.cli.messages import BULK_CHUNK
from tests.support.db import PG_ADMIN_URL, make_app_engine, states

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# More than psycopg can bind into one statement (65535 parameters).
MANY = 70_000


def _dead_rows(engine: Engine, n: int) -> None:
    """n dead messages, cloned in SQL from one enqueued row (enqueueing 70k one by one is slow)."""
    with engine.begin() as conn:
        outbox.enqueue(conn, exchange="ex", routing_key="rk", payload={"n": 0})
    others = [c.name for c in message.c if c.name not in ("seq", "id")]
    cols = ", ".join(others)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO outbox_message (id, {cols}) "
            f"SELECT gen_random_uuid(), {cols} FROM outbox_message, generate_series(2, {n})"
        )
        conn.execute(update(message).values(state="dead", last_error="boom"))


@pytest.fixture
def bound_params() -> Iterator[list[int]]:
    """The number of parameters each statement of the test bound."""
    seen: list[int] = []

    def count(_c: Any, _cur: Any, _stmt: str, params: Any, _ctx: Any, many: bool) -> None:
        seen.append(len(params) if isinstance(params, dict | tuple | list) and not many else 0)

    event.listen(Engine, "before_cursor_execute", count)
    yield seen
    event.remove(Engine, "before_cursor_execute", count)


@pytest.mark.parametrize("verb", ["replay", "discard"])
def test_a_whole_state_is_streamed_in_batches(
    verb: str,
    pg_url: str,
    pg_engine: Engine,
    bound_params: list[int],
    capsys: pytest.CaptureFixture[str],
) -> None:
    _dead_rows(pg_engine, MANY)
    assert main(["--db", pg_url, verb, "--state", "dead", "--dry-run", "--json"]) == 0, (
        capsys.readouterr().err
    )
    would = json.loads(capsys.readouterr().out)[f"would_{verb}"]
    assert len(would) == len(set(would)) == MANY
    assert main(["--db", pg_url, verb, "--state", "dead"]) == 0, capsys.readouterr().err
    past = {"replay": "replayed", "discard": "discarded"}[verb]
    assert capsys.readouterr().out.strip() == f"{past} {MANY} message(s)"
    assert states(pg_engine) == {"pending" if verb == "replay" else "discarded": MANY}
    # No statement bound more than a batch of ids (plus a few other values).
    assert max(bound_params) <= BULK_CHUNK + 16


def test_show_escapes_control_characters(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = make_app_engine(sqlite_url)
    outbox.create_schema(engine)
    with engine.begin() as conn:
        mid = outbox.enqueue(conn, exchange="ex", routing_key="rk", payload="p\x1b]0;pwned\x07")
        conn.execute(
            update(message)
            .where(message.c.id == mid)
            .values(routing_key="order.\x1b[2K\r", last_error="x\u202eevil", state="dead")
        )
    engine.dispose()
    for argv in (["show", str(mid)], ["messages"], ["messages", "--state", "dead"]):
        assert main(["--db", sqlite_url, *argv]) == 0
        out = capsys.readouterr().out
        for raw in ("\x1b", "\r", "\u202e", "\x07"):
            assert raw not in out, out
    main(["--db", sqlite_url, "show", str(mid)])
    out = capsys.readouterr().out
    assert "order.\\x1b[2K\\r" in out
    assert "x\\u202eevil" in out


@pytest.fixture
def role_without_create(pg_admin: Engine) -> Iterator[str]:
    """A login role with USAGE but not CREATE on a schema of its own; a URL as that role."""
    name = f"t_nocreate_{uuid.uuid4().hex[:8]}"
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{name}" LOGIN')
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        conn.exec_driver_sql(f'GRANT USAGE ON SCHEMA "{schema}" TO "{name}"')
    base = PG_ADMIN_URL.split("://", 1)[1].split("@", 1)[1]
    yield f"postgresql+psycopg://{name}@{base}?options=-csearch_path%3D{schema}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        conn.exec_driver_sql(f'DROP OWNED BY "{name}"')
        conn.exec_driver_sql(f'DROP ROLE "{name}"')


def test_migrate_without_create_names_the_privilege(
    role_without_create: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--db", role_without_create, "migrate"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "lacks the CREATE privilege on schema" in lines[0]
    assert "GRANT CREATE ON SCHEMA" in lines[0]
    assert "Traceback" not in captured.err
