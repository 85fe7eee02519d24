"""The `outbox-relay` console script, before the command line's modules are imported: those need
the relay extra (pika, tenacity, the OpenTelemetry SDK, ...), which `pip install outbox-relay`
leaves out. A command run without the extra it needs exits 2 with one line naming it; `--version`
needs none. Only the standard library is imported here until the check has passed.

What each extra brings is read from the installed package's metadata, whose one source is
pyproject.toml. Run from a source tree that was never installed, nothing is checked.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, distribution, requires, version

EXIT_USAGE = 2
PACKAGE = "outbox-relay"

# A requirement as the metadata writes it: `pika<2,>=1.3; extra == "relay"`.
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXTRA = re.compile(r"""\bextra\s*==\s*["']([^"']+)["']""")


def version_line() -> str:
    """`outbox-relay --version`: the release (from the installed package's metadata, whose one
    source is pyproject.toml) and the schema version this release migrates to."""
    from outbox.schema import SCHEMA_VERSION  # the library alone: SQLAlchemy

    try:
        release = version(PACKAGE)
    except PackageNotFoundError:  # run from a source tree that was never installed
        release = "unknown"
    return f"{PACKAGE} {release} (schema {SCHEMA_VERSION})"


def extra_requirements(extra: str) -> list[str]:
    """The distributions `extra` adds, by name; [] when the package is not installed."""
    try:
        listed = requires(PACKAGE) or []
    except PackageNotFoundError:
        return []
    names = []
    for line in listed:
        requirement, _, marker = line.partition(";")
        wanted = _EXTRA.search(marker)
        name = _NAME.match(requirement)
        if wanted and wanted.group(1) == extra and name:
            names.append(name.group(1))
    return names


def missing(extra: str) -> list[str]:
    """The distributions of `extra` that are not installed."""
    absent = []
    for name in extra_requirements(extra):
        try:
            distribution(name)
        except PackageNotFoundError:
            absent.append(name)
    return absent


def needs(extra: str, what: str = "this command") -> str | None:
    """The one line saying `what` needs `extra`, or None when it is installed."""
    absent = missing(extra)
    if not absent:
        return None
    why = f"{absent[0]} is" if len(absent) == 1 else f"{absent[0]} and {len(absent) - 1} more are"
    return (
        f"{PACKAGE}: {what} needs the {extra} extra: pip install '{PACKAGE}[{extra}]' "
        f"({why} not installed)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    problem = needs("relay")
    if problem is None:
        from relay.cli.main import main as run_command

        return run_command(args)
    if "--version" in args:
        print(version_line())
        return 0
    print(problem, file=sys.stderr)
    return EXIT_USAGE
