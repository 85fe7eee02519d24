"""The operator console's JSON API and pages over HTTP, on PostgreSQL and SQLite: filters and
keyset paging, one message, failure groups, every action (one, a selection, a filtered group)
with its dry run and its record of who did it, races with a running relay, the token, the login
session and its CSRF protection, and hostile text escaped in every page."""

from __future__ import annotations

import datetime as dt
import random
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, event, select, update

import outbox
from outbox.schema import attempt, message
from relay.console.auth import IDLE_SECONDS, SESSION_HEADER, Credentials, Denied, Gate
from relay.console.server import ConsoleServer, open_console
from relay.core import circuit
from relay.core.circuit import CircuitSettings
from relay.ports import ResourceRow
from relay.store import admin
from relay.store.engines import make_engine
from relay.store.sql_store import open_store
from tests.integration import test_least_privilege
from tests.integration.test_least_privilege import Roles
from tests.support.broker import Broker
from tests.support.db import make_app_engine, states
from tests.support.relays import RelayFactory, drive
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# The roles `outbox-relay grants` makes, as the least-privilege tests build them (fixtures).
roles = test_least_privilege.roles
granted = test_least_privilege.granted

TOKEN = "console-test-token-0123456789"
TRACE_URL = "https://jaeger.example/trace/{trace_id}"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def console(db_url: str, app_engine: Engine) -> Iterator[ConsoleServer]:
    """A console on `db_url` with a token and a tracing UI, serving on a free port."""
    server = open_console(db_url, host="127.0.0.1", port=0, token=TOKEN, trace_url=TRACE_URL)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def lite_engine(sqlite_url: str) -> Iterator[Engine]:
    """For what does not depend on the database (parsing, auth, escaping): SQLite only."""
    engine = make_app_engine(sqlite_url)
    outbox.create_schema(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def lite(sqlite_url: str, lite_engine: Engine) -> Iterator[ConsoleServer]:
    server = open_console(sqlite_url, host="127.0.0.1", port=0, token=TOKEN, trace_url=TRACE_URL)
    server.start()
    yield server
    server.stop()


def client(server: ConsoleServer, **headers: str) -> httpx.Client:
    return httpx.Client(base_url=server.url.rstrip("/"), headers=headers, timeout=30)


def bearer(server: ConsoleServer, operator: str = "alice") -> httpx.Client:
    return client(server, Authorization=f"Bearer {TOKEN}", **{"X-Outbox-Operator": operator})


def enqueue(engine: Engine, n: int, exchange: str = "orders", **options: Any) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [
            outbox.enqueue(conn, exchange=exchange, routing_key="o.created", payload={"n": i},
                           **options)
            for i in range(n)
        ]  # fmt: skip


def set_rows(engine: Engine, ids: Sequence[uuid.UUID], **values: Any) -> None:
    with engine.begin() as conn:
        conn.execute(update(message).where(message.c.id.in_(list(ids))).values(**values))


def kill(engine: Engine, ids: Sequence[uuid.UUID], error: str) -> None:
    """Make messages dead, as a relay would have, with `error` as their last error."""
    set_rows(engine, ids, state="dead", last_error=error, last_failed_at=dt.datetime.now(dt.UTC))


def row(engine: Engine, message_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(message).where(message.c.id == message_id)).one()


def operator_records(engine: Engine, message_id: uuid.UUID) -> list[Any]:
    stmt = (
        select(attempt)
        .where(attempt.c.message_id == message_id, attempt.c.failure_class == "operator")
        .order_by(attempt.c.id)
    )
    with engine.connect() as conn:
        return list(conn.execute(stmt))


def utc(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


# --------------------------------------------------------------------------- reading


def test_messages_are_filtered_paged_by_keyset_and_shown_one_by_one(
    console: ConsoleServer, app_engine: Engine
) -> None:
    orders = enqueue(app_engine, 5)
    audit = enqueue(app_engine, 2, exchange="audit")
    kill(app_engine, orders[:2], "unroutable: NO_ROUTE")
    with bearer(console) as http:
        pages, cursor = [], None
        while True:
            got = http.get("/api/messages", params={"limit": 3, "before": cursor} if cursor
                           else {"limit": 3}).json()  # fmt: skip
            pages.append([m["id"] for m in got["messages"]])
            if got["older"] is None:
                break
            cursor = got["older"]
        newest_first = [str(i) for i in reversed(orders + audit)]
        assert pages == [newest_first[0:3], newest_first[3:6], newest_first[6:]]
        # From the second page back to the first.
        first = http.get("/api/messages", params={"limit": 3}).json()
        assert first["newer"] is None
        second = http.get("/api/messages", params={"limit": 3, "before": first["older"]}).json()
        back = http.get("/api/messages", params={"limit": 3, "after": second["newer"]}).json()
        assert [m["id"] for m in back["messages"]] == pages[0]
        assert back["newer"] is None

        dead = http.get("/api/messages", params={"state": "dead", "exchange": "orders",
                                                 "error_contains": "NO_ROUTE"}).json()  # fmt: skip
        assert {m["id"] for m in dead["messages"]} == {str(i) for i in orders[:2]}
        assert http.get("/api/messages", params={"exchange": "audit", "state": "pending,dead"}
                        ).json()["messages"][0]["exchange"] == "audit"  # fmt: skip

    # One message: its payload as JSON, text or a hex dump, its trace linked.
    with app_engine.begin() as conn:
        as_json = outbox.enqueue(conn, exchange="x", routing_key="r", payload={"a": [1, 2]},
                                 headers={"tenant": "acme"})  # fmt: skip
        as_text = outbox.enqueue(conn, exchange="x", routing_key="r", payload="héllo\nworld")
        as_bytes = outbox.enqueue(conn, exchange="x", routing_key="r", payload=b"\x00\xffab")
    set_rows(app_engine, [as_json], traceparent=TRACEPARENT)
    with bearer(console) as http:
        shown = http.get(f"/api/messages/{as_json}").json()
        assert shown["payload"] == {"kind": "json", "text": '{\n  "a": [\n    1,\n    2\n  ]\n}',
                                    "size": 11, "truncated": False}  # fmt: skip
        assert shown["headers"] == {"tenant": "acme"}
        assert shown["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
        assert shown["trace_url"] == "https://jaeger.example/trace/0af7651916cd43dd8448eb211c80319c"
        assert http.get(f"/api/messages/{as_text}").json()["payload"]["text"] == "héllo\nworld"
        hexed = http.get(f"/api/messages/{as_bytes}").json()["payload"]
        assert hexed["kind"] == "bytes"
        assert hexed["text"].startswith("00000000  00 ff 61 62")
        page = http.get(f"/messages/{as_json}").text
        assert 'href="https://jaeger.example/trace/0af7651916cd43dd8448eb211c80319c"' in page

        assert http.get(f"/api/messages/{uuid.uuid4()}").status_code == 404
        assert http.get(f"/messages/{uuid.uuid4()}").status_code == 404
        assert http.get("/api/messages/0000000000000000000000000000000z").status_code == 404


def test_dead_messages_are_grouped_by_error_and_a_group_is_replayed_at_once(
    console: ConsoleServer, app_engine: Engine
) -> None:
    unroutable, missing = enqueue(app_engine, 3), enqueue(app_engine, 2)
    other = enqueue(app_engine, 1, exchange="audit")
    kill(app_engine, unroutable, "unroutable (permanent): NO_ROUTE")
    kill(app_engine, missing, "destination_missing: 404 NOT_FOUND - no exchange 'orders'")
    kill(app_engine, other, "unroutable (permanent): NO_ROUTE")
    with bearer(console) as http:
        groups = http.get("/api/groups").json()["groups"]
    assert [(g["exchange"], g["error"], g["count"]) for g in groups] == [
        ("orders", "unroutable (permanent): NO_ROUTE", 3),
        ("orders", "destination_missing: 404 NOT_FOUND - no exchange 'orders'", 2),
        ("audit", "unroutable (permanent): NO_ROUTE", 1),
    ]
    group = {"state": "dead", "exchange": "orders", "error_group": groups[0]["error"]}
    with bearer(console) as http:
        dry = http.post("/api/messages/replay", json={"filter": group, "dry_run": True}).json()
        assert dry["would_change"] == 3
        assert "Replay 3 messages matching state=dead, exchange=orders" in dry["summary"]
        assert states(app_engine) == {"dead": 6}
        done = http.post("/api/messages/replay", json={"filter": group}).json()
    assert done["changed"] == 3
    assert done["summary"].startswith("Replayed 3 messages matching")
    assert {row(app_engine, i).state for i in unroutable} == {"pending"}
    assert {row(app_engine, i).state for i in missing + other} == {"dead"}


# --------------------------------------------------------------------------- acting


def test_each_action_changes_one_message_or_a_selection_and_records_who(
    console: ConsoleServer, app_engine: Engine
) -> None:
    dead, to_discard, to_cancel, later, urgent = enqueue(app_engine, 5)
    kill(app_engine, [dead, to_discard], "rejected")
    with bearer(console, operator="alice") as http:
        # A dry run says what would change and changes nothing.
        dry = http.post(f"/api/messages/{later}/reschedule", json={"in": "2h", "dry_run": True})
        assert dry.json()["would_change"] == 1
        assert operator_records(app_engine, later) == []

        assert http.post(f"/api/messages/{dead}/replay").status_code == 200
        assert http.post(f"/api/messages/{to_discard}/discard").status_code == 200
        assert http.post(f"/api/messages/{to_cancel}/cancel").status_code == 200
        before = dt.datetime.now(dt.UTC)
        moved = http.post(f"/api/messages/{later}/reschedule", json={"in": "2h"})
        assert moved.status_code == 200, moved.text
        at = "2031-01-02T03:04:05+00:00"
        assert http.post(f"/api/messages/{urgent}/reschedule", json={"at": at}).status_code == 200
        assert (
            http.post(f"/api/messages/{urgent}/priority", json={"priority": 9}).status_code == 200
        )

        # Not in a state the action changes: 409, nothing changed.
        refused = http.post(f"/api/messages/{to_discard}/cancel")
        assert refused.status_code == 409
        assert "is discarded; only pending messages" in refused.json()["error"]

    assert row(app_engine, dead).state == "pending"
    assert row(app_engine, dead).replay_count == 1
    assert row(app_engine, to_discard).state == "discarded"
    assert row(app_engine, to_cancel).state == "cancelled"
    due = utc(row(app_engine, later).available_at)
    assert dt.timedelta(hours=2) <= due - before < dt.timedelta(hours=2, minutes=5)
    assert utc(row(app_engine, urgent).available_at) == dt.datetime(2031, 1, 2, 3, 4, 5,
                                                                    tzinfo=dt.UTC)  # fmt: skip
    assert row(app_engine, urgent).priority == 9
    expected = {dead: "replayed", to_discard: "discarded", to_cancel: "cancelled",
                later: "rescheduled"}  # fmt: skip
    for message_id, outcome in expected.items():
        (record,) = operator_records(app_engine, message_id)
        assert (record.outcome, record.relay_id) == (outcome, "console:alice@127.0.0.1")
    rescheduled, prioritized = operator_records(app_engine, urgent)
    assert rescheduled.error == "due at 2031-01-02T03:04:05+00:00"
    assert (prioritized.outcome, prioritized.error) == ("prioritized", "priority 9")

    # A selection: what can change does, and the rest is named.
    pending = enqueue(app_engine, 2)
    (stuck,) = enqueue(app_engine, 1)
    kill(app_engine, [stuck], "rejected")
    ghost = uuid.uuid4()
    ids = [str(i) for i in [*pending, stuck, ghost]]
    with bearer(console) as http:
        dry = http.post("/api/messages/priority", json={"ids": ids, "priority": 3, "dry_run": True})
        assert dry.json()["would_change"] == 2
        assert dry.json()["unchanged"] == {str(stuck): "dead", str(ghost): "not found"}
        assert "Reprioritize 2 of the 4 selected messages to priority 3." in dry.json()["summary"]
        done = http.post("/api/messages/priority", json={"ids": ids, "priority": 3}).json()
    assert sorted(done["changed"]) == sorted(str(i) for i in pending)
    assert done["unchanged"] == {str(stuck): "dead", str(ghost): "not found"}
    assert [row(app_engine, i).priority for i in [*pending, stuck]] == [3, 3, 0]


BAD_REQUESTS = [
    ("/api/messages/{id}/explode", {}, "no action 'explode'"),
    ("/api/messages/{id}/reschedule", {}, "reschedule needs one of at"),
    ("/api/messages/{id}/reschedule", {"at": "10m"}, "is a duration: for a time from now"),
    ("/api/messages/{id}/reschedule", {"at": "tomorrow"}, "at: 'tomorrow' is neither"),
    ("/api/messages/{id}/reschedule", {"in": "soon"}, "in: 'soon' is not a duration"),
    ("/api/messages/{id}/reschedule", {"in": 5}, "in must be text"),
    ("/api/messages/{id}/priority", {"priority": 2**31}, "priority 2147483648 is out of range"),
    ("/api/messages/{id}/priority", {"priority": True}, "priority must be an integer"),
    ("/api/messages/{id}/replay", {"dry_run": "yes"}, "dry_run must be true or false"),
    ("/api/messages/{id}/replay", {"ids": []}, "unknown parameter 'ids'"),
    ("/api/messages/replay", {}, 'give "ids"'),
    ("/api/messages/replay", {"ids": ["nope"]}, "ids must be message ids"),
    ("/api/messages/replay", {"ids": [str(uuid.uuid4())] * 1001}, "at most 1000 ids"),
    ("/api/messages/replay", {"filter": {"state": "x"}}, "unknown state 'x'"),
    ("/api/messages/replay", {"filter": {"colour": "red"}}, "unknown parameter 'colour'"),
    ("/api/messages/cancel", {"filter": {}}, "a filtered group needs at least one filter"),
    ("/api/messages/cancel", {"filter": {"state": ""}}, "a filtered group needs at least one"),
]


def test_a_bad_request_is_a_400_naming_the_problem_and_changes_nothing(
    lite: ConsoleServer, lite_engine: Engine
) -> None:
    (message_id,) = enqueue(lite_engine, 1)
    with bearer(lite) as http:
        for path, body, said in BAD_REQUESTS:
            answer = http.post(path.format(id=message_id), json=body)
            assert answer.status_code == 400, (path, body, answer.text)
            assert said in answer.json()["error"], (path, body)
        for params, said in [
            ({"state": "zombie"}, "state: unknown state 'zombie'"),
            ({"colour": "red"}, "unknown parameter 'colour'"),
            ({"limit": "0"}, "limit: '0' is not a whole number from 1 to 500"),
            ({"failed_since": "yesterday"}, "failed_since: 'yesterday' is neither a duration"),
            ({"before": "1", "after": "2"}, "give before or after, not both"),
        ]:
            answer = http.get("/api/messages", params=params)
            assert answer.status_code == 400, params
            assert said in answer.json()["error"]
        not_json = http.post(f"/api/messages/{message_id}/replay", content=b"[1]",
                             headers={"Content-Type": "application/json"})  # fmt: skip
        assert not_json.json()["error"] == "the body must be a JSON object"
    assert operator_records(lite_engine, message_id) == []
    assert row(lite_engine, message_id).state == "pending"


def test_a_circuit_is_reset_by_hand(lite: ConsoleServer, sqlite_url: str) -> None:
    name = "127.0.0.1:5672/%2F/orders"
    store = open_store(sqlite_url)
    try:
        settings = CircuitSettings(threshold=1, cooldown=300.0, max_cooldown=600.0)

        def fail(r: ResourceRow, now: dt.datetime) -> tuple[ResourceRow, None]:
            opened, _, _ = circuit.record(r.circuit, ["404"], now, settings, random.Random(1))
            return ResourceRow(opened, r.bucket), None

        store.change_resource(name, fail)
        with bearer(lite) as http:
            dry = http.post("/api/circuits/reset", json={"resource": name, "dry_run": True})
            assert "Close the circuit of" in dry.json()["summary"]
            assert store.resources()[0].circuit.state.value == "open"
            done = http.post("/api/circuits/reset", json={"resource": name}).json()
            assert done["was"] == "open"
            assert http.post("/api/circuits/reset", json={"resource": "nope"}).status_code == 404
        assert store.resources()[0].circuit.state.value == "closed"
    finally:
        store.close()


# --------------------------------------------------------------------------- races with a relay


def test_a_message_a_relay_has_claimed_is_not_changed_and_the_answer_says_so(
    db_url: str, console: ConsoleServer, app_engine: Engine, broker: Broker,
    relay_factory: RelayFactory,
) -> None:  # fmt: skip
    relay = relay_factory(db_url, run=False)
    wait_until(lambda: relay.publisher.ready, what="publisher ready")
    (message_id,) = enqueue(app_engine, 1, exchange=broker.exchange)
    relay.run_once()  # claimed and sent; settled by a later pass
    assert row(app_engine, message_id).state == "in_flight"
    before = row(app_engine, message_id)
    with bearer(console) as http:
        for action, body in [("reschedule", {"in": "1h"}), ("priority", {"priority": 5}),
                             ("cancel", {})]:  # fmt: skip
            answer = http.post(f"/api/messages/{message_id}/{action}", json=body)
            assert answer.status_code == 409, answer.text
            assert answer.json()["error"].startswith(f"too late: message {message_id} is in_flight")
    after = row(app_engine, message_id)
    assert (after.available_at, after.priority, after.state) == (
        before.available_at, before.priority, "in_flight",
    )  # fmt: skip
    assert operator_records(app_engine, message_id) == []
    drive(relay, lambda _: row(app_engine, message_id).state == "published", what="published")
    broker.collect_ids([message_id])


def test_cancel_and_priority_racing_a_running_relay_either_win_or_change_nothing(
    db_url: str, console: ConsoleServer, app_engine: Engine, broker: Broker,
    relay_factory: RelayFactory,
) -> None:  # fmt: skip
    """Messages fall due over a second and a half while the relay claims them and two clients
    cancel or reprioritize each one: every answer is either a change that took (a cancelled
    message is never sent) or a 409 that left no trace (the message went out as it was)."""
    with app_engine.begin() as conn:
        ids = [
            outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload={"n": n},
                           delay=n * 0.04)
            for n in range(40)
        ]  # fmt: skip
    relay_factory(db_url)
    answers: dict[uuid.UUID, int] = {}

    def hammer(mine: Sequence[uuid.UUID], action: str, body: dict[str, Any]) -> None:
        with bearer(console) as http:
            for i in mine:
                answers[i] = http.post(f"/api/messages/{i}/{action}", json=body).status_code

    threads = [
        threading.Thread(target=hammer, args=(ids[0::2], "cancel", {})),
        threading.Thread(target=hammer, args=(ids[1::2], "priority", {"priority": 7})),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == len(ids)
    assert set(answers.values()) <= {200, 409}

    def settled() -> bool:
        now = states(app_engine)
        return now.get("pending", 0) + now.get("in_flight", 0) == 0

    wait_until(settled, timeout=30, what="every message settled")
    cancelled = {i for i in ids[0::2] if answers[i] == 200}
    received = {d.message_id for d in broker.finish()}
    assert received == {str(i) for i in ids if i not in cancelled}  # a won cancel: never sent
    for i in ids:
        r, records = row(app_engine, i), operator_records(app_engine, i)
        if answers[i] == 200:
            assert r.state == ("cancelled" if i in cancelled else "published")
            assert [x.outcome for x in records] == ["cancelled" if i in cancelled else
                                                    "prioritized"]  # fmt: skip
            assert r.priority == (0 if i in cancelled else 7)
        else:  # too late: the relay had it, and the row shows no trace of the attempt
            assert (r.state, r.priority, records) == ("published", 0, [])


# --------------------------------------------------------------------------- who may act


def test_a_missing_or_wrong_token_gets_401_or_403_and_changes_nothing(
    lite: ConsoleServer, lite_engine: Engine
) -> None:
    (dead,) = enqueue(lite_engine, 1)
    kill(lite_engine, [dead], "rejected")
    url = f"/api/messages/{dead}/replay"
    with client(lite) as anonymous:
        refused = anonymous.post(url)
        assert refused.status_code == 401
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert anonymous.get("/api/messages").status_code == 401  # reads need the token too
    with client(lite, Authorization="Bearer not-the-token") as wrong:
        assert wrong.post(url).status_code == 403
    with client(lite, Authorization=f"Bearer {TOKEN}x") as almost:
        assert almost.post(url).status_code == 403
    with client(lite, Host="evil.example") as rebound:  # DNS rebinding: not our name
        assert rebound.get("/api/messages").status_code == 421
    assert row(lite_engine, dead).state == "dead"
    assert operator_records(lite_engine, dead) == []


def test_a_console_without_a_token_only_reads(sqlite_url: str, lite_engine: Engine) -> None:
    (dead,) = enqueue(lite_engine, 1)
    kill(lite_engine, [dead], "rejected")
    server = open_console(sqlite_url, host="127.0.0.1", port=0, token=None, trace_url=None,
                          open_reads=True)  # fmt: skip
    server.start()
    try:
        with client(server, Authorization=f"Bearer {TOKEN}") as http:
            assert http.get(f"/api/messages/{dead}").status_code == 200
            refused = http.post(f"/api/messages/{dead}/replay")
            assert refused.status_code == 403
            assert "OUTBOX_CONSOLE_TOKEN" in refused.json()["error"]
            assert "read-only" in http.get("/").text
    finally:
        server.stop()
    assert row(lite_engine, dead).state == "dead"


def test_beyond_loopback_reads_need_the_token_too() -> None:
    gate = Gate(TOKEN, open_reads=False)

    def creds(**kw: str | None) -> Credentials:
        base: dict[str, Any] = {"authorization": None, "session": None, "origin": None,
                                "host": "console.example", "operator": None,
                                "client": "10.0.0.7"}  # fmt: skip
        return Credentials(**(base | kw))

    assert gate.check(creds(), write=False) == Denied(
        401, "log in, or send Authorization: Bearer <OUTBOX_CONSOLE_TOKEN>")  # fmt: skip
    assert isinstance(gate.check(creds(authorization="Bearer nope"), write=False), Denied)
    allowed = gate.check(creds(authorization=f"Bearer {TOKEN}"), write=False)
    assert not isinstance(allowed, Denied)
    assert allowed.who == "console:token@10.0.0.7"


def test_the_login_form_gives_the_page_a_session_whose_actions_need_its_origin(
    lite: ConsoleServer, lite_engine: Engine
) -> None:
    (dead,) = enqueue(lite_engine, 1)
    kill(lite_engine, [dead], "rejected")
    url = f"/api/messages/{dead}/replay"
    origin = lite.url.rstrip("/")
    with client(lite) as browser:
        wrong = browser.post("/login", data={"token": "guess-guess-guess", "name": "mallory"})
        assert wrong.status_code == 403
        assert "wrong token" in wrong.text
        signed_in = browser.post("/login", data={"token": TOKEN, "name": "bob"})
        assert signed_in.status_code == 200
        assert "Set-Cookie" not in signed_in.headers  # a cookie would go to every local port
        marker = '<meta name="console-session" content="'
        session = signed_in.text.split(marker, 1)[1].split('"', 1)[0]
        assert len(session) > 40
        assert browser.get(f"/messages/{dead}").status_code == 401  # no session, no page
        mine = {SESSION_HEADER: session}
        page = browser.get(f"/messages/{dead}", headers=mine).text
        assert "signed in as <b>bob</b>" in page
        planted = [(SESSION_HEADER, session), (SESSION_HEADER, "planted")]
        twice = browser.get(f"/messages/{dead}", headers=planted)
        assert twice.status_code == 400

        assert browser.post(url, headers=mine).status_code == 403  # no Origin: not the page
        foreign = browser.post(url, headers={**mine, "Origin": "https://evil.example"})
        assert foreign.status_code == 403
        assert row(lite_engine, dead).state == "dead"
        form_post = browser.post(url, content=b'{"x": 1}', headers={
            **mine, "Origin": origin, "Content-Type": "text/plain"})  # fmt: skip
        assert form_post.status_code == 400  # a cross-site form cannot send JSON
        assert row(lite_engine, dead).state == "dead"

        done = browser.post(url, headers={**mine, "Origin": origin})
        assert done.status_code == 200, done.text
        assert operator_records(lite_engine, dead)[0].relay_id == "console:bob@127.0.0.1"

        out = browser.post("/logout", headers={**mine, "Origin": origin})
        assert out.status_code == 200
        assert browser.post(url, headers={**mine, "Origin": origin}).status_code == 401


def test_a_session_ends_when_left_idle() -> None:
    now = [1000.0]
    gate = Gate(TOKEN, open_reads=False, clock=lambda: now[0])
    sid = gate.login(TOKEN, "ann", "127.0.0.1")
    assert isinstance(sid, str)
    now[0] += IDLE_SECONDS - 1
    assert gate.session(sid) is not None  # used: idle from now on
    now[0] += IDLE_SECONDS - 1
    assert gate.session(sid) is not None
    now[0] += IDLE_SECONDS + 1
    assert gate.session(sid) is None


# --------------------------------------------------------------------------- hostile text

HOSTILE = '<script>alert("x")</script>'
HOSTILE_ATTR = '"><img src=x onerror=alert(1)>'


def test_hostile_text_a_message_carries_is_escaped_on_every_page(
    lite: ConsoleServer, lite_engine: Engine
) -> None:
    with lite_engine.begin() as conn:
        message_id = outbox.enqueue(
            conn, exchange=f"ex{HOSTILE}", routing_key=f"rk{HOSTILE_ATTR}", payload=HOSTILE,
            key=f"k{HOSTILE}", headers={"h": HOSTILE_ATTR, HOSTILE: "v"},
        )  # fmt: skip
    kill(lite_engine, [message_id], f"rejected {HOSTILE} \x1b[2J {HOSTILE_ATTR}")
    with bearer(lite) as http:
        lite.console.monitor.refresh()
        pages = {
            "overview": http.get("/").text,
            "list": http.get("/messages", params={"exchange": f"ex{HOSTILE}"}).text,
            "dead": http.get("/messages", params={"state": "dead"}).text,
            "message": http.get(f"/messages/{message_id}").text,
        }
    for name, page in pages.items():
        assert HOSTILE not in page, name
        assert "<img" not in page, name
        assert "\x1b" not in page, name
        assert page.count("<script") == 1, name  # our own script tag only
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in pages["message"]
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in pages["message"]
    assert "\\x1b[2J" in pages["message"]  # the control character shown, not acted on
    assert str(message_id) in pages["list"]


# --------------------------------------------------------------------------- the overview


def test_the_overview_counts_what_a_running_relay_did(
    db_url: str, console: ConsoleServer, app_engine: Engine, broker: Broker,
    relay_factory: RelayFactory,
) -> None:  # fmt: skip
    relay = relay_factory(db_url)
    unbound = broker.declare_exchange()  # no queue: NO_ROUTE, dead at once (permanent)
    sent = enqueue(app_engine, 4, exchange=broker.exchange)
    enqueue(app_engine, 1, exchange=unbound)
    broker.collect_ids(sent)
    wait_until(lambda: states(app_engine) == {"published": 4, "dead": 1}, what="4 sent, 1 dead")
    with bearer(console) as http:
        console.console.monitor.refresh()
        seen = http.get("/api/overview").json()
        page = http.get("/").text
        # A second refresh re-reads the minutes still open and keeps the rest.
        more = enqueue(app_engine, 3, exchange=broker.exchange)
        broker.collect_ids(more)
        wait_until(lambda: states(app_engine).get("published") == 7, what="3 more published")
        console.console.monitor.refresh()
        again = http.get("/api/overview").json()
    assert seen["counts"]["published"] == 4
    assert seen["counts"]["dead"] == 1
    assert sum(m["published"] for m in seen["minutes"]) == 4
    assert sum(m["dead"] for m in seen["minutes"]) == 1
    assert relay.config.relay_id in [r["relay_id"] for r in seen["relays"]]
    assert {e["exchange"]: e["published"] for e in seen["exchanges"]}[broker.exchange] == 4
    assert relay.config.relay_id in page
    assert "<svg" in page
    assert sum(m["published"] for m in again["minutes"]) == 7
    assert len(again["minutes"]) in (len(seen["minutes"]), len(seen["minutes"]) + 1)


# --------------------------------------------------------------------------- paging at scale


def test_a_page_is_an_index_scan_however_many_rows_the_table_holds(
    pg_url: str, pg_engine: Engine
) -> None:
    """Beside 100,000 published rows, every page of the list (and of the dead ones) is read
    through an index: no statement the console runs for it scans the table; the overview marks
    its published count as the estimate it then is."""
    with pg_engine.begin() as conn:
        outbox.enqueue(conn, exchange="ex", routing_key="rk", payload={"n": 0})
    others = ", ".join(c.name for c in message.c if c.name not in ("seq", "id", "state"))
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(
            f"INSERT INTO outbox_message (id, state, {others}) "
            f"SELECT gen_random_uuid(), CASE WHEN g %% 10000 = 0 THEN 'dead' ELSE 'published' END, "
            f"{others} FROM outbox_message, generate_series(1, 100000) AS g"
        )
        conn.exec_driver_sql("ANALYZE outbox_message")
    seen: list[tuple[str, Any]] = []

    def capture(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "outbox_message" in statement:
            seen.append((statement, params))

    engine = make_engine(pg_url, autocommit=False)
    event.listen(engine, "before_cursor_execute", capture)
    try:
        for flt, before in [(admin.MessageFilter(), None), (admin.MessageFilter(), 150_000),
                            (admin.MessageFilter(states=("dead",)), None)]:  # fmt: skip
            page = admin.page_messages(engine, flt, 50, before=before)
            assert page.rows
        event.remove(engine, "before_cursor_execute", capture)
        with engine.connect() as conn:
            for statement, params in seen:
                plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, params))
                assert "Seq Scan" not in plan, plan
    finally:
        engine.dispose()
    assert len(seen) == 3
    # Beside that many rows the overview's published count is an estimate, and says so.
    server = open_console(pg_url, host="127.0.0.1", port=0, token=None, trace_url=None,
                          open_reads=True)  # fmt: skip
    server.start()
    try:
        server.console.monitor.refresh()
        with client(server) as http:
            seen_counts = http.get("/api/overview").json()
            overview = http.get("/").text
    finally:
        server.stop()
    assert "published" in seen_counts["estimated"]
    assert seen_counts["counts"]["dead"] == 10  # counted, never estimated
    assert "~ marks an estimate" in overview


# --------------------------------------------------------------------------- least privilege


def test_a_console_run_as_the_viewer_role_reads_and_refuses_actions(granted: Roles) -> None:
    """The roles `outbox-relay grants` makes: a viewer's console shows everything and each action
    is a 403 naming the privilege (nothing changes); an operator's console acts."""
    owner = granted.engine("owner")
    try:
        (dead,) = enqueue(owner, 1)
        kill(owner, [dead], "rejected")
        for kind, status in (("viewer", 403), ("operator", 200)):
            server = open_console(granted.url(kind), host="127.0.0.1", port=0, token=TOKEN,
                                  trace_url=None)  # fmt: skip
            server.start()
            try:
                with bearer(server) as http:
                    assert http.get(f"/api/messages/{dead}").json()["state"] == "dead"
                    seen = http.get("/api/overview").json()
                    assert seen["counts"]["dead"] == 1, kind
                    # A role that may not read outbox_relay (grants' viewer and operator roles)
                    # gets the rest of the overview.
                    assert seen["relays"] in (None, [])
                    answer = http.post(f"/api/messages/{dead}/replay")
                assert answer.status_code == status, (kind, answer.text)
                if kind == "viewer":
                    assert answer.json()["error"] == (
                        f"the console's database role {granted.names['viewer']} lacks UPDATE on "
                        "table outbox_message; INSERT on table outbox_attempt; USAGE on sequence "
                        "outbox_attempt_id_seq; nothing changed. `outbox-relay grants --operator "
                        f"{granted.names['viewer']}` prints the GRANTs"
                    )
                    assert row(owner, dead).state == "dead"
            finally:
                server.stop()
        assert row(owner, dead).state == "pending"
    finally:
        owner.dispose()
