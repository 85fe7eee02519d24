"""The databases one relay serves: `--db URL` repeated, or a file of them (`--db-file`).

Each database has a NAME: what its log lines (`database=NAME`), metrics (a `database` label),
/readyz and the commands' answers call it. A file may give it (`NAME = URL`); else it is the
URL's schema (PostgreSQL `options=-csearch_path=NAME`), else its database, else (SQLite) its
file's name without the extension. Two databases with one name are refused: a file names them.

The file: one database per line, `URL` or `NAME = URL`; `#` starts a comment; blank lines are
skipped. It is read when the relay starts and again on SIGHUP (relay/runtime/tenants.py).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from sqlalchemy.engine import URL

from relay.errors import ConfigError
from relay.runtime.urls import parse_db_url

# What a NAME may hold: it is a Prometheus label value and a logfmt field, read by people.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# `NAME = URL`: the name before the first '=' that is followed by a URL's scheme.
_NAMED = re.compile(r"^\s*([^=]+?)\s*=\s*([A-Za-z][A-Za-z0-9+.-]*://.*)$")
# search_path in libpq's options: `-csearch_path=tenant_7` or `-c search_path=tenant_7,public`.
_SEARCH_PATH = re.compile(r"-c\s*search_path\s*=\s*([^\s,]+)")


class Database(NamedTuple):
    """One database the relay serves."""

    name: str
    url: str


def name_of(url: URL) -> str:
    """The name a URL gives its database when none is given (see the module's docstring)."""
    options = url.query.get("options")
    for option in [options] if isinstance(options, str) else list(options or ()):
        found = _SEARCH_PATH.search(urllib.parse.unquote(option))
        if found:
            return found.group(1).strip("\"'")
    database = url.database or ""
    if url.get_backend_name() == "sqlite":
        if database in ("", ":memory:") or database.startswith("file:"):
            return "memory" if not database.startswith("file:") else _stem(database[5:])
        return _stem(database)
    return database or url.host or "default"


def _stem(path: str) -> str:
    base = os.path.basename(path.split("?", 1)[0])
    stem, _ext = os.path.splitext(base)
    return stem or base


def checked_name(name: str, where: str) -> str:
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: database name {name!r} must be letters, digits, '_', '.' or '-' "
            "(at most 63, starting with a letter or digit)"
        )
    return name


def database(url: str, where: str, name: str | None = None) -> Database:
    """`url` as a Database, named `name` or after itself; ConfigError naming `where`."""
    try:
        parsed = parse_db_url(url)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {str(exc).removeprefix('--db: ')}") from None
    if name is None:
        name = name_of(parsed)
        if not _NAME.fullmatch(name):  # a file name with spaces, say: made usable
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip("_.-")[:63] or "default"
    return Database(checked_name(name, where), url)


def parse_db_file(text: str, path: str) -> list[Database]:
    """The databases a file lists, in its order; ConfigError naming the file and line."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        content = _strip_comment(line)
        if not content:
            continue
        where = f"{path}:{number}"
        named = _NAMED.match(content)
        if named:
            found.append(database(named.group(2).strip(), where, named.group(1)))
        elif "://" in content:
            found.append(database(content, where))
        else:
            raise ConfigError(f"{where}: expected a database URL or NAME = URL, got {content!r}")
    return found


def _strip_comment(line: str) -> str:
    """The line without its comment: a '#' starts one at the line's start or after a space (a
    URL's fragment never follows a space; a password may hold '#' only percent-encoded)."""
    stripped = line.strip()
    if stripped.startswith("#"):
        return ""
    cut = re.search(r"\s#", stripped)
    return (stripped[: cut.start()] if cut else stripped).strip()


def read_db_file(path: str) -> list[Database]:
    """The databases in the file at `path`; ConfigError when it cannot be read or is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"--db-file: {path!r} cannot be read: {reason}") from None
    return parse_db_file(text, path)


def databases_of(urls: Sequence[str], file: str | None) -> list[Database]:
    """Every database given, the flags' first, then the file's; ConfigError on a repeated name
    or URL, or when none is given."""
    found = [database(url, f"--db (URL {n})") for n, url in enumerate(urls, 1)]
    if file is not None:
        found.extend(read_db_file(file))
    return unique(found, file)


def unique(found: Iterable[Database], file: str | None = None) -> list[Database]:
    by_name: dict[str, Database] = {}
    by_url: dict[str, str] = {}
    for db in found:
        if db.name in by_name:
            fix = "name them in the file (NAME = URL)" if file else "name them in a --db-file"
            raise ConfigError(f"two databases are named {db.name!r}: {fix}")
        if db.url in by_url:
            raise ConfigError(
                f"databases {by_url[db.url]!r} and {db.name!r} have the same URL: list it once"
            )
        by_name[db.name] = db
        by_url[db.url] = db.name
    if not by_name:
        where = f"--db-file {file!r}" if file else "--db"
        raise ConfigError(f"{where} lists no database")
    return list(by_name.values())
