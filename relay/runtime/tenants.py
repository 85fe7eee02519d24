"""One relay serving several databases (`run --db URL --db URL`, `run --db-file FILE`).

Each database gets what a relay serving it alone would have: its store, leases, keys, circuits,
rate limits, heartbeat and LISTEN, in a loop of its own (relay/loop/relay.py) on a thread of its
own, so that one database that is down, slow or locked holds up no other. Only the broker
connection is shared (relay/amqp/shared.py). A database that cannot be served (unreachable, no
outbox tables) is tried again on its own backoff; one whose loop crashes is restarted the same way.

Each thread's log lines carry `database=NAME` (relay/runtime/logs.py DATABASE), its metrics a
`database` label (relay/runtime/labelled.py), and /readyz lists every database's state.

SIGHUP reads the file again: a database added starts, one removed stops as a relay stops (what
it has in flight is confirmed and settled first, the rest released), one whose URL changed stops
and then starts again with the new URL. A file that cannot be read is said and the list kept.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from types import FrameType

from opentelemetry.trace import Tracer

from relay.amqp.shared import Broker, Share
from relay.core.urls import secrets_of
from relay.errors import ConfigError, RelayError
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.reconnect import Backoff
from relay.runtime import heap
from relay.runtime.config import RelayConfig
from relay.runtime.health import HealthServer
from relay.runtime.labelled import DatabaseMeter, Labelled
from relay.runtime.logs import DATABASE, one_line
from relay.runtime.telemetry import Telemetry
from relay.runtime.tenancy import Database
from relay.runtime.wakeup import listener_for
from relay.store.sql_store import open_store

log = logging.getLogger("relay")

# A database that cannot be served is tried again after this long, doubling up to the cap.
RETRY_FIRST, RETRY_CAP = 1.0, 30.0
# How often the main thread looks at signals and at databases waiting for their turn.
TICK = 0.2


@dataclasses.dataclass
class _Instruments:
    tracer: Tracer | None
    meter: DatabaseMeter
    meter_provider: object | None


class Tenant:
    """One database's loop, on its own thread, rebuilt on its own backoff when it cannot run."""

    def __init__(
        self,
        database: Database,
        config: RelayConfig,
        broker: Broker,
        telemetry: Telemetry,
        labelled: Labelled | None,
    ) -> None:
        self.database = database
        self.config = config.serving(database)
        self._broker = broker
        self._telemetry = telemetry
        self._labelled = labelled
        self.state = "starting"  # "ok" once its loop runs, else why it does not (/readyz)
        self.relay: Relay | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # between request_stop and a relay being built
        self.thread = threading.Thread(target=self._main, name=f"db:{database.name}", daemon=True)

    @property
    def name(self) -> str:
        return self.database.name

    def start(self) -> None:
        self.thread.start()

    def request_stop(self) -> None:
        """Drain and stop (any thread): what is in flight is settled, the rest released."""
        with self._lock:
            self._stopping.set()
            relay = self.relay
        if relay is not None:
            relay.request_stop()

    @property
    def finished(self) -> bool:
        return not self.thread.is_alive()

    def _main(self) -> None:
        DATABASE.set(self.name)  # this thread's context: every line it logs names the database
        retry = Backoff(first=RETRY_FIRST, cap=RETRY_CAP, floor=RETRY_FIRST / 2)
        while not self._stopping.is_set():
            if self._serve():
                retry.succeeded()
                continue
            wait = retry.failed()
            extra = {"error": self.state, "attempt": retry.attempt, "retry_in": round(wait, 3)}
            log.error("relay.database_unavailable", extra=extra)
            self._stopping.wait(wait)
        self.state = "stopped"

    def _serve(self) -> bool:
        """Build the loop and run it until stopped; False when it could not be built."""
        share = self._broker.share()
        meter = self._labelled.meter_for(self.name) if self._labelled is not None else None
        try:
            try:
                relay = self._build(share, meter)
            except Exception as exc:  # said, then tried again: never the end of this database
                said = str(exc) if isinstance(exc, RelayError) else f"{type(exc).__name__}: {exc}"
                self.state = one_line(said, secrets_of(self.database.url))
                return False
            with self._lock:
                self.relay = relay
                if self._stopping.is_set():
                    relay.request_stop()
            self.state = "ok"
            return self._run(relay)
        finally:
            with self._lock:
                self.relay = None
            if meter is not None:
                meter.close()
            share.close()

    def _build(self, share: Share, meter: DatabaseMeter | None) -> Relay:
        from relay.runtime.runner import check_schema, warn_autovacuum  # the one-database path

        config = self.config
        store = open_store(
            config.db_url,
            hold_dead_keys=config.hold_dead_keys,
            scope=config.circuit_scope,
            statement_timeout=config.statement_timeout,
            relaxed_commit=True,
        )
        try:
            check_schema(store, f"database {self.name}")
            warn_autovacuum(store)
            telemetry = self._telemetry
            instruments = None
            if meter is not None:
                instruments = _Instruments(telemetry.tracer, meter, telemetry.meter_provider)
            return wire_relay(
                store,
                share,
                config,
                telemetry=instruments,
                tables=store.table_health if meter is not None else None,
                database=self.name,
            )
        except BaseException:
            store.close()
            raise

    def _run(self, relay: Relay) -> bool:
        """Run the loop until it stops; True if it stopped as asked."""
        config = self.config
        listener = None
        try:
            listener = listener_for(config.db_url, relay.wake) if config.listen else None
            if listener is not None:
                listener.start()
            relay.run()
            return True
        except Exception as exc:
            reason = one_line(f"{type(exc).__name__}: {exc}", secrets_of(config.db_url))
            self.state = f"crashed: {reason}"
            log.error(
                "relay.crashed", extra={"error": reason}, exc_info=log.isEnabledFor(logging.DEBUG)
            )
            relay.release_all("relay crashed")
            return False
        finally:
            if listener is not None:
                listener.stop()
            relay.store.close()


class Tenants:
    """The databases served now, and those waiting for the one they replace to stop."""

    def __init__(
        self,
        config: RelayConfig,
        broker: Broker,
        telemetry: Telemetry,
        labelled: Labelled | None,
    ) -> None:
        self._config = config
        self._broker = broker
        self._telemetry = telemetry
        self._labelled = labelled
        self.serving: dict[str, Tenant] = {}
        self.leaving: list[Tenant] = []  # stopping: draining what they hold
        self._waiting: dict[str, Database] = {}  # to start once their name's leaving one stops
        self.ticked = time.monotonic()  # the supervisor's last turn (for /healthz)

    def apply(self, databases: list[Database]) -> None:
        """Serve exactly `databases`: start the new, stop the removed, restart the changed."""
        wanted = {db.name: db for db in databases}
        for name, tenant in list(self.serving.items()):
            if wanted.get(name) != tenant.database:
                del self.serving[name]
                self.leaving.append(tenant)
                tenant.request_stop()
                log.info("relay.database_removed", extra={"database": name})
        self._waiting = {n: db for n, db in wanted.items() if n not in self.serving}
        self.tick()

    def tick(self) -> None:
        """Forget the stopped; start each waiting database whose name no leaving one holds."""
        self.ticked = time.monotonic()
        self.leaving = [t for t in self.leaving if not t.finished]
        busy = {t.name for t in self.leaving}
        for name, db in list(self._waiting.items()):
            if name in busy:
                continue
            del self._waiting[name]
            tenant = Tenant(db, self._config, self._broker, self._telemetry, self._labelled)
            self.serving[name] = tenant
            log.info("relay.database_added", extra={"database": name})
            tenant.start()

    def stop(self) -> None:
        self._waiting.clear()
        for tenant in self.serving.values():
            tenant.request_stop()
        self.leaving.extend(self.serving.values())
        self.serving.clear()

    def join(self) -> None:
        """Wait for every stopping loop to finish its drain."""
        for tenant in self.leaving:
            tenant.thread.join()
        self.leaving = []

    def all(self) -> list[Tenant]:
        return [*self.serving.values(), *self.leaving]

    def states(self) -> dict[str, str]:
        """Each served database's state, for /readyz: "ok" or why not."""
        found = {}
        for name, tenant in sorted(self.serving.items()):
            relay = tenant.relay
            state = tenant.state
            if relay is not None and state == "ok":
                error = relay.database_error
                state = "ok" if error is None else error
            found[name] = state
        for name in sorted(self._waiting):
            found.setdefault(name, "starting")
        return found


def run_many(config: RelayConfig, telemetry: Telemetry) -> int:
    """`outbox-relay run` over several databases: until SIGTERM/SIGINT; SIGHUP reloads."""
    databases = config.databases()  # a bad file or URL: exit 2 before anything starts
    if config.capture != "table":
        raise ConfigError(
            "--capture logical serves one database: run one relay per database to read their "
            "logs, or use --capture table (the default) with several"
        )
    from relay.runtime.runner import declare_topology, make_publisher

    broker = Broker(make_publisher(config))
    labelled = Labelled(telemetry.meter) if telemetry.meter_provider is not None else None
    tenants = Tenants(config, broker, telemetry, labelled)
    http = _bind_http(config, tenants, broker, telemetry)  # a port in use: exit 2 at once
    try:
        declare_topology(config)
        broker.start()
    except BaseException:
        if http is not None:
            http.stop()
        raise
    log.info("relay.databases", extra={"databases": ",".join(db.name for db in databases)})
    tenants.apply(databases)
    if http is not None:
        http.start()
    heap.settle()
    try:
        _supervise(config, tenants)
    finally:
        tenants.stop()
        tenants.join()
        broker.stop()
        if http is not None:
            http.stop()
    return 0


def _supervise(config: RelayConfig, tenants: Tenants) -> None:
    """Turn until the first SIGTERM/SIGINT; a second releases what is held and exits at once."""
    events: list[int] = []  # appended by the signal handlers; read here

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        events.append(signum)
        if signum != signal.SIGHUP and sum(e != signal.SIGHUP for e in events) >= 2:
            # A third signal kills the process at once, should the abort itself hang.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            threading.Thread(target=_abort, args=(tenants,), name="abort", daemon=True).start()

    for each in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(each, on_signal)
    seen = 0
    while True:
        while seen < len(events):
            event = events[seen]
            seen += 1
            if event == signal.SIGHUP:
                _reload(config, tenants)
            else:
                log.info("relay.stopping", extra={"databases": len(tenants.serving)})
                return
        tenants.tick()
        time.sleep(TICK)


def _reload(config: RelayConfig, tenants: Tenants) -> None:
    try:
        databases = config.databases()
    except ConfigError as exc:
        log.error("relay.reload_failed", extra={"error": one_line(str(exc)), "kept": "previous"})
        return
    log.info("relay.reloaded", extra={"databases": len(databases)})
    tenants.apply(databases)


def _abort(tenants: Tenants) -> None:
    """After a second signal: release what every database's loop holds, bounded, and leave."""
    from relay.runtime.runner import abort, release_held

    def release() -> int:
        held = [(t.relay, t.config) for t in tenants.all() if t.relay is not None]
        return sum(release_held(relay, config) for relay, config in held)

    abort(release)


def _bind_http(
    config: RelayConfig, tenants: Tenants, broker: Broker, telemetry: Telemetry
) -> HealthServer | None:
    if not config.http_port:
        return None

    def freshest() -> float:
        """The freshest loop's turn; with no loop running (every database is being retried),
        the supervisor's: the process is alive, and a restart would cure nothing."""
        beats = [t.relay.heartbeat for t in tenants.serving.values() if t.relay is not None]
        return max(beats, default=tenants.ticked)

    try:
        return HealthServer(
            config.http_host,
            config.http_port,
            heartbeat=freshest,
            stale_after=max(30.0, 10 * config.poll_interval),
            databases=tenants.states,
            broker_ready=lambda: broker.publisher.ready,
            broker_node=lambda: broker.publisher.node,
            registry=telemetry.registry,
        )
    except OSError as exc:
        raise ConfigError(
            f"--http-port: cannot listen on {config.http_host}:{config.http_port}: {exc.strerror}"
        ) from None
