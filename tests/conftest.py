"""Fixtures shared by the integration and end-to-end tiers: real PostgreSQL, MariaDB, SQLite and
RabbitMQ. Every test gets things of its own and removes them afterwards; nothing here touches what
a test did not create. The fixtures live in tests/support/, one module per concern:

- tests/support/db.py: `pg_url`, `mysql_url`, `sqlite_url`, `db_url` (each of the three),
  `app_engine`, `pg_engine`, `store` (the outbox schema cloned from `templates`, a schema migrated
  once per session: tests/support/templates.py);
- tests/support/broker.py: `amqp_url`, `broker` (a destination of the test's own, and a consumer);
- tests/support/relays.py: `relay_factory` (in-process relays, in a thread or driven by hand).

Helpers are imported from the module that holds them (tests/support/waiting.py's `wait_until`,
tests/support/cli.py for the CLI as a subprocess, tests/support/proxy.py for a TCP proxy that
fails on demand). The services are expected on this machine (see scripts/ensure-services.sh).
"""

pytest_plugins = ["tests.support.db", "tests.support.broker", "tests.support.relays"]
