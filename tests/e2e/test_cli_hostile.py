"""Every subcommand under generated bad flags, values and environments: exit 1 or 2, a line or
two, never a traceback, never a password.

The flags come from the parser itself, so a command or option added later is covered without
touching this file. The database and broker URLs point at closed ports (with a password in
them), so a value that happens to be valid still ends in a runtime failure (exit 1) at once:
nothing here may exit 0, and nothing waits on a service.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from relay.cli.main import build_parser, main
from relay.runtime.settings import SETTINGS
from tests.support.cli import cli, environment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SECRET = "Pw-s3cret-77"
DB_URL = f"postgresql+psycopg://relay:{SECRET}@127.0.0.1:1/outbox"
AMQP_URL = f"amqp://relay:{SECRET}@127.0.0.1:1/%2F"
# At most this many lines on stdout and stderr together (a failure is one line; a command may
# log one more before it fails).
MAX_LINES = 3

HOSTILE = [
    "", " ", "abc", "-1", "0", "-0", "1.5", "inf", "-inf", "nan", "1e400", "1e300",
    "99999999999999999999", "9" * 5000, "9999999999999d", "99999999d", "0s", "-5m", "²", "١٢",
    "\x1b[2K", "x\u202ey", "--", "-", "%", "%2F", "😀" * 50, "true", "DEBUG ", "TRACE",
    "1=2=3", "a=", "=5", ",", "dead,pending", "ex=0", "ex=inf",
    "0001-01-01T00:00+05:00", "9999-12-31T23:59:59-05:00", "2026-13-45",
    f"postgresql://u:{SECRET}@h:notaport/x", f"postgresql://u@h/x?password={SECRET}",
    f"mysql://u:{SECRET}@h/x", "sqlite+pysqlite:///nodir/sub/x.db", "postgresql+asyncpg://",
    f"amqp://u:{SECRET}@h/%2F?heartbeat=abc", f"amqp://u:{SECRET}@h/%2F?frame_max=1",
    f"amqp://u:{SECRET}@h/%2F?nosuch=1", f"amqp://u:{SECRET}@h:99999/", f"http://u:{SECRET}@h/",
    "00000000-0000-0000-0000-000000000000", "not-a-uuid",
]  # fmt: skip

value = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=20))
ENV_NAMES = sorted(s.env for s in SETTINGS if s.env)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every command, and every command's own subcommands ("circuits reset"), by its words."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    words = f"{prefix} {name}".strip()
                    found[words] = child
                    walk(words, child)

    walk("", build_parser())
    return found


COMMANDS = _commands()
# Commands that talk to no service (`grants` and `sql` print SQL): given valid input they succeed.
OFFLINE = frozenset({"grants", "sql"})
TOPOLOGY = str(Path(__file__).parents[1] / "support" / "topology.toml")


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]


@st.composite
def invocations(draw: st.DrawFn) -> tuple[list[str], dict[str, str]]:
    words = draw(st.sampled_from(sorted(COMMANDS)))
    parser = COMMANDS[words]
    argv = words.split()
    for action in _positionals(parser):
        many = action.nargs in ("*", "+")
        count = draw(st.integers(1 if action.nargs == "+" else 0, 3)) if many else 1
        argv += [draw(value) for _ in range(count)]
    options = _options(parser)
    for action in draw(st.lists(st.sampled_from(options), max_size=3)) if options else []:
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            argv.append(flag)
        else:
            argv += [flag, draw(value)]
    if draw(st.booleans()):
        argv.append(draw(st.sampled_from(["--nope", "-x", "--db"])))  # unknown, or no value
    env = {name: draw(value) for name in draw(st.lists(st.sampled_from(ENV_NAMES), max_size=3))}
    return argv, env


def _check(code: int, out: str, err: str, what: object) -> None:
    detail = f"{what}\nexit {code}\nstdout: {out!r}\nstderr: {err!r}"
    assert code in (1, 2), detail
    assert "Traceback" not in out + err, detail
    assert SECRET not in out + err, detail
    assert len((out + err).splitlines()) <= MAX_LINES, detail
    if code == 2:
        assert "error" in err, detail


def _debug(argv: list[str], env: dict[str, str]) -> bool:
    """DEBUG logs tracebacks on purpose, and pika's chatter."""
    said = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--log-level"]
    said += [env.get("OUTBOX_LOG_LEVEL", "")]
    return any(s.strip().upper() == "DEBUG" for s in said)


@pytest.fixture
def quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("OUTBOX_", "OTEL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.chdir(tmp_path)  # a sqlite:/// URL given as a value lands here


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=invocations())
def test_no_bad_input_gets_a_traceback_or_a_secret(
    case: tuple[list[str], dict[str, str]],
    quiet_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv, env = case
    assume(not _debug(argv, env))
    assume(all("\x00" not in v for v in env.values()))  # the OS refuses these itself
    with monkeypatch.context() as m:
        m.setenv("OUTBOX_DB_URL", DB_URL)
        m.setenv("OUTBOX_AMQP_URL", AMQP_URL)
        for name, text in env.items():
            m.setenv(name, text)
        code = main(argv)
    out, err = capsys.readouterr()
    if argv[0] in OFFLINE and code == 0:  # prints the names it was given, and nothing else
        assert "Traceback" not in out + err, (argv, env)
        assert SECRET not in out + err or any(SECRET in a for a in argv), (argv, env)
        return
    _check(code, out, err, (argv, env))


@pytest.mark.parametrize("words", sorted(set(COMMANDS) - OFFLINE))
def test_every_command_fails_in_one_line_when_nothing_answers(
    words: str, quiet_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each command with its required arguments filled in validly: only the closed ports fail.
    fill = {"show": ["00000000-0000-0000-0000-000000000000"], "cancel": [
        "00000000-0000-0000-0000-000000000000"], "replay": ["--state", "dead"],
        "discard": ["--state", "dead"], "purge": ["--older-than", "7d"],
        "circuits reset": ["x"], "demo": ["--timeout", "1"], "console": ["--open-reads"],
        "reschedule": ["00000000-0000-0000-0000-000000000000", "--in", "10m"],
        "prioritize": ["00000000-0000-0000-0000-000000000000", "5"],
        "topology": ["check", TOPOLOGY], "topology apply": [TOPOLOGY],
        "topology check": [TOPOLOGY], "capture": ["status"]}  # fmt: skip
    argv = [*words.split(), "--db", DB_URL, "--amqp", AMQP_URL, *fill.get(words, [])]
    code = main(argv)
    out, err = capsys.readouterr()
    _check(code, out, err, argv)
    assert code == 1, err


# --------------------------------------------------------------------------- as subprocesses
# The issue's own examples, as an operator types them.

CASES = [
    ({"OUTBOX_BATCH_SIZE": "abc"}, ["run"], 2, "OUTBOX_BATCH_SIZE"),
    ({"OUTBOX_LOG_LEVEL": "TRACE"}, ["status"], 2, "OUTBOX_LOG_LEVEL"),
    ({"OUTBOX_HTTP_PORT": "99999"}, ["run"], 2, "OUTBOX_HTTP_PORT"),
    ({}, ["--db", f"postgresql://u:{SECRET}@h:notaport/x", "status"], 2, "port"),
    ({}, ["run", "--amqp", f"amqp://u:{SECRET}@127.0.0.1/%2F?heartbeat=abc"], 2, "heartbeat"),
    ({}, ["messages", "--created-since", "99999999d"], 2, "--created-since"),
    ({}, ["messages", "--limit", "99999999999999999999"], 2, "--limit"),
    ({}, ["purge", "--older-than", "9999999999999d"], 2, "--older-than"),
    ({}, ["run", "--lease", "inf"], 2, "--lease"),
    ({}, ["run", "--amqp", f"amqp://u:{SECRET}@127.0.0.1:1/%2F"], 1, "connection refused"),
]  # fmt: skip


@pytest.mark.parametrize(("env", "argv", "code", "names"), CASES)
def test_the_issues_examples_as_subprocesses(
    env: dict[str, str], argv: list[str], code: int, names: str, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'outbox.db'}"
    migrated = cli("--db", db, "migrate", cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    result = cli(*argv, cwd=tmp_path, env=environment(OUTBOX_DB_URL=db, **env))
    _check(result.returncode, result.stdout, result.stderr, argv)
    assert result.returncode == code, result.stderr
    assert names in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'outbox.db'}"
    migrated = cli("--db", db, "migrate", cwd=tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    # `outbox-relay status | head -0`: the reader is gone before the first write.
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as closed:
        result = subprocess.run(
            [sys.executable, "-m", "relay", "--db", db, "status"],
            cwd=tmp_path, env=environment(), stdout=closed, stderr=subprocess.PIPE, text=True,
            timeout=30, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
