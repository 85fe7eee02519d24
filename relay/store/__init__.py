"""Persistence of the relay: claims, leases and state changes, for PostgreSQL and SQLite."""

from relay.ports import Claimed, StateCounts, Store
from relay.store.sql_store import SqlStore, open_store

__all__ = ["Claimed", "SqlStore", "StateCounts", "Store", "open_store"]
