"""The databases the store runs on: a URL's backend picks its dialect."""

from __future__ import annotations

import functools

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from relay.errors import ConfigError
from relay.store.dialect import Dialect
from relay.store.postgres import Postgres
from relay.store.sqlite import Sqlite

DIALECTS: dict[str, type[Dialect]] = {d.name: d for d in (Postgres, Sqlite)}


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
        names = " or ".join(DIALECTS)
        raise ConfigError(f"unsupported database {backend!r} (use {names})")
    if url.drivername == backend and dialect.bare_url_driver is not None:
        return url.set(drivername=f"{backend}+{dialect.bare_url_driver}")
    if url.get_driver_name() in dialect.drivers:
        return url
    wanted = " or ".join(f"{backend}+{d}" for d in dialect.drivers)
    raise ConfigError(f"unsupported driver {url.drivername!r} (use {wanted})")


@functools.cache
def dialect_for(backend: str, *, hold: bool = True, scope: str = "exchange") -> Dialect:
    """The dialect of a backend (an engine's `dialect.name`), made once per configuration."""
    return DIALECTS[backend](hold=hold, scope=scope)
