"""The settings table (relay.runtime.settings.SETTINGS) as argparse options, and back.

argparse gets no defaults from the table: a flag left out is None, so `configure` can tell it from
a value given and fall back to the environment after parsing, where a bad variable can be named.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, TypeVar

from relay.runtime.config import RelayConfig
from relay.runtime.readers import OneOf
from relay.runtime.settings import SETTINGS, Setting, replaced, resolve, settings_for

T = TypeVar("T")
# The subcommands' action; Any: main's parser class is a subclass, and the action is invariant.
Commands: TypeAlias = "argparse._SubParsersAction[Any]"
# What each command group maps its command names to.
Handler: TypeAlias = Callable[[RelayConfig, argparse.Namespace], int]


def argparse_type(read: Callable[[str], T]) -> Callable[[str], T]:
    """`read` as an argparse type: its ValueError becomes argparse's one-line usage error
    (argparse would replace a ValueError's message with "invalid ... value")."""

    def convert(raw: str) -> T:
        try:
            return read(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _help(setting: Setting) -> str:
    env = f"env {setting.env}; " if setting.env else ""
    text = f"{setting.help} ({env}default {setting.default_text()})"
    return text.replace("%", "%%")  # argparse %-formats help; URLs hold %2F


def _add(parser: argparse._ActionsContainer, setting: Setting, default: object) -> None:
    if setting.switch:
        parser.add_argument(setting.flag, dest=setting.dest, default=default,
                            action=argparse.BooleanOptionalAction, help=_help(setting))  # fmt: skip
        return
    parser.add_argument(
        setting.flag,
        dest=setting.dest,
        default=default,
        type=argparse_type(setting.read),
        action="append" if setting.repeat or setting.many else "store",
        choices=setting.read.choices if isinstance(setting.read, OneOf) else None,
        metavar=setting.metavar,
        help=_help(setting),
    )


def add_command_options(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags of the settings `command` reads (the global options aside)."""
    for setting in settings_for(command):
        _add(parser, setting, None)


def add_global_options(parser: argparse.ArgumentParser) -> None:
    for setting in SETTINGS:
        if setting.everywhere:
            _add(parser, setting, None)


def accept_global_options_after(commands: Commands) -> None:
    """Give every command (and its own subcommands) the global options, so they may follow its
    name too. SUPPRESS: left out there, they do not overwrite a value given before the name."""
    done: set[int] = set()

    def add(parser: argparse.ArgumentParser) -> None:
        if id(parser) in done:  # an alias is the same parser
            return
        done.add(id(parser))
        group = parser.add_argument_group("global options (also before the command)")
        for setting in SETTINGS:
            if setting.everywhere:
                _add(group, setting, argparse.SUPPRESS)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    add(child)

    for parser in commands.choices.values():
        add(parser)


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The values of the settings whose flags `args.command` has, by dest (None: not given);
    a repeated flag's values merged, the last winning."""
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        if not (setting.everywhere or setting.used_by(args.command)):
            continue  # another option of this command may share the dest (purge --batch-size)
        value = getattr(args, setting.dest, None)
        if value is not None and setting.repeat:
            value = {k: v for part in value for k, v in part.items()}
        values[setting.dest] = value
    return values


def configure(args: argparse.Namespace, environ: Mapping[str, str]) -> RelayConfig:
    """The configuration for the parsed command line: flags, then `environ`, then defaults."""
    return resolve(args.command, given(args), environ)


def replaced_options(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """What to say of each old option given: what replaced it."""
    return replaced(args.command, given(args), environ)
