"""Wires the relay's parts together for `outbox-relay run`, and handles signals."""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

from outbox.schema import SCHEMA_VERSION
from relay.amqp.publisher import Publisher
from relay.core.urls import secrets_of
from relay.errors import ConfigError, RelayError, SchemaNotFound
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.runtime.config import RelayConfig
from relay.runtime.health import HealthServer
from relay.runtime.logs import one_line
from relay.runtime.telemetry import Telemetry, setup
from relay.runtime.wakeup import listener_for
from relay.store.sql_store import SqlStore, open_store

log = logging.getLogger("relay")


# How long a second signal waits for the held rows to be released before the process exits.
ABORT_RELEASE_TIMEOUT = 5.0


def check_schema(store: SqlStore) -> None:
    """Fail fast, with a clear message, when the schema is missing or older than this relay."""
    version = store.schema_version()  # behind the store's error boundary: one line if it fails
    if version == 0:
        raise SchemaNotFound("the outbox tables do not exist: run `outbox-relay migrate`")
    if version < SCHEMA_VERSION:
        raise SchemaNotFound(
            f"the outbox schema is version {version}, this relay needs {SCHEMA_VERSION}: "
            "run `outbox-relay migrate`"
        )


def build_relay(config: RelayConfig, telemetry: Telemetry | None = None) -> Relay:
    store = open_store(
        config.db_url,
        hold_dead_keys=config.hold_dead_keys,
        scope=config.circuit_scope,
        statement_timeout=config.statement_timeout,
    )
    check_schema(store)
    publisher = Publisher(
        config.amqp_url,
        confirm_timeout=config.confirm_timeout,
        name=f"outbox-relay {config.relay_id}",
        tls=config.amqp_tls,
    )
    publisher.start()
    return wire_relay(store, publisher, config, telemetry=telemetry)


def bind_http(config: RelayConfig, relay: list[Relay], telemetry: Telemetry) -> HealthServer | None:
    """Bind the HTTP port before anything connects, so a port in use fails at once (exit 2).
    `relay` is filled in once the relay is built; until then the endpoints say not ready."""
    if not config.http_port:
        return None

    def database() -> None:
        if not relay:
            raise RuntimeError("starting")
        relay[0].store.ping()

    try:
        return HealthServer(
            config.http_host,
            config.http_port,
            heartbeat=lambda: relay[0].heartbeat if relay else float("-inf"),
            # A turn waits at most poll_interval; a settle or claim can take a database timeout.
            stale_after=max(30.0, 10 * config.poll_interval),
            database=database,
            broker_ready=lambda: bool(relay) and relay[0].publisher.ready,
            broker_node=lambda: _broker_node(relay),
            registry=telemetry.registry,
            problem=lambda: relay[0].problem() if relay else None,
        )
    except OSError as exc:
        raise ConfigError(
            f"--http-port: cannot listen on {config.http_host}:{config.http_port}: {exc.strerror}"
        ) from None


def _broker_node(relay: list[Relay]) -> str | None:
    """The node of the broker (cluster) the relay's publisher is connected to, if any."""
    publisher = relay[0].publisher if relay else None
    return publisher.node if isinstance(publisher, Publisher) else None


def run_relay(config: RelayConfig) -> int:
    telemetry = setup(prometheus=bool(config.http_port))
    try:
        return _run(config, telemetry)
    finally:
        telemetry.shutdown()  # flushes the last spans of the drain


def _run(config: RelayConfig, telemetry: Telemetry) -> int:
    built: list[Relay] = []
    http = bind_http(config, built, telemetry)
    try:
        relay = build_relay(config, telemetry)
    except BaseException:
        if http is not None:
            http.stop()
        raise
    built.append(relay)
    if http is not None:
        http.start()
    signals = 0
    # The second signal only sets this: raising from the handler would land at an arbitrary
    # point of the main thread (inside psycopg or the pool), leaving the engine in a state no
    # one should reuse. The abort thread releases through an engine of its own, then exits.
    abort = threading.Event()
    threading.Thread(
        target=_abort_when, args=(abort, relay, config), name="abort", daemon=True
    ).start()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            relay.request_stop()
            return
        # A third signal kills the process at once, should the abort itself hang.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        abort.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    listener = listener_for(config.db_url, relay.wake) if config.listen else None
    if listener is not None:
        listener.start()
    try:
        relay.run()
    except Exception as exc:
        # A bug or an unexpected database error: say so, in one line (the traceback at DEBUG),
        # and exit non-zero. Leased rows come back when their lease expires: nothing is lost.
        reason = one_line(
            f"{type(exc).__name__}: {exc}", secrets_of(config.db_url, config.amqp_url)
        )
        log.error(
            "relay.crashed",
            extra={"error": reason},
            exc_info=log.isEnabledFor(logging.DEBUG),
        )
        relay.release_all("relay crashed")
        return 1
    finally:
        if listener is not None:
            listener.stop()
        if http is not None:
            http.stop()
        relay.store.close()
    return 0


def _abort_when(requested: threading.Event, relay: Relay, config: RelayConfig) -> None:
    """After a second signal: release what the relay holds, bounded, and leave at once.

    Rows still leased are released so another relay can take them now; any this fails to
    release (the database is slow or gone) come back when their lease expires. Nothing is lost.
    """
    requested.wait()
    released: list[int] = []
    worker = threading.Thread(
        target=lambda: released.append(_release_held(relay, config)), name="abort-release"
    )
    worker.daemon = True
    worker.start()
    worker.join(ABORT_RELEASE_TIMEOUT)
    log.warning("relay.aborted", extra={"released": released[0] if released else "unknown"})
    logging.shutdown()
    os._exit(1)


def _release_held(relay: Relay, config: RelayConfig) -> int:
    """Release the rows `relay` holds through a store of its own: the relay's engine may be in
    use by the main thread, which goes on running until the process exits."""
    why = "relay interrupted by a second signal"
    store = open_store(
        config.db_url,
        check=False,
        hold_dead_keys=config.hold_dead_keys,
        scope=config.circuit_scope,
    )
    released = 0
    try:
        # A snapshot (list() of a dict is atomic under the GIL); the release statements are
        # guarded by lease token, so a batch the main thread settles meanwhile is not touched.
        for token, lease in list(relay._leases.items()):
            try:
                released += store.release(token, list(lease.rows), delay_seconds=0.0, error=why)
            except RelayError as exc:
                log.error("relay.release_failed", extra={"error": str(exc)})
    finally:
        store.close()
    return released
