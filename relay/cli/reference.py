"""The command line's reference page, written from the parser and the settings table.

The documentation site's "Command line" page is this module's output (docs/hooks.py calls it at
build time), so a flag, its variable and its default are described where they are declared and the
page cannot drift from what `outbox-relay --help` says.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from relay.cli.main import build_parser
from relay.runtime.settings import SETTINGS, Setting

_BY_FLAG = {setting.flag: setting for setting in SETTINGS}


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _flag(action: argparse.Action) -> str:
    flags = [f for f in action.option_strings if f.startswith("--")] or action.option_strings
    if isinstance(action, argparse.BooleanOptionalAction):
        return " / ".join(flags)
    if action.nargs == 0:
        return flags[0]
    metavar = action.metavar
    if metavar is None:
        metavar = (
            "{" + ",".join(map(str, action.choices)) + "}"
            if action.choices
            else action.dest.upper()
        )
    return f"{flags[0]} {metavar}"


def _setting_row(setting: Setting, action: argparse.Action) -> str:
    flag = _flag(action)
    if setting.repeat or setting.many:
        flag += " (repeatable)"
    return (
        f"| {_code(flag)} | {_code(setting.env or '')} | {_code(setting.default_text())} "
        f"| {_cell(setting.help)} |"
    )


def _plain_row(action: argparse.Action) -> str:
    name = _flag(action) if action.option_strings else str(action.metavar or action.dest).upper()
    help_text = (action.help or "").replace("%%", "%")
    default = action.default
    shown = "" if default in (None, False, [], argparse.SUPPRESS) else _code(str(default))
    return f"| {_code(name)} |  | {shown} | {_cell(help_text)} |"


def _rows(parser: argparse.ArgumentParser, command: str | None) -> Iterator[str]:
    """Table rows for a parser's options; `command` None: the top-level parser's (the global
    options); a command's own flag that shares a setting's name is that command's, not the
    setting's, unless the setting says the command reads it."""
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if isinstance(action, argparse._VersionAction):
            continue
        flags = action.option_strings
        setting = next((_BY_FLAG[f] for f in flags if f in _BY_FLAG), None)
        if setting is not None and setting.everywhere and command is not None:
            continue
        if setting is not None and command is not None and not setting.used_by(command):
            setting = None
        yield _setting_row(setting, action) if setting is not None else _plain_row(action)


HEADER = ("| option | environment variable | default | meaning |", "|---|---|---|---|")


def markdown() -> str:
    """The reference: global options, then each command with its own options, in --help's order."""
    parser = build_parser()
    commands = _subcommands(parser)
    out = [
        "## Global options",
        "",
        "Accepted before or after any command: `outbox-relay --db URL run` and "
        "`outbox-relay run --db URL` are the same. A flag wins over its environment variable, "
        "which wins over the default.",
        "",
        *HEADER,
        *_rows(parser, None),
        "",
        "## Commands",
        "",
    ]
    helps = {action.dest: action.help or "" for action in commands._choices_actions}
    for name, sub in commands.choices.items():
        rows = list(_rows(sub, name))
        what = _cell(helps.get(name, ""))
        out += [f"### `outbox-relay {name}`", "", what[:1].upper() + what[1:] + ".", ""]
        positionals = [
            str(a.metavar or a.dest).upper() for a in sub._actions if not a.option_strings
        ]
        out += ["```text", " ".join(["outbox-relay", name, "[OPTIONS]", *positionals]), "```", ""]
        out += [*HEADER, *rows, ""] if rows else ["No options beyond the global ones.", ""]
    return "\n".join(out)
