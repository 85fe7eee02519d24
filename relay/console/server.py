"""The console served by uvicorn in a thread of its own: `open_console` wires the database, the
gate and the Starlette application (web.py), and binds at once (so a port in use fails before
anything else starts); the server serves from start() until stop().

Slow or idle clients cost a socket and a few objects, never a thread: uvicorn reads every
connection on one event loop. Bounds: at most MAX_CONNECTIONS open connections (a 503 beyond);
a request's head (line and headers) complete within HEAD_DEADLINE seconds of the connection (or
of the previous answer) and at most MAX_HEAD bytes, else the connection is closed; an idle
keep-alive connection closed after KEEP_ALIVE seconds.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from outbox.schema import SCHEMA_VERSION
from relay.console.app import Console
from relay.console.auth import Gate, is_loopback
from relay.console.monitor import Monitor
from relay.console.web import create_app
from relay.errors import PermissionDenied, SchemaNotFound
from relay.store.engines import make_engine
from relay.store.sql_store import SqlStore, open_store

# The console's own budgets (seconds): a page's queries are index scans, but a count over a
# large filter may take a while; none should hold a connection for ever.
STATEMENT_TIMEOUT = 60.0
POOL_TIMEOUT = 10.0
POOL_SIZE = 4
# A filter no index serves, unbounded by state or time (api.unbounded_scan), runs on engines of
# its own: so many seconds at most, two at a time, whoever asks.
SCAN_TIMEOUT = 3.0
SCAN_POOL = 2
MAX_CONNECTIONS = 1000
HEAD_DEADLINE = 10.0
MAX_HEAD = 16 * 1024
KEEP_ALIVE = 5
BACKLOG = 1024

log = logging.getLogger("relay")


def _protocol(head_deadline: float) -> type[H11Protocol]:
    class HeadDeadline(H11Protocol):
        """uvicorn's HTTP/1.1 protocol, with a deadline for each request's head: its keep-alive
        timer restarts with every byte, so on its own a client sending a byte a second would hold
        the connection for ever."""

        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._deadline is not None and self.conn.their_state is not h11.IDLE:
                self._deadline.cancel()  # the head is in: the request is being served
                self._deadline = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(head_deadline, self._too_slow)

        def _too_slow(self) -> None:
            self._deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeadDeadline


class ConsoleServer:
    """Binds at once; serves from start() until stop()."""

    def __init__(
        self,
        console: Console,
        host: str,
        port: int,
        *,
        close: Any = lambda: None,
        head_deadline: float = HEAD_DEADLINE,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.console = console
        self._close = close
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named, so asyncio sets TCP_NODELAY on each accepted connection (it checks
        # the protocol): without it an answer's second write waits for a delayed ACK.
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind((host.strip("[]"), port))
            self._socket.listen(BACKLOG)
        except BaseException:
            self._socket.close()
            raise
        self.host = host
        self.port = int(self._socket.getsockname()[1])
        config = uvicorn.Config(
            create_app(console, loopback_only=is_loopback(host)),
            http=_protocol(head_deadline),
            lifespan="off",
            log_config=None,
            access_log=False,
            proxy_headers=False,  # the peer's address is the client: no header may claim another
            server_header=False,
            limit_concurrency=max_connections,
            timeout_keep_alive=KEEP_ALIVE,
            h11_max_incomplete_event_size=MAX_HEAD,
            backlog=BACKLOG,
            timeout_graceful_shutdown=5,
        )
        # uvicorn's own start and stop lines ("Started server process", "Uvicorn running on")
        # say what console.listening says, and from another thread, so they may come first: its
        # warnings and errors still show.
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name="console-http",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> None:
        self.console.monitor.start()
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join(30)
        self._socket.close()
        self.console.monitor.stop()
        self._close()


def _check_schema(store: SqlStore) -> None:
    try:
        version = store.schema_version()
    except PermissionDenied:
        # A read-only role (grants --viewer) may not read the version table: its pages still
        # work, and a missing table says so when a page needs it.
        return
    if version < SCHEMA_VERSION:
        raise SchemaNotFound(
            f"the outbox schema is version {version}, the console needs {SCHEMA_VERSION}: "
            "run `outbox-relay migrate`"
        )


def open_console(
    db_url: str,
    *,
    host: str,
    port: int,
    token: str | None,
    trace_url: str | None,
    open_reads: bool = False,
) -> ConsoleServer:
    """The console on `db_url`, bound to host:port (0: any free port), not serving yet; reads
    need the token unless `open_reads` (a loopback address only: every local account, and every
    container of a pod, shares loopback).
    OSError when the port cannot be bound; the store's errors when the database cannot be read."""
    store = open_store(db_url, statement_timeout=STATEMENT_TIMEOUT)
    engine = make_engine(
        db_url,
        autocommit=False,
        pool_size=POOL_SIZE,
        statement_timeout=STATEMENT_TIMEOUT,
        pool_timeout=POOL_TIMEOUT,
    )

    scans = make_engine(
        db_url,
        autocommit=False,
        pool_size=SCAN_POOL,
        statement_timeout=SCAN_TIMEOUT,
        pool_timeout=POOL_TIMEOUT,
    )

    def close() -> None:
        engine.dispose()
        scans.dispose()
        store.close()

    try:
        _check_schema(store)
        if open_reads and not is_loopback(host):
            raise ValueError(f"reads may be open on a loopback address only, not {host}")
        gate = Gate(token, open_reads=open_reads)
        console = Console(
            engine=engine,
            scans=scans,
            scan_timeout=SCAN_TIMEOUT,
            store=store,
            gate=gate,
            monitor=Monitor(store, engine),
            trace_url=trace_url,
        )
        return ConsoleServer(console, host, port, close=close, head_deadline=HEAD_DEADLINE)
    except BaseException:
        close()
        raise
