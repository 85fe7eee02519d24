"""The README's quickstart, run as a newcomer runs it: its shell commands and its two Python files,
as written, in an empty directory, against the real RabbitMQ.

The only change is where the broker is: the quickstart names RabbitMQ's default vhost, and this test
gives it a vhost of its own (created and deleted here), so that the quickstart's exchange and queue
never meet anyone else's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.docs_blocks import block
from tests.support.broker import AMQP_URL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# The broker every block of the quickstart names.
QUICKSTART_AMQP = "amqp://guest:guest@localhost:5672/%2F"
BIN = Path(sys.executable).parent


def _rabbitmqctl(*args: str) -> None:
    ctl = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    subprocess.run([ctl, "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def vhost_url() -> Iterator[str]:
    """An AMQP URL of the same broker as the tests', on a vhost of this test's own."""
    vhost = f"quickstart-{uuid.uuid4().hex[:8]}"
    _rabbitmqctl("add_vhost", vhost)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield AMQP_URL.rsplit("/", 1)[0] + "/" + quote(vhost, safe="")
    finally:
        _rabbitmqctl("delete_vhost", vhost)


def _commands(name: str) -> tuple[dict[str, str], list[list[str]]]:
    """A shell block's `export NAME=value` lines and its other commands, each as argv, with
    `outbox-relay` and `python` taken from this test's environment."""
    exports: dict[str, str] = {}
    commands: list[list[str]] = []
    for line in block("README.md", name).splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        if argv[0] == "export":
            key, _, value = argv[1].partition("=")
            exports[key] = value
            continue
        program = {"outbox-relay": str(BIN / "outbox-relay"), "python": sys.executable}
        commands.append([program.get(argv[0], argv[0]), *argv[1:]])
    return exports, commands


def _python(name: str, amqp_url: str) -> str:
    code = block("README.md", name)
    assert QUICKSTART_AMQP in code, f"the quickstart's {name} block no longer names the broker"
    return code.replace(QUICKSTART_AMQP, amqp_url)


def test_the_readme_quickstart_delivers_its_message(tmp_path: Path, vhost_url: str) -> None:
    exports, migrate = _commands("quickstart-migrate")
    run_exports, (shop, relay) = _commands("quickstart-run")
    assert migrate == [
        [str(BIN / "outbox-relay"), "migrate"],
        [str(BIN / "outbox-relay"), "topology", "apply", "topology.toml"],
    ]
    assert shop == [sys.executable, "shop.py"]
    assert relay == [str(BIN / "outbox-relay"), "run"]
    (tmp_path / "topology.toml").write_text(block("README.md", "quickstart-topology"))
    (tmp_path / "shop.py").write_text(block("README.md", "quickstart-shop"))
    (tmp_path / "consume.py").write_text(_python("quickstart-consume", vhost_url))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "OTEL_"))}
    env |= exports | run_exports | {"OUTBOX_AMQP_URL": vhost_url, "OTEL_TRACES_EXPORTER": "none"}

    def step(argv: list[str]) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stderr}"
        return done

    for command in migrate:
        step(command)
    step(shop)
    running = subprocess.Popen(relay, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        printed = step([sys.executable, "consume.py"]).stdout
    finally:
        running.send_signal(signal.SIGINT)
        _, relay_log = running.communicate(timeout=30)
    assert running.returncode == 0, relay_log

    lines = printed.splitlines()
    assert len(lines) == 1, printed
    message_id, rest = lines[0].split(" ", 1)
    uuid.UUID(message_id)
    assert "'x-outbox-key': 'order-1'" in rest
    assert re.search(r'\{"order": ?1, ?"total": ?1999\}', rest), rest
