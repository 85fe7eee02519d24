"""The package as a user installs it: `python -m build` makes the sdist and, from it, the wheel;
the wheel goes into a fresh virtual environment with the extras a relay on PostgreSQL adds
(`relay`, `binary`) and the console's, at the versions constraints.txt pins; then the installed
`outbox-relay` runs from a directory outside the repository, with no PYTHONPATH, so nothing is
imported from the source tree: `--version`, `demo` (SQLite and the local RabbitMQ, ending by
itself), and `migrate` and the console on PostgreSQL, whose page, stylesheet and script come from
the package's data files. tests/e2e/test_extras.py installs the same wheel without extras."""

from __future__ import annotations

import html.parser
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from outbox.schema import SCHEMA_VERSION
from tests.support.broker import AMQP_URL
from tests.support.waiting import wait_until

# A fresh environment and two isolated builds take a minute or two (pip's cache helps): built once
# per session (a module fixture would be built again whenever its worker ran another module's test
# in between), on a worker of its own ("wheel") rather than behind the full-speed drains ("heavy").
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900), pytest.mark.xdist_group("wheel")]

ROOT = Path(__file__).resolve().parents[2]
RELEASE = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
TOKEN = "wheel-test-token-0123456789abcdef"


@dataclass(frozen=True)
class Installed:
    venv: Path
    workdir: Path  # outside the repository: the installed commands run here

    def run(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "outbox-relay"), *args],
            cwd=self.workdir,
            env=clean_environment(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without PYTHONPATH, virtualenv or outbox settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
        and not k.startswith(("OUTBOX_", "OTEL_"))
    }
    env["OTEL_TRACES_EXPORTER"] = "none"
    env.update(extra)
    return env


def run(*args: str | Path, cwd: Path, timeout: float = 600) -> None:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=clean_environment(PIP_DISABLE_PIP_VERSION_CHECK="1"),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args}\nstdout: {done.stdout[-3000:]}\nstderr: {done.stderr}"


def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of the source tree, built once per session (per xdist worker: this module and
    test_extras.py share the "wheel" group, so one worker builds it once for both)."""
    dist = tmp_path_factory.getbasetemp() / "dist"
    wheel = dist / f"outbox_relay-{RELEASE}-py3-none-any.whl"
    if not wheel.is_file():
        # Without --wheel: the sdist first, then the wheel built from the sdist, so a file the
        # sdist leaves out fails here too.
        run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=dist.parent)
        assert (dist / f"outbox_relay-{RELEASE}.tar.gz").is_file()
        assert wheel.is_file(), sorted(p.name for p in dist.iterdir())
    return wheel


def install(tmp_path_factory: pytest.TempPathFactory, *requirements: str) -> Installed:
    """A fresh virtual environment with `requirements` resolved as pip resolves them for a user
    (dependencies and all, from the package index), at the versions constraints.txt pins;
    `{wheel}` in a requirement is the built wheel's URL."""
    wheel = built_wheel(tmp_path_factory).as_uri()
    tmp = tmp_path_factory.mktemp("installed")
    venv, workdir = tmp / "venv", tmp / "work"
    workdir.mkdir()
    run(sys.executable, "-m", "venv", venv, cwd=tmp)
    run(
        venv / "bin" / "python", "-m", "pip", "install", "--quiet",
        "-c", ROOT / "constraints.txt", *(r.format(wheel=wheel) for r in requirements),
        cwd=workdir,
    )  # fmt: skip
    return Installed(venv, workdir)


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return install(tmp_path_factory, "outbox-relay[relay,binary,console] @ {wheel}")


def test_the_installed_package_is_the_wheel_not_the_source_tree(installed: Installed) -> None:
    done = subprocess.run(
        [
            str(installed.venv / "bin" / "python"),
            "-c",
            "import importlib.util as u, outbox, relay.console.assets as a; "
            "print(outbox.__file__); print(a.STATIC); "
            "print(u.find_spec('pymysql') is None, u.find_spec('psycopg_binary') is not None)",
        ],
        cwd=installed.workdir,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    library, static, extras = done.stdout.splitlines()
    site = installed.venv.resolve()
    assert Path(library).resolve().is_relative_to(site), library
    assert Path(static).resolve().is_relative_to(site), static
    assert not Path(library).resolve().is_relative_to(ROOT), library
    # The binary extra was installed; PyMySQL, the mysql extra, was not.
    assert extras == "True True"


def test_version_names_the_release_and_the_schema(installed: Installed) -> None:
    done = installed.run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"outbox-relay {RELEASE} (schema {SCHEMA_VERSION})\n"


def test_the_demo_runs_and_ends_by_itself(installed: Installed) -> None:
    done = installed.run(
        "demo", "--orders", "30", "--timeout", "60", timeout=150, OUTBOX_AMQP_URL=AMQP_URL
    )
    assert done.returncode == 0, f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
    summary = done.stdout.splitlines()[-1]
    assert re.fullmatch(
        r"demo: sent (\d+), received \1, rolled back (\d+) and never seen \2", summary
    ), summary


class _Assets(html.parser.HTMLParser):
    """The stylesheet and script URLs a page references."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "link" and found.get("rel") == "stylesheet" and found.get("href"):
            self.urls["text/css"] = str(found["href"])
        if tag == "script" and found.get("src"):
            self.urls["text/javascript"] = str(found["src"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fetch(url: str) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.headers.get_content_type(), response.read()


@pytest.fixture
def console(installed: Installed, pg_url: str) -> Iterator[str]:
    """The installed console on a migrated PostgreSQL schema: its base URL."""
    migrated = installed.run("--db", pg_url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    process = subprocess.Popen(
        [str(installed.venv / "bin" / "outbox-relay"), "console", "--http-port", str(port)],
        cwd=installed.workdir,
        env=clean_environment(OUTBOX_DB_URL=pg_url, OUTBOX_CONSOLE_TOKEN=TOKEN),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def listening() -> bool:
        assert process.poll() is None, process.communicate()
        try:
            fetch(base + "/favicon.ico")
        except (urllib.error.URLError, ConnectionError):
            return False
        return True

    try:
        wait_until(listening, timeout=60, interval=0.1, what="the installed console to listen")
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err


def test_the_console_serves_its_page_styles_and_script_from_the_package(
    installed: Installed, console: str
) -> None:
    status, kind, page = fetch(console + "/")
    assert (status, kind) == (200, "text/html"), page[:300]
    found = _Assets()
    found.feed(page.decode())
    assert set(found.urls) == {"text/css", "text/javascript"}, found.urls
    static = ROOT / "relay" / "console" / "static"
    expected = {"text/css": "console.css", "text/javascript": "console.js"}
    for wanted, url in found.urls.items():
        status, kind, body = fetch(console + url)
        assert (status, kind) == (200, wanted), url
        assert body, url
        # The file of the source tree, byte for byte, served by the installed package.
        assert body == (static / expected[wanted]).read_bytes(), url
