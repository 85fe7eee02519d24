"""The relay's database adapter: one SqlStore running a Dialect (postgres.py, mysql.py,
sqlite.py), the operator's queries (admin.py), retention (retention.py), and the one place driver
errors become the relay's (boundary.translated)."""

from relay.store.boundary import translated
from relay.store.databases import database_url, dialect_for
from relay.store.engines import command_engine, make_engine
from relay.store.sql_store import SqlStore, database_clock, open_store

__all__ = [
    "SqlStore",
    "command_engine",
    "database_clock",
    "database_url",
    "dialect_for",
    "make_engine",
    "open_store",
    "translated",
]
