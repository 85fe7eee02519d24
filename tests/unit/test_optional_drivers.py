"""The database drivers that are extras (PyMySQL: outbox-relay[mysql]; libpq, or psycopg's binary
build: outbox-relay[binary]): nothing imports one before a URL needs it, and a URL whose driver is
missing is refused in one line saying what to install. Each case runs in a fresh interpreter
with the driver made unimportable, as on a machine that lacks it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def run_without(module: str, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`code` in a new interpreter in which `import <module>` fails."""
    blocked = f"import sys\nsys.modules[{module!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", blocked + textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("module", ["pymysql", "psycopg"])
def test_a_sqlite_relay_needs_neither_driver(module: str, tmp_path: Path) -> None:
    done = run_without(
        module,
        """
        import outbox, relay.cli.main, relay.runtime.runner, relay.console.server
        import relay.demo.embedded, relay.store.sql_store
        from relay.cli.main import main
        assert main(["--db", "sqlite:///outbox.db", "migrate"]) == 0
        # Up to the broker, which is not there: the failure is the broker's, not an import's.
        raise SystemExit(main(["--db", "sqlite:///outbox.db", "--amqp",
                               "amqp://guest:guest@127.0.0.1:1/%2F", "run"]))
        """,
        tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1].startswith("outbox-relay: run failed: "), done.stderr
    assert "Error" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("module", "url", "remedy"),
    [
        ("pymysql", "mysql://root@127.0.0.1:3306/test", "pip install 'outbox-relay[mysql]'"),
        ("pymysql", "mariadb+pymysql://root@127.0.0.1/test", "pip install 'outbox-relay[mysql]'"),
        ("psycopg", "postgresql://127.0.0.1/app", "pip install 'outbox-relay[binary]'"),
    ],
)
def test_a_url_whose_driver_is_missing_is_refused_naming_what_to_install(
    module: str, url: str, remedy: str, tmp_path: Path
) -> None:
    done = run_without(
        module,
        f"""
        from relay.cli.main import main
        raise SystemExit(main(["--db", {url!r}, "status"]))
        """,
        tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("outbox-relay: error: argument --db: "), line
    assert remedy in line
