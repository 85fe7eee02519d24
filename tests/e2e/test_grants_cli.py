"""`outbox-relay grants` as an operator runs it: the SQL of docs/guides/roles.md is what the
command prints, the page's pipeline (`outbox-relay grants ... | psql ...`) runs as shown, and
`outbox-relay run` works as the relay role it grants, beside an application role that
enqueues."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine

import outbox
from relay.cli.main import main
from tests.docs_blocks import block
from tests.integration.test_least_privilege import (
    PAGE,
    Roles,
    documented_grants_argv,
    documented_pipeline,
    psql_environment,
    roles,
)
from tests.support.broker import AMQP_URL, Broker
from tests.support.cli import cli, environment, in_process
from tests.support.db import states
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

__all__ = ["roles"]  # a fixture, used by name


def test_the_page_shows_what_the_command_prints(tmp_path: Path) -> None:
    left, _ = documented_pipeline()
    shown = block(PAGE, "grants-sql")
    assert shown, f"{PAGE} shows no SQL"
    printed = cli(*left[1:], cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == shown


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["grants"], "name at least one role (--app, --consumer, --relay, --viewer, --operator)"),
        (["grants", "--relay", "public"], "argument --relay: 'public' is every role"),
        (["grants", "--viewer", "pg_read_all_data"], "--viewer: names starting with pg_ are"),
        (["grants", "--app", "a\nGRANT ALL"], "argument --app: contains a control character"),
        (["grants", "--app", "x" * 64], "argument --app: longer than 63 bytes"),
        (["grants", "--schema", " ", "--app", "a"], "argument --schema: a name is needed"),
    ],
)
def test_bad_names_exit_2_in_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert says in lines[0], captured.err


def test_the_relay_role_runs_the_relay_beside_the_application_role(
    roles: Roles, broker: Broker, tmp_path: Path
) -> None:
    code, _, err = in_process("--db", roles.url("owner"), "migrate")
    assert code == 0, err
    # The page's pipeline exactly as shown (with this test's names), through a shell, the
    # console script found on PATH as an operator's shell finds it.
    left, right = documented_grants_argv(roles)
    env = psql_environment()
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    piped = subprocess.run(
        f"{shlex.join(left)} | {shlex.join(right)}",
        shell=True,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr
    assert "ERROR" not in piped.stderr, piped.stderr
    assert "WARNING" not in piped.stderr, piped.stderr

    app: Engine = roles.engine("app")
    owner: Engine = roles.engine("owner")

    def put(n: int) -> uuid.UUID:
        with app.begin() as conn:  # NOTIFY included: the application role may send it
            return outbox.enqueue(conn, exchange=broker.exchange, routing_key="r", payload={"n": n})

    stderr_path = tmp_path / "relay.stderr"
    try:
        before = [put(n) for n in range(3)]
        with stderr_path.open("w") as stderr:
            argv = ["--db", roles.url("relay"), "--amqp", AMQP_URL, "run", "--drain-timeout", "5"]
            process = subprocess.Popen(
                [sys.executable, "-m", "relay", *argv],
                cwd=tmp_path,
                env=environment(),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

            def arrived_or_exited(ids: list[uuid.UUID]) -> None:
                wanted = {str(i) for i in ids}
                broker.collect(
                    lambda got: wanted <= {d.message_id for d in got} or process.poll() is not None,
                    timeout=30,
                    what=f"{len(wanted)} messages",
                )
                assert process.poll() is None, f"the relay exited: {stderr_path.read_text()}"

            try:
                arrived_or_exited(before)
                during = [put(n) for n in range(3, 6)]  # while it listens
                arrived_or_exited(during)
                process.send_signal(signal.SIGTERM)
                code = process.wait(timeout=30)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        log = stderr_path.read_text()
        assert code == 0, log
        # Started (schema check, LISTEN), relayed, stopped cleanly (its heartbeat row deleted):
        # no statement was refused on the way.
        assert [line for line in log.splitlines() if " error " in line] == [], log
        wait_until(lambda: states(owner) == {"published": 6}, what="every row marked published")
        with owner.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM outbox_relay").scalar_one() == 0
    finally:
        app.dispose()
        owner.dispose()
