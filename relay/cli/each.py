"""Commands that answer per database (`--db` repeated, `--db-file`): the databases given, each
with a configuration of its own, and what each answered or why it failed.

A database that fails stops none of the others: its failure is its answer, one line in the words
relay/cli/main.py would print for it alone, passwords hidden. A mistake in the command line
(ConfigError) is no database's: it stops the command, as it would with one database.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from relay.cli.grants import explain_denied
from relay.core.urls import secrets_of
from relay.errors import ConfigError, PermissionDenied, RelayError
from relay.runtime.config import RelayConfig
from relay.runtime.logs import one_line

T = TypeVar("T")

log = logging.getLogger("relay")


class Target(NamedTuple):
    """One database to answer for, and the configuration that points at it alone."""

    name: str  # "" for a database given the usual way (one --db, no --db-file): unnamed
    config: RelayConfig


@dataclass(frozen=True, slots=True)
class Failed:
    """Why one database gave no answer: one line, its passwords hidden."""

    error: str


@dataclass(frozen=True, slots=True)
class Answer(Generic[T]):
    target: Target
    value: T | Failed

    @property
    def name(self) -> str:
        return self.target.name


def targets(config: RelayConfig) -> list[Target]:
    """The databases `config` gives, in order. One given the usual way is `config` itself; the
    caller answers as for one database whenever this lists one (a file may list only one)."""
    if not config.many_databases:
        return [Target("", config)]
    return [Target(db.name, config.serving(db)) for db in config.databases()]


def each_database(
    found: Sequence[Target], args: argparse.Namespace, work: Callable[[RelayConfig], T]
) -> Iterator[Answer[T]]:
    """`work` on each database in turn, lazily: a caller may print each answer as it comes, or
    stop at the one it looks for."""
    secrets = secrets_of(*(target.config.db_url for target in found))
    for target in found:
        try:
            value: T | Failed = work(target.config)
        except (ConfigError, BrokenPipeError):  # the command line's, or the reader's: not its
            raise
        except Exception as exc:
            value = Failed(one_line(_why(target.config, args, exc), secrets))
        yield Answer(target, value)


def _why(config: RelayConfig, args: argparse.Namespace, exc: Exception) -> str:
    """What relay/cli/main.py says of `exc` after "outbox-relay: COMMAND failed: "."""
    if isinstance(exc, PermissionDenied):
        return explain_denied(config, args, exc)
    if isinstance(exc, RelayError):
        return str(exc)
    log.debug("command.failed", exc_info=exc)
    return f"unexpectedly: {type(exc).__name__}: {exc} (--log-level DEBUG logs the traceback)"


def failure_line(command: str, name: str, failed: Failed) -> str:
    """A failed database as stderr says it: the one-database line, naming the database."""
    return f"outbox-relay: {command} failed for {name}: {failed.error}"


def exit_code(answers: Iterable[Answer[Any]]) -> int:
    """1 when any database failed, else 0."""
    return 1 if any(isinstance(answer.value, Failed) for answer in answers) else 0
