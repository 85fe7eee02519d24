"""The runner's edges with a stub relay: a crash is one log line, a second signal never raises
into the running code and releases through an engine of its own, the schema check stays behind
the store's error boundary."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from relay.errors import SchemaNotFound
from relay.runtime import logs, runner
from relay.runtime.config import RelayConfig
from relay.runtime.telemetry import Telemetry

CONFIG = RelayConfig(db_url="sqlite:///unused.db", listen=False)


@dataclass
class _Lease:
    rows: dict[int, object]


@dataclass
class StubStore:
    released: list[tuple[uuid.UUID, list[int]]] = field(default_factory=list)
    closed: bool = False

    def release(
        self, token: uuid.UUID, seqs: list[int], *, delay_seconds: float, error: str
    ) -> int:
        self.released.append((token, seqs))
        return len(seqs)

    def close(self) -> None:
        self.closed = True


class StubRelay:
    """Runs `body` as its loop; records what the runner asks of it."""

    def __init__(self, body: Any) -> None:
        self.body = body
        self.store = StubStore()
        self._leases = {uuid.uuid4(): _Lease({1: None, 2: None})}
        self.stop_requested = False
        self.released_with_own_store = 0
        self.failure: str | None = None  # why it stopped on its own (a source it lost)

    def request_stop(self) -> None:
        self.stop_requested = True

    def wake(self) -> None:
        pass

    def run(self) -> None:
        self.body(self)

    def release_all(self, why: str) -> int:
        self.released_with_own_store += 1
        return 0


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    made: dict[str, Any] = {}

    def build(config: RelayConfig, telemetry: Telemetry | None = None) -> StubRelay:
        return cast(StubRelay, made["relay"])

    monkeypatch.setattr(runner, "build_relay", build)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield made
    for s, handler in saved.items():
        signal.signal(s, handler)


def _run() -> int:
    return runner._run(CONFIG, cast(Telemetry, None))


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_a_crash_is_one_log_line_with_the_traceback_only_at_debug(
    level: str, stub: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    def crash(_relay: StubRelay) -> None:
        raise RuntimeError("row 7 broke\nthe loop")

    stub["relay"] = StubRelay(crash)
    logs.setup(level)
    assert _run() == 1
    err = capsys.readouterr().err
    crashed = [line for line in err.splitlines() if "relay.crashed" in line]
    assert len(crashed) == 1, err
    assert "RuntimeError: row 7 broke the loop" in crashed[0]
    assert ("Traceback" in err) is (level == "DEBUG"), err
    if level == "INFO":
        assert len(err.splitlines()) == 1, err


def test_a_relay_that_stopped_on_its_own_exits_1(stub: dict[str, Any]) -> None:
    def lose_the_source(relay: StubRelay) -> None:
        relay.failure = "replication slot 'outbox_relay' was invalidated"

    stub["relay"] = StubRelay(lose_the_source)
    assert _run() == 1


def test_a_second_signal_never_raises_into_the_loop_and_releases_on_a_fresh_store(
    stub: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    exited = threading.Event()
    fresh = StubStore()
    monkeypatch.setattr(runner, "open_store", lambda *a, **k: fresh)
    monkeypatch.setattr(os, "_exit", lambda code: exited.set())
    interrupted: list[BaseException] = []

    def busy_in_the_driver(relay: StubRelay) -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # drain, please
            os.kill(os.getpid(), signal.SIGTERM)  # now
            # Where the main thread may be when the second signal lands: psycopg, the pool.
            assert exited.wait(10), "the process did not leave after the second signal"
        except BaseException as exc:
            interrupted.append(exc)
            raise

    relay = StubRelay(busy_in_the_driver)
    stub["relay"] = relay
    logs.setup("INFO")
    _run()
    assert interrupted == []
    assert relay.stop_requested
    # Released through a store of its own, never the engine the main thread was inside.
    assert [seqs for _, seqs in fresh.released] == [[1, 2]]
    assert fresh.closed
    assert relay.released_with_own_store == 0
    assert "relay.aborted" in capsys.readouterr().err
    # A third signal is not caught any more: it ends the process at once.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_the_schema_check_asks_the_store() -> None:
    class NoEngine:
        @property
        def engine(self) -> Any:
            raise AssertionError("check_schema read the engine outside the store")

        def schema_version(self) -> int:
            raise SchemaNotFound("database down or never migrated")

    with pytest.raises(SchemaNotFound):
        runner.check_schema(cast(Any, NoEngine()))
