"""The relay's store through a real failover: a primary with a synchronous streaming standby
(tests/faults/pg_standby.py, clusters of this test's own), the primary SIGKILLed and the standby
promoted. On the multi-host URL the store reaches the promoted standby and says which server it
is on; a claim whose answer the crash lost is there, leased, and taken back at once; a read-only
standby answering is not ready (/readyz's ping)."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import create_engine, text

import outbox
from relay.errors import DatabaseUnavailable
from relay.store.sql_store import open_store
from tests.faults.pg_standby import PG_BIN, Pair

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        os.geteuid() != 0 or not (PG_BIN / "initdb").exists(),
        reason="makes clusters as the postgres OS user: needs root and PostgreSQL's binaries",
    ),
]

T = TypeVar("T")
PAIR = Pair(Path("/tmp/outbox-pg-standby-test"), 25442, 25443)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    PAIR.up(synchronous=True)
    try:
        engine = create_engine(PAIR.url())
        outbox.create_schema(engine)
        engine.dispose()
        yield PAIR
    finally:
        PAIR.down()


def states(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT state, count(*) FROM outbox_message GROUP BY state"))
            return {state: int(n) for state, n in found}
    finally:
        engine.dispose()


def until_it_answers(call: Callable[[], T]) -> T:
    """As the relay loop does: a statement on a connection the crash broke fails once, with
    DatabaseUnavailable; the next one gets a new connection."""
    for _ in range(20):
        try:
            return call()
        except DatabaseUnavailable:
            time.sleep(0.1)
    return call()


def test_a_failover_reaches_the_standby_and_takes_back_a_lost_claim(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relay.store")
    writer = create_engine(pair.url())
    with writer.begin() as conn:
        for n in range(5):
            outbox.enqueue(conn, exchange="ex", routing_key="rk", payload=[n], key=f"k{n % 2}")
    writer.dispose()
    store = open_store(pair.url(), relaxed_commit=True)  # the relay loop's store
    standby = open_store(pair.direct_url(pair.standby_port), check=False)
    standby_bound = open_store(pair.url())
    try:
        store.ping()
        assert store.schema_version() > 0  # the loop's engine connects: to the primary
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            standby.ping()  # answers, takes no writes: not ready
        # A claim whose answer the crash is about to lose: the relay holds no lease of it. Made
        # with a synchronous commit (the loop's are not) so the standby surely has it.
        claimed = standby_bound.claim(owner="r1", token=uuid.uuid4(), limit=10, lease_seconds=300.0)
        assert len(claimed) == 2  # the heads of k0 and k1
        pair.kill_primary()
        with pytest.raises(DatabaseUnavailable):
            store.ping()
        pair.promote()
        standby.ping()  # promoted: takes writes now
        assert states(pair.url()) == {"in_flight": 2, "pending": 3}  # synchronous: all there
        taken = until_it_answers(lambda: store.reclaim_strays("r1", [], max_attempts=10))
        assert taken == 2
        assert states(pair.url()) == {"pending": 5}
        said = [r for r in caplog.records if r.getMessage() == "database.connected"]
        assert said[-1].host == f"127.0.0.1:{pair.standby_port}"  # type: ignore[attr-defined]
        assert said[-1].previous == f"127.0.0.1:{pair.primary_port}"  # type: ignore[attr-defined]
    finally:
        store.close()
        standby.close()
        standby_bound.close()
