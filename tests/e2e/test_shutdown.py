"""Stopping the relay process under load: SIGTERM drains and exits 0; SIGKILL loses nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine

import outbox
from tests.support.broker import AMQP_URL, Broker
from tests.support.cli import environment
from tests.support.db import states
from tests.support.waiting import wait_until

# Full-speed drains: one at a time beside the light tests (make test's --dist loadgroup).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120), pytest.mark.xdist_group("heavy")]

TOTAL = 20_000


def _backlog(engine: Engine, exchange: str) -> list[uuid.UUID]:
    ids: list[uuid.UUID] = []
    for start in range(0, TOTAL, 5_000):
        with engine.begin() as conn:
            ids += [
                outbox.enqueue(conn, exchange=exchange, routing_key="r", payload={"n": n})
                for n in range(start, start + 5_000)
            ]
    return ids


def _relay(db_url: str, cwd: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "relay", "--db", db_url, "--amqp", AMQP_URL, "run",
         "--lease", "4", "--confirm-timeout", "3", "--poll-interval", "0.05", *extra],
        cwd=cwd, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _published(engine: Engine) -> int:
    return states(engine).get("published", 0)


@pytest.mark.parametrize("how", ["sigterm", "sigkill", "two_signals"])
def test_stopping_a_relay_mid_drain_loses_nothing(
    how: str, pg_url: str, pg_engine: Engine, broker: Broker, tmp_path: Path
) -> None:
    ids = _backlog(pg_engine, broker.exchange)
    first = _relay(pg_url, tmp_path)
    wait_until(lambda: _published(pg_engine) >= 2_000, timeout=60, what="the drain under way")
    if how == "sigterm":
        first.send_signal(signal.SIGTERM)
    elif how == "sigkill":
        first.kill()
    else:
        first.send_signal(signal.SIGTERM)
        first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    if how == "sigterm":
        assert first.returncode == 0, err
        assert "relay.stopped" in err
        assert "drained=True" in err
        # Drained: nothing left leased, so a successor can start at once.
        assert states(pg_engine).get("in_flight", 0) == 0
    elif how == "sigkill":
        assert first.returncode == -signal.SIGKILL
    else:
        assert first.returncode in (0, 1), err  # the second signal may land after the drain
    assert "Traceback" not in err
    stopped_at = _published(pg_engine)
    assert stopped_at < TOTAL, "the relay was stopped before it finished"

    second = _relay(pg_url, tmp_path)
    try:
        wait_until(lambda: _published(pg_engine) == TOTAL, timeout=90, what="all published")
    finally:
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=60)
    assert second.returncode == 0
    delivered = broker.finish()
    got = {d.message_id for d in delivered}
    assert got == {str(i) for i in ids}  # every message arrived; none unexpected
    duplicates = len(delivered) - len(got)
    if how == "sigterm":
        assert duplicates == 0  # a graceful stop settles what the broker confirmed
