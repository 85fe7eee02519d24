"""The databases the store runs on: a URL's backend picks its dialect."""

from __future__ import annotations

import functools
import importlib
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from relay.core.urls import redact
from relay.errors import ConfigError
from relay.store.dialect import Dialect
from relay.store.mysql import Mariadb, Mysql
from relay.store.postgres import Postgres
from relay.store.sqlite import Sqlite

DIALECTS: dict[str, type[Dialect]] = {d.name: d for d in (Postgres, Mysql, Mariadb, Sqlite)}


def shown(url: URL) -> str:
    """How a database URL appears in logs and errors: no password, in the userinfo or in the
    query (`?password=`, which libpq takes too)."""
    return redact(url.render_as_string(hide_password=True))


def database_url(raw: str) -> URL:
    """A URL the store can open, with its driver made explicit; ConfigError (one line, password
    hidden) naming the problem otherwise."""
    try:
        url = make_url(raw)
    except ArgumentError:
        # Not echoed: a URL that does not parse may still hold a password.
        raise ConfigError(
            "cannot parse the database URL "
            "(expected e.g. postgresql+psycopg://user@host/db or sqlite:///outbox.db)"
        ) from None
    backend = url.get_backend_name()
    dialect = DIALECTS.get(backend)
    if dialect is None:
        names = ", ".join(list(DIALECTS)[:-1]) + f" or {list(DIALECTS)[-1]}"
        raise ConfigError(f"unsupported database {backend!r} (use {names})")
    if url.drivername == backend and dialect.bare_url_driver is not None:
        url = url.set(drivername=f"{backend}+{dialect.bare_url_driver}")
    elif url.get_driver_name() not in dialect.drivers:
        wanted = " or ".join(f"{backend}+{d}" for d in dialect.drivers)
        raise ConfigError(f"unsupported driver {url.drivername!r} (use {wanted})")
    driver_arguments(url)  # a bad value is a configuration error now, not a crash later
    require_driver(url.get_driver_name())
    return url


# The drivers the extras of outbox-relay install: the module each is imported as, what to say
# when it is not installed, and when it is but cannot load (psycopg needs libpq, the PostgreSQL
# client library, unless its binary build is installed, which bundles one).
DRIVER_INSTALLS: dict[str, tuple[str, str, str]] = {
    "pymysql": (
        "pymysql",
        "PyMySQL is not installed: pip install 'outbox-relay[mysql]'",
        "PyMySQL cannot be imported: pip install 'outbox-relay[mysql]'",
    ),
    "psycopg": (
        "psycopg",
        "psycopg is not installed: pip install 'outbox-relay[binary]', or "
        "'outbox-relay[postgresql]' to use the system's libpq",
        "psycopg cannot load libpq, the PostgreSQL client library: install it (libpq5 on "
        "Debian and Ubuntu), or pip install 'outbox-relay[binary]'",
    ),
}


def require_driver(driver: str) -> None:
    """ConfigError, saying what to install, when `driver` cannot be imported."""
    if driver not in DRIVER_INSTALLS:
        return
    module, absent, broken = DRIVER_INSTALLS[driver]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ConfigError(absent if exc.name == module else broken) from None
    except ImportError:
        raise ConfigError(broken) from None


def driver_arguments(url: URL) -> tuple[URL, dict[str, Any]]:
    """`url` without the query parameters its dialect reads itself, and those as the driver's
    connect arguments (Dialect.url_arguments). ConfigError names a bad value."""
    dialect = DIALECTS.get(url.get_backend_name())
    return (url, {}) if dialect is None else dialect.url_arguments(url)


@functools.cache
def dialect_for(backend: str, *, hold: bool = True, scope: str = "exchange") -> Dialect:
    """The dialect of a backend (an engine's `dialect.name`), made once per configuration."""
    return DIALECTS[backend](hold=hold, scope=scope)
