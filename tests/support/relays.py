"""In-process relays on the real store and publisher: `relay_factory` runs them in a thread
(stopped and joined at teardown) or hands them over to be driven pass by pass with `drive()`."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest

from relay.amqp.publisher import Publisher
from relay.core.policy import RetryPolicy
from relay.loop.counts import Counts
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.runtime.config import RelayConfig
from relay.runtime.telemetry import Telemetry
from relay.store.sql_store import open_store


class RelayFactory(Protocol):
    def __call__(
        self, db_url: str, *, run: bool = ..., telemetry: Telemetry | None = ..., **config: Any
    ) -> Relay: ...


@dataclasses.dataclass
class _Running:
    relay: Relay
    thread: threading.Thread | None
    summary: Counts | None = None
    error: BaseException | None = None


# Fast loop, short drain; a relay built by a test may override any of them.
RELAY_TEST_CONFIG: dict[str, Any] = {
    "poll_interval": 0.05,
    "reclaim_interval": 0.1,
    "confirm_timeout": 5.0,
    "lease_seconds": 10.0,
    "drain_timeout": 5.0,
    # Unroutable messages dead at once, as the tests of dead messages want them; the grace a
    # relay gives them by default has tests of its own (test_unroutable_grace.py).
    "policy": RetryPolicy(unroutable_grace=0.0),
}


@pytest.fixture
def relay_factory(amqp_url: str) -> Iterator[RelayFactory]:
    """Build in-process relays on the real store and publisher.

    `relay_factory(db_url, **config)` returns a relay whose `run()` loop is already going in a
    thread; `run=False` returns one to drive by hand with `drive()` (or `run_once()`). Config
    keys are `RelayConfig` fields over `RELAY_TEST_CONFIG`. At teardown every running relay is
    asked to stop and joined (its `run()` must return), and every store and publisher closed.
    """
    built: list[_Running] = []

    def factory(
        db_url: str, *, run: bool = True, telemetry: Telemetry | None = None, **config: Any
    ) -> Relay:
        settings = {**RELAY_TEST_CONFIG, **config}
        cfg = RelayConfig(
            db_url=db_url,
            amqp_url=amqp_url,
            relay_id=f"test-relay-{uuid.uuid4().hex[:8]}",
            **settings,
        )
        store = open_store(db_url, hold_dead_keys=cfg.hold_dead_keys, scope=cfg.circuit_scope)
        publisher = Publisher(
            amqp_url, confirm_timeout=cfg.confirm_timeout, name=cfg.relay_id, signing=cfg.keyring
        )
        try:
            publisher.start()
        except BaseException:
            store.close()
            raise
        relay = wire_relay(store, publisher, cfg, telemetry=telemetry)
        entry = _Running(relay, None)
        if run:

            def target() -> None:
                try:
                    entry.summary = relay.run()
                except BaseException as exc:  # reported at teardown
                    entry.error = exc

            entry.thread = threading.Thread(target=target, name=cfg.relay_id, daemon=True)
        built.append(entry)
        if entry.thread is not None:
            entry.thread.start()
        return relay

    yield factory

    problems: list[str] = []
    for entry in built:
        relay = entry.relay
        if entry.thread is not None:
            relay.request_stop()
            entry.thread.join(relay.config.drain_timeout + 15)
            if entry.thread.is_alive():
                problems.append(f"{relay.config.relay_id}: run() did not return after stop")
            elif entry.error is not None:
                problems.append(f"{relay.config.relay_id}: run() raised {entry.error!r}")
        else:
            relay.publisher.stop(5.0)
        relay.store.close()
    if problems:
        pytest.fail("; ".join(problems))


def drive(
    relay: Relay, until: Callable[[Counts], bool], *, timeout: float = 10.0, what: str = ""
) -> list[Counts]:
    """Call `relay.run_once()` until `until(pass_result)` holds; return every pass's result.

    Publishing is asynchronous (the broker's confirms come back on the publisher's thread), so a
    claim is settled by a later pass: this polls, with a short pause between idle passes.
    """
    deadline = time.monotonic() + timeout
    results: list[Counts] = []
    while True:
        result = relay.run_once()
        results.append(result)
        if until(result):
            return results
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s driving the relay until {what or until!r}")
        if not result.claimed:
            time.sleep(0.005)


def drive_until_settled(relay: Relay, total: int, *, timeout: float = 10.0) -> list[Counts]:
    """Drive until `total` messages have been settled (published, retried or dead)."""
    settled = 0

    def done(result: Counts) -> bool:
        nonlocal settled
        settled += result.published + result.retried + result.dead
        return settled >= total

    return drive(relay, done, timeout=timeout, what=f"{total} messages settled")
