"""The relay's database URL (SQLAlchemy's form) as the libpq connection string the replication
stream opens with: the stream talks to libpq directly, so nothing of SQLAlchemy's or psycopg's
own may reach it.

It is built as SQLAlchemy's psycopg dialect builds its connection arguments, so the same URL
reaches the same server: `?host=h1:5432&host=h2:5433` becomes libpq's `host=h1,h2 port=5432,5433`.
Query parameters libpq does not know (`prepare_threshold` is psycopg's) are left out.
"""

from __future__ import annotations

import functools

from psycopg import pq
from psycopg.conninfo import make_conninfo
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

# Run-time parameters given through `options` (a search_path, a statement_timeout) are meant for
# the relay's SQL sessions, not for the walsender that streams the slot: left out.
_NOT_FOR_REPLICATION = frozenset({"options"})


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    return frozenset(d.keyword.decode() for d in pq.Conninfo.get_defaults())


def conninfo_of(url: str, *, replication: bool) -> str:
    """The libpq connection string for a PostgreSQL URL (`postgresql://`,
    `postgresql+psycopg://`, `postgresql+psycopg2://`), with `replication=database` when
    `replication`; ValueError in one line for any other URL."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # Not echoed: a URL that does not parse may still hold a password.
        raise ValueError(
            "cannot parse the database URL (expected e.g. postgresql+psycopg://user@host/db)"
        ) from None
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(
            f"logical capture needs PostgreSQL, not {parsed.get_backend_name()!r} "
            "(expected e.g. postgresql+psycopg://user@host/db)"
        )
    _, params = PGDialect_psycopg().create_connect_args(parsed)  # type: ignore[no-untyped-call]
    known = _libpq_keywords()
    kept = {k: v for k, v in params.items() if k in known and k != "replication"}
    if replication:
        kept = {k: v for k, v in kept.items() if k not in _NOT_FOR_REPLICATION}
        kept["replication"] = "database"
    return make_conninfo("", **kept)
