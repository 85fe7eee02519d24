"""`outbox-relay reschedule` and `prioritize` (one message, several, a filtered group, --dry-run),
their refusals (exit 1 for a message a relay holds, exit 2 in one line for bad input), and
`outbox-relay console` starting, serving and stopping, or refusing to start.

Most cases run the CLI in process (main(argv), as an operator's shell would call it, with its
exit code and output); one of each command runs as a real subprocess."""

from __future__ import annotations

import datetime as dt
import json
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

import outbox
from outbox.schema import attempt, message
from relay.cli.main import main
from tests.support.cli import cli, environment
from tests.support.db import make_app_engine

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

TOKEN = "cli-test-console-token-0123456789"


def enqueue(engine: Engine, n: int, exchange: str = "orders", **options: Any) -> list[uuid.UUID]:
    with engine.begin() as conn:
        return [
            outbox.enqueue(conn, exchange=exchange, routing_key="r", payload={"n": i}, **options)
            for i in range(n)
        ]


def row(engine: Engine, message_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(message).where(message.c.id == message_id)).one()


def set_state(engine: Engine, message_id: uuid.UUID, state: str) -> None:
    with engine.begin() as conn:
        conn.execute(update(message).where(message.c.id == message_id).values(state=state))


def due(engine: Engine, message_id: uuid.UUID) -> dt.datetime:
    value: dt.datetime = row(engine, message_id).available_at
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def records(engine: Engine, message_id: uuid.UUID) -> list[tuple[str, str | None]]:
    stmt = (
        select(attempt.c.outcome, attempt.c.error)
        .where(attempt.c.message_id == message_id)
        .order_by(attempt.c.id)
    )
    with engine.connect() as conn:
        return [(str(o), e) for o, e in conn.execute(stmt)]


def run(db_url: str, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["--db", db_url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- one or several


def test_reschedule_as_an_operator_runs_it(
    sqlite_url: str, lite_engine: Engine, tmp_path: Path
) -> None:
    """The installed command, as a subprocess (the other tests call it in process)."""
    (message_id,) = enqueue(lite_engine, 1)
    before = dt.datetime.now(dt.UTC)
    moved = cli("--db", sqlite_url, "reschedule", str(message_id), "--in", "10m", cwd=tmp_path)
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.startswith(f"{message_id}  rescheduled: due at ")
    assert dt.timedelta(minutes=10) <= due(lite_engine, message_id) - before
    assert due(lite_engine, message_id) - before < dt.timedelta(minutes=11)


def test_one_message_is_rescheduled_and_reprioritized(
    db_url: str, app_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = enqueue(app_engine, 2)
    before = dt.datetime.now(dt.UTC)
    code, out, _ = run(db_url, "reschedule", str(first), "--in", "10m", capsys=capsys)
    assert code == 0
    assert out.startswith(f"{first}  rescheduled: due at ")
    assert dt.timedelta(minutes=10) <= due(app_engine, first) - before < dt.timedelta(minutes=11)

    code, out, _ = run(db_url, "reschedule", str(first), str(second), "--at",
                       "2031-05-06T07:08:09+02:00", "--json", capsys=capsys)  # fmt: skip
    assert code == 0
    assert json.loads(out) == {str(first): "rescheduled", str(second): "rescheduled"}
    assert due(app_engine, second) == dt.datetime(2031, 5, 6, 5, 8, 9, tzinfo=dt.UTC)

    code, out, _ = run(db_url, "prioritize", str(second), "-3", capsys=capsys)
    assert (code, out) == (0, f"{second}  prioritized: priority -3\n")
    assert row(app_engine, second).priority == -3
    assert records(app_engine, second) == [
        ("rescheduled", "due at 2031-05-06T05:08:09+00:00"),
        ("prioritized", "priority -3"),
    ]


def test_a_message_not_pending_is_left_alone_and_named(
    sqlite_url: str, lite_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = lite_engine
    claimed, dead, fine = enqueue(engine, 3)
    set_state(engine, claimed, "in_flight")
    set_state(engine, dead, "dead")
    ghost = uuid.uuid4()
    code, out, _ = run(sqlite_url, "prioritize", str(claimed), str(dead), str(ghost), str(fine),
                       "4", capsys=capsys)  # fmt: skip
    assert code == 1
    assert out.splitlines() == [
        f"{claimed}  too late: the message is in_flight",
        f"{dead}  not pending: the message is dead",
        f"{ghost}  not found",
        f"{fine}  prioritized: priority 4",
    ]
    assert [row(engine, i).priority for i in (claimed, dead, fine)] == [0, 0, 4]
    assert records(engine, claimed) == records(engine, dead) == []


# --------------------------------------------------------------------------- groups


def test_the_group_forms_change_every_pending_match_and_dry_run_changes_nothing(
    db_url: str, app_engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    orders = enqueue(app_engine, 3)
    (audit,) = enqueue(app_engine, 1, exchange="audit")
    (dead,) = enqueue(app_engine, 1)
    set_state(app_engine, dead, "dead")

    code, out, _ = run(db_url, "prioritize", "--state", "pending", "--exchange", "orders", "5",
                       "--dry-run", capsys=capsys)  # fmt: skip
    assert (code, out) == (0, "would prioritize 3 message(s) (dry run; nothing changed)\n")
    assert {row(app_engine, i).priority for i in [*orders, audit, dead]} == {0}

    code, out, _ = run(db_url, "prioritize", "5", "--state", "pending,dead", "--exchange",
                       "orders", "--json", capsys=capsys)  # fmt: skip
    assert code == 0
    result = json.loads(out)
    assert sorted(result["prioritized"]) == sorted(str(i) for i in orders)
    assert result["skipped"] == 1  # the dead one matched, and was left alone
    assert [row(app_engine, i).priority for i in [*orders, audit, dead]] == [5, 5, 5, 0, 0]

    code, out, _ = run(db_url, "reschedule", "--state", "pending", "--exchange", "audit",
                       "--in", "1h", "--dry-run", "--json", capsys=capsys)  # fmt: skip
    assert json.loads(out) == {"dry_run": True, "would_reschedule": [str(audit)]}
    code, out, _ = run(db_url, "reschedule", "--state", "pending", "--exchange", "audit",
                       "--in", "1h", capsys=capsys)  # fmt: skip
    assert (code, out) == (0, "rescheduled 1 message(s)\n")
    assert due(app_engine, audit) > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=59)


# --------------------------------------------------------------------------- bad input

ID = "5a1c8e59-7d6e-4a55-9a3f-0c5a3b8a6a01"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["reschedule", ID], "one of the arguments --at --in is required"),
        (["reschedule", ID, "--at", "x", "--in", "1h"], "not allowed with argument"),
        (["reschedule", ID, "--in", "soon"], "--in: 'soon' is not a duration"),
        (["reschedule", ID, "--in", "1000y"], "--in: '1000y' is not a duration"),
        (["reschedule", ID, "--at", "10m"], "--at: '10m' is a duration: use --in 10m"),
        (["reschedule", ID, "--at", "next tuesday"], "--at: 'next tuesday' is neither"),
        (["reschedule", "--in", "1h"], "reschedule: give message ids, or --state pending"),
        (["reschedule", ID, "--state", "pending", "--in", "1h"], "give message ids or filters"),
        (["reschedule", "not-an-id", "--in", "1h"], "'not-an-id' is not a message id"),
        (["prioritize", ID, "high"], "argument N: 'high' is not an integer priority"),
        (["prioritize", ID, "2147483648"], "priority 2147483648 is out of range"),
        (["prioritize", ID], "'" + ID + "' is not an integer priority"),
        (["prioritize", "5"], "prioritize: give message ids, or --state pending"),
        (["prioritize", "5", "--state", "zombie"], "unknown state zombie"),
        (["prioritize", "5", "--state", "pending", "--created-since", "then"], "--created-since"),
    ],
)
def test_bad_input_exits_2_in_one_line(
    argv: list[str], said: str, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(sqlite_url, *argv, capsys=capsys)
    assert code == 2, err
    assert out == ""
    assert len(err.splitlines()) == 1, err
    assert said in err
    assert not Path(sqlite_url.removeprefix("sqlite:///")).exists()  # nothing was opened


# --------------------------------------------------------------------------- the console command


@pytest.fixture
def lite_engine(sqlite_url: str) -> Iterator[Engine]:
    engine = make_app_engine(sqlite_url)
    outbox.create_schema(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def console_process(sqlite_url: str, lite_engine: Engine, tmp_path: Path) -> Iterator[Any]:
    """`outbox-relay console` on a free port (the API tests cover both databases)."""
    env = environment(OUTBOX_CONSOLE_TOKEN=TOKEN)
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay", "--db", sqlite_url, "console", "--http-port", "0"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()


def test_the_console_serves_until_sigterm(console_process: Any, lite_engine: Engine) -> None:
    (message_id,) = enqueue(lite_engine, 1)
    line = console_process.stderr.readline()  # blocks until the first log line
    assert "console.listening" in line, line
    assert "actions=on" in line
    url = line.split("url=", 1)[1].split()[0]
    request = urllib.request.Request(
        f"{url}api/messages/{message_id}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read())["id"] == str(message_id)
    console_process.send_signal(signal.SIGTERM)
    assert console_process.wait(20) == 0
    assert "console.stopped" in console_process.stderr.read()


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (["--http-host", "0.0.0.0"], {}, "--http-host 0.0.0.0 is not a loopback address"),
        ([], {"OUTBOX_CONSOLE_TOKEN": "short"}, "OUTBOX_CONSOLE_TOKEN is too weak"),
        ([], {}, "set OUTBOX_CONSOLE_TOKEN (reads and actions need it), or pass --open-reads"),
        (
            ["--http-host", "10.0.0.1", "--open-reads"],
            {"OUTBOX_CONSOLE_TOKEN": TOKEN},
            "leave out --open-reads",
        ),
        (["--trace-url", "jaeger/{trace_id}"], {}, "is not an http(s) URL with {trace_id}"),
        (["--trace-url", "https://jaeger/trace/"], {}, "is not an http(s) URL with {trace_id}"),
        (["--http-port", "70000"], {}, "'70000' is not a port number"),
    ],
)
def test_the_console_refuses_to_start_in_one_line(
    argv: list[str], env: dict[str, str], said: str, sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.delenv("OUTBOX_CONSOLE_TOKEN", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run(sqlite_url, "console", *argv, capsys=capsys)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1, err
    assert said in err


def test_a_console_port_in_use_exits_2(
    sqlite_url: str, lite_engine: Engine, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("OUTBOX_CONSOLE_TOKEN", TOKEN)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        code, out, err = run(sqlite_url, "console", "--http-port", port, capsys=capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"outbox-relay: error: --http-port: cannot listen on 127.0.0.1:{port}: Address already "
        "in use"
    ]
