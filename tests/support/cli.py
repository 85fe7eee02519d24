"""`outbox-relay` as an operator runs it: `cli()` runs `python -m relay ...` as a subprocess in a
clean environment; `in_process()` calls the console script's `main` here, which is cheaper when
only the output matters."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

from relay.cli.main import main
from tests.support.waiting import wait_until

# Addresses where nothing listens: the command fails to reach them at once.
UNREACHABLE_DB = "postgresql+psycopg://root@127.0.0.1:1/x"
UNREACHABLE_AMQP = "amqp://guest:guest@127.0.0.1:1/%2F"


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without any OUTBOX_* or OTEL_* setting the test did not choose
    (and no trace export), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "OTEL_"))}
    env["OTEL_TRACES_EXPORTER"] = "none"
    env.update(extra)
    return env


def cli(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`outbox-relay ARGS` as a process (in `cwd`, with `environment()` unless `env` is given):
    its exit code, stdout and stderr. Never raises for a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-m", "relay", *args],
        cwd=cwd,
        env=env or environment(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def in_process(*argv: str) -> tuple[int, str, str]:
    """`outbox-relay ARGV` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """Exit `code`, nothing on stdout, exactly one line on stderr, and no traceback."""
    detail = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert result.returncode == code, detail
    assert "Traceback" not in result.stderr, detail
    lines = result.stderr.splitlines()
    assert len(lines) == 1, detail
    assert lines[0].strip(), detail
    assert result.stdout == "", detail
    return lines[0]


class RelayProcess:
    """`outbox-relay ARGS` as a long-running process (stdout and stderr together), its log lines
    read as they come."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "relay", *args],
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self.lines.append(line)

    def said(self, *words: str, timeout: float = 20.0) -> str:
        """The first line holding every one of `words`, once there is one."""

        def found() -> str | None:
            return next((line for line in self.lines if all(w in line for w in words)), None)

        wait_until(lambda: found() is not None, timeout=timeout, what=" ".join(words))
        line = found()
        assert line is not None
        return line

    def stop(self) -> tuple[int, str]:
        """SIGTERM; its exit code and everything it logged."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        self._reader.join(timeout=5)
        return code, "".join(self.lines)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
        self._reader.join(timeout=5)


def kill_running(started: Iterable[RelayProcess]) -> None:
    """Kill each of `started` still running: a test's fixture, after the test."""
    for relay in started:
        if relay.process.poll() is None:
            relay.kill()
