"""The examples of docs/guides/mysql.md, run as written against the real MariaDB server, with
their URLs pointed at this test's database and their exchange at this test's: the sync example
creates the schema and enqueues (again: the same id, nothing written), the async one enqueues
through asyncmy, and a relay publishes both messages."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from outbox.testing import enqueued
from tests.docs_blocks import block
from tests.support.broker import Broker
from tests.support.relays import RelayFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PAGE = "guides/mysql.md"


def pointed(name: str, mysql_url: str, exchange: str) -> str:
    """The block `name` with each `"mysql+DRIVER://..."` literal on `mysql_url` (same driver)
    and `exchange="orders"` on `exchange`."""
    code = block(PAGE, name)

    def url(match: re.Match[str]) -> str:
        driver = f"mysql+{match.group(1)}"
        return repr(make_url(mysql_url).set(drivername=driver).render_as_string(False))

    changed = re.sub(r'"mysql\+(\w+)://[^"]*"', url, code)
    changed = changed.replace('exchange="orders"', f"exchange={exchange!r}")
    assert changed.count(exchange) == code.count('exchange="orders"') == 1, code
    assert "outbox:secret@db" not in changed, changed
    return changed


def run(code: str, name: str) -> dict[str, Any]:
    defined: dict[str, Any] = {"__name__": f"docs_{name.replace('-', '_')}"}
    try:
        exec(compile(code, f"docs/guides/mysql.md ({name})", "exec"), defined)
    finally:
        engine = defined.get("engine")
        if engine is not None and hasattr(engine, "sync_engine"):
            engine.sync_engine.dispose()
        elif engine is not None:
            engine.dispose()
    return defined


def test_the_documented_examples_enqueue_on_mariadb_and_a_relay_publishes_them(
    mysql_url: str, broker: Broker, relay_factory: RelayFactory
) -> None:
    sync_code = pointed("mysql-enqueue", mysql_url, broker.exchange)
    first = run(sync_code, "mysql-enqueue")["message_id"]
    assert isinstance(first, uuid.UUID)
    # Again, as a second deploy and a retried request would: the schema is there, and the
    # idempotency key answers with the first id.
    assert run(sync_code, "mysql-enqueue")["message_id"] == first

    run(pointed("mysql-enqueue-async", mysql_url, broker.exchange), "mysql-enqueue-async")

    check = create_engine(mysql_url)
    try:
        with check.connect() as conn:
            messages = enqueued(conn)
    finally:
        check.dispose()
    assert sorted(m.payload["id"] for m in messages) == [42, 43]
    assert {m.exchange for m in messages} == {broker.exchange}
    [keyed] = [m for m in messages if m.idempotency_key is not None]
    assert (keyed.id, keyed.idempotency_key) == (first, "order-42-created")

    relay_factory(mysql_url)
    delivered = broker.collect_ids([m.id for m in messages])
    assert sorted(d.body for d in delivered) == [b'{"id":42}', b'{"id":43}']
