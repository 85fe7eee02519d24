"""Who reaches the console, each against a finding of a security review: failed logins and
tokens are rate limited per client, a weak token is refused at start, reads need the token, and
500 clients trickling their requests do not stop anyone else (real HTTP clients and sockets)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import statistics
import time

import pytest
from sqlalchemy import Engine

from relay.console import server as console_server
from relay.console.server import ConsoleServer, open_console
from tests.integration.test_console_api import TOKEN, bearer, client, enqueue
from tests.integration.test_console_input import pg_console  # noqa: F401  # the fixture, by name
from tests.support.cli import assert_one_line_error, cli, environment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


# --------------------------------------------------------------------------- finding 9


def test_failed_logins_and_tokens_are_rate_limited_per_client(pg_console: ConsoleServer) -> None:  # noqa: F811
    origin = pg_console.url.rstrip("/")
    with client(pg_console, Origin=origin) as http:
        statuses = [
            http.post("/login", data={"token": f"guess-{n:04d}-guess", "name": "m"}).status_code
            for n in range(30)
        ]
        wrong_bearer = http.get("/api/messages", headers={"Authorization": "Bearer guess"})
    assert set(statuses[:5]) == {403}, statuses
    assert statuses[-1] == 429, statuses
    assert wrong_bearer.status_code == 429
    assert "Retry-After" in wrong_bearer.headers


@pytest.mark.parametrize(
    "token", ["aaaaaaaaaaaaaaaa", "abababababababababababababababab", "x" * 64]
)
def test_a_token_under_128_bits_is_refused_at_start_in_one_line(token: str) -> None:
    done = cli(
        "console", "--http-port", "0", "--db", "sqlite:///unused.db",
        env=environment(OUTBOX_CONSOLE_TOKEN=token), timeout=15,
    )  # fmt: skip
    line = assert_one_line_error(done, 2)
    assert "OUTBOX_CONSOLE_TOKEN" in line
    assert "128 bits" in line
    assert token not in line


# --------------------------------------------------------------------------- finding 10


def test_reads_on_loopback_need_the_token(pg_console: ConsoleServer, pg_engine: Engine) -> None:  # noqa: F811
    (pending,) = enqueue(pg_engine, 1)
    with client(pg_console) as anonymous:
        for path in ("/api/messages", f"/api/messages/{pending}", "/api/overview", "/api/groups"):
            refused = anonymous.get(path)
            assert refused.status_code == 401, path
            assert str(pending) not in refused.text
            assert anonymous.head(path).status_code == 401, path
        page = anonymous.get(f"/messages/{pending}")
        assert str(pending) not in page.text
        assert page.status_code in (303, 401)
    with bearer(pg_console) as http:
        assert http.get(f"/api/messages/{pending}").status_code == 200


# --------------------------------------------------------------------------- finding 5

SLOW = 500


def test_500_trickling_clients_do_not_stop_legitimate_requests(
    pg_url: str, pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """500 connections send a request head a byte at a time; meanwhile a client is served as
    usual (latencies reported), and once past the head deadline every slow one is closed."""
    monkeypatch.setattr(console_server, "HEAD_DEADLINE", 2.0, raising=False)
    server = open_console(pg_url, host="127.0.0.1", port=0, token=TOKEN, trace_url=None)
    server.start()
    sel = selectors.DefaultSelector()
    slow: list[socket.socket] = []
    try:
        opened = time.monotonic()
        for _ in range(SLOW):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /api/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            s.setblocking(False)
            slow.append(s)
            sel.register(s, selectors.EVENT_READ)
        latencies: list[float] = []
        with bearer(server) as http:
            while time.monotonic() - opened < 1.5 or len(latencies) < 20:
                for s in slow:  # a byte each, as a trickling client sends
                    with contextlib.suppress(OSError):
                        s.send(b"a")
                started = time.monotonic()
                answer = http.get("/api/messages", params={"limit": 5})
                latencies.append(time.monotonic() - started)
                assert answer.status_code == 200, answer.text
        closed: set[int] = set()
        deadline = time.monotonic() + 5
        while len(closed) < SLOW and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except (ConnectionResetError, BlockingIOError):
                    data = b""
                if not data:
                    closed.add(sock.fileno())
                    sel.unregister(sock)
        took = time.monotonic() - opened
    finally:
        sel.close()
        for s in slow:
            s.close()
        server.stop()
    print(
        f"\n{SLOW} trickling connections: {len(latencies)} requests served, latency median "
        f"{statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms; "
        f"{len(closed)} slow connections closed {took:.1f} s after opening"
    )
    assert max(latencies) < 1.0, latencies
    assert len(closed) == SLOW
