"""What the console makes of what it is sent, each against a finding of a security review: a
chunked body is read (a dry run stays one), every bad value is a 400 naming its field, text
filters are bounded and an unindexed one runs under a short timeout, one client cannot take the
pool, and names with bidirectional characters round-trip through the page's forms (real HTTP
clients and raw sockets)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine

import outbox
from outbox.schema import message
from relay.console import server as console_server
from relay.console.server import ConsoleServer, open_console
from tests.integration.test_console_api import TOKEN, bearer, enqueue, kill, row
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def pg_console(pg_url: str, pg_engine: Engine) -> Iterator[ConsoleServer]:
    server = open_console(pg_url, host="127.0.0.1", port=0, token=TOKEN, trace_url=None)
    server.start()
    yield server
    server.stop()


def raw_request(server: ConsoleServer, head: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request written to a socket as given; the answer's status and body."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


# --------------------------------------------------------------------------- finding 3


def test_a_chunked_body_is_read_so_a_dry_run_changes_nothing(
    pg_console: ConsoleServer, pg_engine: Engine
) -> None:
    (dead,) = enqueue(pg_engine, 1)
    kill(pg_engine, [dead], "rejected")
    body = b'{"dry_run": true}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    status, answer = raw_request(
        pg_console,
        f"POST /api/messages/{dead}/discard HTTP/1.1\nHost: 127.0.0.1\n"
        f"Authorization: Bearer {TOKEN}\nContent-Type: application/json\n"
        "Transfer-Encoding: chunked\nConnection: close\n",
        chunked,
    )
    assert status == 200, answer
    assert b'"dry_run": true' in answer or b'"dry_run":true' in answer, answer
    assert row(pg_engine, dead).state == "dead"


# --------------------------------------------------------------------------- findings 6 and 7


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/messages/{id}/priority", {"priority": "²"}, "priority"),
        ("/api/messages/{id}/priority", {"priority": "9" * 5000}, "priority"),
        ("/api/messages/{id}/priority", {"priority": "٣"}, "priority"),
        ("/api/messages/replay", {"filter": {"state": "dead", "exchange": "a\x00b"}}, "exchange"),
        ("/api/messages/replay", {"filter": {"state": "dead", "key": "k" * 201}}, "key"),
    ],
)
def test_a_bad_value_in_an_action_is_a_400_naming_its_field(
    pg_console: ConsoleServer, pg_engine: Engine, path: str, body: dict[str, object], field: str
) -> None:
    (pending,) = enqueue(pg_engine, 1)
    with bearer(pg_console) as http:
        answer = http.post(path.format(id=pending), json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith(field), answer.text
    assert (row(pg_engine, pending).state, row(pg_engine, pending).priority) == ("pending", 0)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"exchange": "a\x00b"}, "exchange"),
        ({"error_contains": "x" * 201}, "error_contains"),
        ({"routing_key": "r" * 201}, "routing_key"),
        ({"before": "9" * 5000}, "before"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it_never_an_outage(
    pg_console: ConsoleServer, params: dict[str, str], field: str
) -> None:
    with bearer(pg_console) as http:
        answer = http.get("/api/messages", params=params)
        page = http.get("/messages", params=params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith(field), answer.text
    assert "postgresql" not in answer.text
    assert page.status_code == 400


def test_an_unindexed_filter_without_a_bound_runs_under_a_short_timeout(
    pg_url: str, pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """error_contains on every state is a scan of the whole table: it runs under a short
    statement timeout of its own (here 1 ms, beside 60,000 rows), and the answer says how to
    narrow it."""
    with pg_engine.begin() as conn:
        outbox.enqueue(conn, exchange="ex", routing_key="rk", payload={"n": 0})
        others = ", ".join(c.name for c in message.c if c.name not in ("seq", "id"))
        conn.exec_driver_sql(
            f"INSERT INTO outbox_message (id, {others}) SELECT gen_random_uuid(), {others} "
            "FROM outbox_message, generate_series(1, 60000)"
        )
    monkeypatch.setattr(console_server, "SCAN_TIMEOUT", 0.001, raising=False)
    server = open_console(pg_url, host="127.0.0.1", port=0, token=TOKEN, trace_url=None)
    server.start()
    try:
        with bearer(server) as http:
            answer = http.get("/api/messages", params={"error_contains": "nowhere"})
            bounded = http.get("/api/messages", params={"error_contains": "x", "state": "dead"})
    finally:
        server.stop()
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith("error_contains: no index serves"), answer.text
    assert "state=dead" in answer.json()["error"]
    assert bounded.status_code == 200, bounded.text  # bounded: the usual timeout


def test_one_client_cannot_take_every_connection_of_the_pool(
    pg_console: ConsoleServer, pg_engine: Engine
) -> None:
    """Requests held open by one client (bodies still to come) take its share: it gets 429s,
    another client is served, and once they end, the first is served again."""
    (dead,) = enqueue(pg_engine, 1)
    kill(pg_engine, [dead], "rejected")
    held: list[socket.socket] = []
    other = httpx.HTTPTransport(local_address="127.0.0.2")
    try:
        with bearer(pg_console) as http:
            for _ in range(6):
                s = socket.create_connection(("127.0.0.1", pg_console.port), timeout=10)
                s.sendall(
                    f"POST /api/messages/{dead}/discard HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                    "Content-Length: 100\r\n\r\n{".encode()
                )
                held.append(s)
            wait_until(lambda: http.get("/api/messages").status_code == 429,
                       what="a 429 for the busy client")  # fmt: skip
            auth = {"Authorization": f"Bearer {TOKEN}"}
            base = pg_console.url.rstrip("/")
            with httpx.Client(base_url=base, transport=other, headers=auth) as elsewhere:
                assert elsewhere.get("/api/messages").status_code == 200
            for s in held:
                s.close()
            wait_until(lambda: http.get("/api/messages").status_code == 200,
                       what="the client served again")  # fmt: skip
    finally:
        for s in held:
            s.close()
    assert row(pg_engine, dead).state == "dead"


# --------------------------------------------------------------------------- finding 8

BIDI = "orders\u202eevil"


def test_a_name_with_bidi_characters_shows_escaped_and_round_trips_through_forms(
    pg_console: ConsoleServer, pg_engine: Engine
) -> None:
    (dead,) = enqueue(pg_engine, 1, exchange=BIDI)
    kill(pg_engine, [dead], "rejected")
    with bearer(pg_console) as http:
        page = http.get("/messages", params={"exchange": BIDI, "state": "dead"}).text
    # Shown as text: written out, so it cannot reorder what is around it.
    assert "<td>orders\\u202eevil</td>" in page
    # In the filter form: the raw name, so submitting the form filters by that very name.
    found = re.search(r'<input name="exchange" value="([^"]*)"', page)
    assert found is not None
    assert found.group(1) == BIDI
    assert str(dead) in page
