"""The console's HTTP server: the standard library's ThreadingHTTPServer handing each request to
the Console (app.py), and every answer its security headers; `open_console` wires it all."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from outbox.schema import SCHEMA_VERSION
from relay.console.app import MAX_BODY, SECURITY_HEADERS, Console, Request, Response
from relay.console.auth import Gate, is_loopback
from relay.console.monitor import Monitor
from relay.errors import PermissionDenied, SchemaNotFound
from relay.store.engines import make_engine
from relay.store.sql_store import SqlStore, open_store

# The console's own budgets (seconds): a page's queries are index scans, but a count over a
# large filter may take a while; none should hold a connection for ever.
STATEMENT_TIMEOUT = 60.0
POOL_TIMEOUT = 10.0
POOL_SIZE = 4

log = logging.getLogger("relay")


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class ConsoleServer:
    """Binds at once (so a port in use fails before anything else starts); serves from start()
    until stop()."""

    def __init__(
        self, console: Console, host: str, port: int, *, close: Callable[[], None] = lambda: None
    ) -> None:
        self.console = console
        self._close = close

        class Handler(BaseHTTPRequestHandler):
            server_version = "outbox-relay-console"
            sys_version = ""
            timeout = 30  # seconds a connection may sit idle: a slow client cannot hold a thread

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def _serve(self, method: str) -> None:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY:
                    self._send(Response(413, b"request body too large\n", "text/plain"))
                    self.close_connection = True
                    return
                path, _, query = self.path.partition("?")
                request = Request(
                    method=method,
                    path=path,
                    query=query,
                    headers=self.headers,  # type: ignore[arg-type]
                    body=self.rfile.read(length) if length else b"",
                    client=str(self.client_address[0]),
                )
                try:
                    response = console.handle(request)
                except Exception:
                    log.error(
                        "console.request_failed",
                        extra={"method": method, "path": path},
                        exc_info=True,
                    )
                    response = Response(
                        500, b"internal error: see the console's log\n", "text/plain"
                    )
                self._send(response)

            def _send(self, response: Response) -> None:
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(response.body)))
                for name, value in (*SECURITY_HEADERS, *response.headers):
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(response.body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("console.request", extra={"line": format % args})

        console = self.console
        server_class = _Server6 if ":" in host else _Server
        self._httpd = server_class((host.strip("[]"), port), Handler)
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.1,), name="console-http", daemon=True
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
            self._httpd.shutdown()
        self._httpd.server_close()
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
    db_url: str, *, host: str, port: int, token: str | None, trace_url: str | None
) -> ConsoleServer:
    """The console on `db_url`, bound to host:port (0: any free port), not serving yet.
    OSError when the port cannot be bound; the store's errors when the database cannot be read."""
    store = open_store(db_url, statement_timeout=STATEMENT_TIMEOUT)
    engine = make_engine(
        db_url,
        autocommit=False,
        pool_size=POOL_SIZE,
        statement_timeout=STATEMENT_TIMEOUT,
        pool_timeout=POOL_TIMEOUT,
    )

    def close() -> None:
        engine.dispose()
        store.close()

    try:
        _check_schema(store)
        gate = Gate(token, open_reads=is_loopback(host))
        console = Console(
            engine=engine,
            store=store,
            gate=gate,
            monitor=Monitor(store, engine),
            host=host,
            trace_url=trace_url,
        )
        return ConsoleServer(console, host, port, close=close)
    except BaseException:
        close()
        raise
